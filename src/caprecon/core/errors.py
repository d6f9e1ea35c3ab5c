"""Errors every layer raises: a run that cannot start says why, in one line."""


class ConfigError(ValueError):
    """The run cannot start: a setting is missing or wrong (the CLI prints it and exits 2)."""
