"""`caprecon ARGV` run in-process for the bad-input tests: the exit code (argparse's own refusals
included, which leave by SystemExit) and what it printed."""

from __future__ import annotations

from caprecon.cli import main


def run_cli(argv, capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `caprecon` on `argv` (any item turned to str)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as stop:  # argparse refuses the option itself
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err
