from .mtsa_core import mtsa_core

__all__ = ["mtsa_core"]
