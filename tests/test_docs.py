"""The documentation site: its CLI reference matches the parsers, and its runnable examples run.

A fenced block right after a `<!-- run -->` line in docs/**/*.md is run, page by page and
block by block in order, in a scratch folder laid out like a reader's who followed the
docs' "try it" step from the repository root: `try/` holds a copy of the bundled demo
(`captions.jsonl`, `images/`), and `../tests` holds the scripted stand-ins. `caprecon`
lines run in this process through the real parser (a renamed option fails); other lines
run in bash. docs/contributing.md describes the convention.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from caprecon.cli.commands import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RUN_MARK = "<!-- run -->"
# the pages organised by what a reader wants to do: each shows at least one example that runs
TASK_PAGES = ("index.md", "score.md", "rank.md", "question-bank.md", "select.md", "t2i.md", "validate.md",
              "scale.md", "cache.md")


def _cli_reference():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action.choices, dict):
            for sub in action.choices.values():
                yield from _parsers(sub)


def unknown_options(argv: list[str]) -> list[str]:
    """The options on a `caprecon` command line that its own sub-command's parser does not define
    in full (argparse takes any unambiguous prefix, so an old, shorter name of a renamed option
    would still parse; and another command's option of the same name is no help either)."""
    root = parser = build_parser()
    for word in argv:
        if word.startswith("-"):
            continue
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        parser = subs[0].choices[word]
    known = {s for p in {id(root): root, id(parser): parser}.values() for a in p._actions for s in a.option_strings}
    return [w for w in argv if w.startswith("-") and w.split("=", 1)[0] not in known and not _number(w)]


def _number(word: str) -> bool:
    try:
        float(word)
        return True
    except ValueError:
        return False


def _options_on(text: str) -> set[str]:
    return set(re.findall(r"`(--?[A-Za-z][\w-]*)`", text))


# --------------------------------------------------------------------------- the CLI reference


def test_cli_reference_lists_exactly_the_parsers_options():
    page = (DOCS / "reference" / "cli.md").read_text()
    parsed = {s for p in _parsers(build_parser()) for a in p._actions for s in a.option_strings}
    shown = _options_on(page)
    assert parsed - shown - {"-h", "--help"} == set(), "options missing from docs/reference/cli.md: run make cli-docs"
    assert shown - parsed == set(), "options on docs/reference/cli.md that no parser has: run make cli-docs"


def test_cli_reference_page_is_what_the_parsers_generate():
    # help texts and usage too: any edit of a parser shows as a stale page
    assert (DOCS / "reference" / "cli.md").read_text() == _cli_reference().render(), \
        "docs/reference/cli.md is stale: run make cli-docs (python scripts/cli_reference.py)"


def test_every_metric_has_its_reference_page():
    from caprecon.metrics import METRICS
    from caprecon.metrics.reference import REFERENCE_METRICS

    nav = (ROOT / "mkdocs.yml").read_text()
    # the COCO evaluation's metrics share one page, which names each of them
    family = (DOCS / "metrics" / "reference.md").read_text()
    assert all(f"`{name}`" in family for name in REFERENCE_METRICS)
    page = {name: "reference" if name in REFERENCE_METRICS else name for name in METRICS}
    missing = [name for name in METRICS if not (DOCS / "metrics" / f"{page[name]}.md").is_file()
               or f"metrics/{page[name]}.md" not in nav]
    assert missing == [], "each metric needs docs/metrics/NAME.md, listed in mkdocs.yml's nav"


def test_api_page_documents_every_public_name():
    import caprecon

    shown = re.findall(r"^::: caprecon\.(\w+)$", (DOCS / "reference" / "api.md").read_text(), flags=re.M)
    assert sorted(shown) == sorted(caprecon.__all__), "docs/reference/api.md needs a `::: caprecon.NAME` per export"


def test_cli_reference_shows_nested_commands_and_aliases():
    page = (DOCS / "reference" / "cli.md").read_text()
    for heading in ("## caprecon score", "### caprecon cttd build", "### caprecon cache prune",
                    "### caprecon store merge"):
        assert f"\n{heading}\n" in page
    assert "Also spelt `text-to-image`." in page  # one section for t2i and its alias


# --------------------------------------------------------------------------- runnable examples


def runnable_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, code) of each fenced block that follows a RUN_MARK line."""
    lines = text.splitlines()
    blocks, fence = [], ""  # fence: the backticks that opened the block we are in
    for i, line in enumerate(lines):
        ticks = re.match(r"^\s*(`{3,})", line)
        if ticks and not fence:
            fence = ticks.group(1)
        elif ticks and line.strip() == ticks.group(1) and len(ticks.group(1)) >= len(fence):
            fence = ""
        if fence or line.strip() != RUN_MARK:  # a marker shown inside an example is not one
            continue
        fence = lines[i + 1] if i + 1 < len(lines) else ""
        if not re.match(r"^```(bash|sh|shell)\b", fence):
            raise AssertionError(f"line {i + 1}: {RUN_MARK} must come right before a ```bash fence")
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        blocks.append((i + 2, "\n".join(lines[i + 2:end])))
    return blocks


def _commands(code: str) -> list[str]:
    """One string per command: continuation lines joined, a heredoc kept with its command."""
    commands, lines = [], code.replace("\\\n", " ").splitlines()
    while lines:
        line = lines.pop(0)
        heredoc = re.search(r"<<-?\s*'?(\w+)'?", line)
        if heredoc:
            body = []
            while lines and lines[0].strip() != heredoc.group(1):
                body.append(lines.pop(0))
            line = "\n".join([line, *body, lines.pop(0) if lines else ""])
        if line.strip() and not line.lstrip().startswith("#"):
            commands.append(line)
    return commands


class Shell:
    """Runs a page's commands in order; the working folder and exports carry over."""

    def __init__(self, cwd: Path, env: dict[str, str]):
        self.cwd, self.env = cwd, env

    def run(self, command: str) -> None:
        words = shlex.split(command, comments=True) if "\n" not in command else []
        assignments = {}
        while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
            name, _, value = words.pop(0).partition("=")
            assignments[name] = value
        if words[:1] == ["cd"]:
            self.cwd = (self.cwd / words[1]).resolve()
            assert self.cwd.is_dir(), f"cd {words[1]}: no such folder"
        elif words[:1] == ["caprecon"] and not set(command) & set("|;&<>`$"):
            self._caprecon(words[1:], assignments, command)
        else:
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=self.cwd, env=self.env,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"

    def _caprecon(self, argv: list[str], assignments: dict[str, str], command: str) -> None:
        folders = [(self.cwd / f).resolve() for f in assignments.get("PYTHONPATH", "").split(os.pathsep) if f]
        for folder in folders:
            assert folder.is_dir(), f"{command}\nPYTHONPATH names no folder: {folder}"
        unknown = unknown_options(argv)
        assert not unknown, f"{command}\nexit 2: no such option {unknown}"
        out, err = io.StringIO(), io.StringIO()
        before_env, before_cwd, before_path = dict(os.environ), os.getcwd(), list(sys.path)
        os.environ.update({**self.env, **assignments})
        os.chdir(self.cwd)
        # in this process, PYTHONPATH reaches the imports as it would a new interpreter's: its folders
        # (not the working folder) come first, and what was imported from them is forgotten afterwards
        sys.path[:0] = [str(f) for f in folders if f != ROOT / "tests"]
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main(argv)
                except SystemExit as stop:  # argparse: an unknown option, a bad value
                    code = stop.code
                except Exception as crash:  # name the page and block, not only the traceback
                    code = f"{type(crash).__name__}: {crash}"
        finally:
            os.chdir(before_cwd)
            os.environ.clear()
            os.environ.update(before_env)
            sys.path[:] = before_path
            for name, module in list(sys.modules.items()):
                where = getattr(module, "__file__", None) or ""
                if any(where.startswith(str(f) + os.sep) for f in folders if f != ROOT / "tests"):
                    del sys.modules[name]
        assert code == 0, f"{command}\nexit {code}\n{out.getvalue()[-2000:]}{err.getvalue()[-2000:]}"


