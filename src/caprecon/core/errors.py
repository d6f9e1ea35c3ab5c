"""Errors every layer raises: a run that cannot start says why, in one line."""


class ConfigError(ValueError):
    """The run cannot start: a setting is missing or wrong (the CLI prints it and exits 2)."""


class ServerError(RuntimeError):
    """A model server could not be used: unreachable, refusing, or answering in a shape no client
    can read. The run stops; what it finished stays, and the same command resumes once the server
    answers (the CLI says so in one line)."""


class MetricContractError(RuntimeError):
    """A metric broke the metric contract (`caprecon.metrics.base.checked_rows`): its code is wrong,
    not the rows, so a run stops on it (keeping what it finished) and a `Reward` call raises it."""
