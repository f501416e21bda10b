"""The commands (``mtsa-*`` console entry points; ``scripts/*.py`` run the same ``main`` functions)."""
