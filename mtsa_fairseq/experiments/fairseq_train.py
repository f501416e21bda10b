"""``fairseq-train``'s command line, for both experiment stacks: config files read as YAML mappings, ``{key: value}``
options turned into arguments (``key: value`` becomes ``--key value``, ``true`` a bare flag, ``false``/``null`` nothing,
and a list ``--key v1 v2 ...``), and the arguments checked with fairseq's own training parser, the plugin loaded."""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mtsa_fairseq.contracts import load_yaml
from mtsa_fairseq.experiments.errors import ConfigError

USER_DIR = str(Path(__file__).resolve().parents[1])  # the plugin: mtsa_fairseq/, what --user-dir loads


def read_config_file(path: str | Path, error: type[Exception] = ConfigError) -> dict[str, Any]:
    """A YAML config file as a mapping; a missing file, a YAML error (with file and line), a repeated key, text
    that is not UTF-8 or a document that is not a mapping raise ``error``."""
    path = Path(path)
    if not path.is_file():
        raise error(f"config file {path} does not exist")
    try:
        raw = load_yaml(path)
    except ValueError as err:
        raise error(str(err)) from None
    if not isinstance(raw, dict):
        raise error(f"{path}: a config must be a YAML mapping")
    return raw


def _format(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def options_to_args(options: dict[str, Any]) -> list[str]:
    """``{key: value}`` -> ``fairseq-train`` arguments (see the module docstring)."""
    args: list[str] = []
    for key, value in options.items():
        flag = f"--{key}"
        if value is True:
            args.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            args += [flag, *(_format(v) for v in value)]
        else:
            args += [flag, _format(value)]
    return args


def option_origins(where: str | Path, options: Iterable[str], extra: Iterable[str] = ()) -> dict[str, str]:
    """``--flag -> where it came from`` for :func:`parse_fairseq_train`'s messages: the config options of
    ``where`` and the ``--extra-args`` tokens."""
    origins = {f"--{key}": f"{where}: fairseq option '{key}'" for key in options}
    origins.update({t.split("=")[0]: f"--extra-args {t.split('=')[0]}" for t in extra if t.startswith("--")})
    return origins


def parse_fairseq_train(data: str, args: list[str], origins: dict[str, str] | None = None,
                        values: dict[str, Any] | None = None) -> argparse.Namespace:
    """Parse ``fairseq-train DATA --user-dir <plugin> ARGS`` with fairseq's real training parser (arch and
    task options included) and return the namespace. An unknown option or a bad value raises
    :class:`ConfigError` naming it; ``origins`` maps ``--flag`` to where it came from, for the message.
    ``values``, the config's ``{key: value}`` options that ARGS came from, are checked as fairseq reads them:
    a flag takes true, false or null, an option of one value takes no list, and no option takes a mapping."""
    from fairseq import options

    import mtsa_fairseq.plugin  # noqa: F401  (the package is imported already, so --user-dir registers nothing)

    origins = origins or {}

    def where(flag: str) -> str:
        return origins.get(flag, f"option {flag}")

    mapping = next((key for key, value in (values or {}).items() if isinstance(value, dict)), None)
    if mapping is not None:
        raise ConfigError(f"{where(f'--{mapping}')}: takes a value, not the mapping {values[mapping]!r}")
    parser = options.get_training_parser()

    def fail(message: str) -> None:
        flag = re.search(r"argument (--[\w-]+)", message)
        raise ConfigError(f"{where(flag.group(1))}: {message}" if flag else f"fairseq-train: {message}")

    parser.error = fail  # argparse reports bad values and missing arguments through error()
    utils_log = logging.getLogger("fairseq.utils")  # "--user-dir ... has already been imported"
    level = utils_log.level
    utils_log.setLevel(logging.WARNING)
    try:
        namespace, unknown = options.parse_args_and_arch(
            parser, [data, "--user-dir", USER_DIR, *args], parse_known=True
        )
    finally:
        utils_log.setLevel(level)
    for key, value in (values or {}).items():
        action = parser._option_string_actions.get(f"--{key}")
        if action is not None and action.nargs == 0 and not isinstance(value, (bool, type(None))):
            raise ConfigError(f"{where(f'--{key}')}: a flag takes true or false, not {value!r}")
        if action is not None and action.nargs in (None, "?") and isinstance(value, list):
            raise ConfigError(f"{where(f'--{key}')}: takes one value, not the list {value!r}")
    flags = [token.split("=")[0] for token in unknown if token.startswith("-")]
    if flags:
        raise ConfigError(f"{where(flags[0])}: '{flags[0]}' is not a fairseq-train option "
                          f"(arch {getattr(namespace, 'arch', '?')}, with --user-dir {USER_DIR})")
    if unknown:
        raise ConfigError(f"fairseq-train: unexpected argument {unknown[0]!r}")
    if hasattr(namespace, "encoder_self_attention_type"):  # an MTSA architecture: options its model cannot build
        from fairseq.models.transformer import TransformerConfig

        from mtsa_fairseq.models.transformer_mtsa import check_mtsa_options

        try:
            check_mtsa_options(TransformerConfig.from_namespace(namespace), training=True,
                              cpu=bool(namespace.cpu))
        except ValueError as err:
            raise ConfigError(f"fairseq-train: {err}") from None
    return namespace
