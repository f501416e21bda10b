"""The errors of the experiment tooling, shared by the translation and the sentence stacks: each names the problem
and reaches the user as one ``error: ...`` line."""


class LaunchError(ValueError):
    """Bad launcher input; the message names the problem."""


class DataError(ValueError):
    """Bad input or configuration, reported to the user as one line."""


class ConfigError(ValueError):
    """A config (or an option given with it) that cannot be used; the message names the problem."""
