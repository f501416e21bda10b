"""Command-line options declared once: flag, default and help, for ``add_args`` and the architectures."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Option:
    """One model option. ``default`` is what an architecture sets when the user gave nothing (``None``: stays
    unset; a bool: a flag); ``help`` says what it means, and the default is appended to it."""

    flag: str
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    type: type | None = None
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        if isinstance(self.default, bool):
            parser.add_argument(self.flag, action="store_true", help=self.help)
        else:
            shown = "" if self.default is None else f"; default {self.default}"
            parser.add_argument(self.flag, choices=self.choices, type=self.type, metavar=self.metavar,
                                help=self.help + shown)


def option_value(args: Any, option: Option) -> Any:
    """``args``' value of ``option``, or its default where the user gave none."""
    value = getattr(args, option.dest, None)
    return option.default if value is None else value


def apply_defaults(args: argparse.Namespace, options: Iterable[Option], **arch_defaults: Any) -> None:
    """Fill every unset option of ``args``: the architecture's own default first, then the option's."""
    for option in options:
        value = getattr(args, option.dest, None)
        if value is None or (value is False and option.dest in arch_defaults):
            value = arch_defaults.get(option.dest, option.default)
        setattr(args, option.dest, value)