@pytest.fixture(scope="session")
def docs_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("docs-cache")


def _scratch(tmp_path: Path, cache: Path) -> Shell:
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    shutil.copytree(ROOT / "src" / "caprecon" / "data" / "demo", tmp_path / "try")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CAPRECON_CACHE": str(cache),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return Shell(tmp_path / "try", env)


PAGES = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if runnable_blocks(p.read_text()))


@pytest.mark.parametrize("page", PAGES)
def test_runnable_examples_run(page, tmp_path, docs_cache):
    shell = _scratch(tmp_path, docs_cache)
    for line, code in runnable_blocks((DOCS / page).read_text()):
        for command in _commands(code):
            try:
                shell.run(command)
            except AssertionError as failure:
                raise AssertionError(f"docs/{page}, block at line {line}:\n{failure}") from None


def _shown_commands(text: str) -> list[list[str]]:
    """The words of every `caprecon` command in the page's fenced blocks, marked or not."""
    commands = []
    for block in re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", text, flags=re.S | re.M):
        for command in _commands(block):
            words = shlex.split(command.split("\n")[0], comments=True)
            while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
                words.pop(0)
            if words[:1] == ["caprecon"]:
                commands.append(words[1:])
    return commands


def test_shown_commands_use_their_own_commands_options():
    # unmarked examples (real weights, a GPU) cannot run here, but a renamed option still fails them:
    # each command's options against its own sub-command's parser (test_reliability checks that any
    # option named in prose exists somewhere)
    wrong = {f"{page.relative_to(DOCS)}: caprecon {' '.join(argv[:2])} ... {option}"
             for page in DOCS.rglob("*.md") for argv in _shown_commands(page.read_text())
             for option in unknown_options(argv)}
    assert wrong == set()


