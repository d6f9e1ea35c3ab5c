"""The `caprecon` command: one module per command family; the parser and the shared options in `commands`."""


def main(argv: list[str] | None = None) -> int:
    from caprecon.cli.commands import main as run

    return run(argv)