def test_every_task_page_has_a_runnable_example():
    assert [p for p in TASK_PAGES if not runnable_blocks((DOCS / p).read_text())] == []


def test_a_renamed_option_fails_the_example(tmp_path, docs_cache):
    shell = _scratch(tmp_path, docs_cache)
    with pytest.raises(AssertionError, match="exit 2"):
        shell.run("caprecon score -i captions.jsonl --metrics recon --preset offline")
    with pytest.raises(AssertionError, match="no such option"):  # a prefix argparse would accept
        shell.run("caprecon score -i captions.jsonl --metric recon --pre offline")
    with pytest.raises(AssertionError, match="exit 1"):
        shell.run("cat no-such-file")


def test_marker_must_precede_a_shell_fence():
    assert runnable_blocks("text\n<!-- run -->\n```bash\ncaprecon models\n```\n") == [(3, "caprecon models")]
    shown = "````markdown\n<!-- run -->\n```bash\ncaprecon models\n```\n````\n"
    assert runnable_blocks(shown) == []
    with pytest.raises(AssertionError, match="must come right before"):
        runnable_blocks("<!-- run -->\n\n```bash\ncaprecon models\n```\n")


def test_commands_join_continuations_and_keep_heredocs():
    code = "# a comment\ncaprecon score -i a.jsonl \\\n    --out runs/a\ncat > b.txt <<'EOF'\nx\nEOF\nls"
    assert _commands(code) == ["caprecon score -i a.jsonl      --out runs/a", "cat > b.txt <<'EOF'\nx\nEOF", "ls"]


def test_every_command_ends_its_help_with_an_example_it_accepts():
    import shlex as _shlex

    from caprecon.cli.commands import EXAMPLES

    commands = build_parser()._subparsers._group_actions[0].choices
    missing = sorted(name for name, command in commands.items()
                     if name != "text-to-image" and f"example: caprecon {name}" not in command.format_help())
    assert missing == []
    wrong = {name: unknown_options(_shlex.split(example)[1:]) for name, example in EXAMPLES.items()}
    assert {name: options for name, options in wrong.items() if options} == {}


def test_meta_help_groups_the_scoring_models_apart():
    commands = build_parser()._subparsers._group_actions[0].choices
    titles = [group.title for group in commands["meta"]._action_groups]
    assert any(title.startswith("models (only for metrics scored here") for title in titles)
    meta_options = next(g for g in commands["meta"]._action_groups if g.title == "options")
    assert "--generator" not in {s for a in meta_options._group_actions for s in a.option_strings}
    seed_policy = next(a for a in commands["caption"]._actions if a.dest == "seed_policy")
    assert seed_policy.help.startswith("per-image (the default here)")


def test_a_user_metric_in_the_working_folder_needs_pythonpath(tmp_path, docs_cache):
    """Issue 51 item 15: docs/layout.md's user metric runs as written (with PYTHONPATH=., in the page's
    runnable block); without PYTHONPATH the command refuses, saying that it is what is missing."""
    shell = _scratch(tmp_path, docs_cache)
    block = next(code for _, code in runnable_blocks((DOCS / "layout.md").read_text()) if "Wordiness" in code)
    commands = _commands(block)
    for command in commands[:-1]:  # the files of mypkg/
        shell.run(command)
    assert commands[-1].startswith("PYTHONPATH=. caprecon score")
    without = commands[-1].replace("PYTHONPATH=. ", "").replace("runs/wordy", "runs/unwordy")
    with pytest.raises(AssertionError, match=r"(?s)exit 2.*No module named 'mypkg'; a module:Class is imported "
                                             r"from an installed package or a folder on PYTHONPATH.*PYTHONPATH=FOLDER"):
        shell.run(without)
    shell.run(commands[-1])
    import json

    rows = [json.loads(line) for line in (shell.cwd / "runs" / "wordy" / "scores.jsonl").read_text().splitlines()]
    given = [json.loads(line) for line in (shell.cwd / "captions.jsonl").read_text().splitlines()]
    assert [r["wordiness"] for r in rows] == [float(len(g["caption"].split())) for g in given]
    assert "mypkg" not in sys.modules  # forgotten after the command, as a new interpreter would never have seen it
