"""The package's shape holds: no import cycles, no module reaching into another's private names.

The layers themselves (each folder imports only from the folders below it, apps independent
of each other) are import-linter contracts in pyproject.toml, checked by `make test`.
"""

import ast
import re
import tomllib
from pathlib import Path

import grimp

SRC = Path(__file__).resolve().parents[1] / "src" / "caprecon"


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    class Graph:
        modules = {"a", "b", "c", "d"}
        edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}

        def find_modules_directly_imported_by(self, m):
            return self.edges.get(m, set())

    assert _cycles(Graph()) == [["a", "b", "c"]]


def test_the_import_graph_has_no_cycles():
    assert _cycles(grimp.build_graph("caprecon")) == []


def _private_imports() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("caprecon")):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.relative_to(SRC)}:{node.lineno} imports {node.module}.{alias.name}")
    return found


def test_no_module_imports_another_modules_private_names():
    assert _private_imports() == []


def test_relative_imports_are_not_used():
    # absolute imports are what import-linter and a reader both follow without resolving dots
    relative = [f"{p.relative_to(SRC)}:{n.lineno}" for p in sorted(SRC.rglob("*.py"))
                for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))) if isinstance(n, ast.ImportFrom) and n.level]
    assert relative == []


LAYOUT_DOC = SRC.parents[1] / "docs" / "layout.md"
PYPROJECT = SRC.parents[1] / "pyproject.toml"


def _modules(root: Path) -> set[str]:
    """Every module under `root` by its path there; an empty `__init__.py` holds nothing to name."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*.py")
            if p.name != "__init__.py" or p.read_text(encoding="utf-8").strip()}


def _named_modules(doc: str) -> set[str]:
    """The paths the "Every module" section of the layout doc gives a line each (`- `path`: ...`)."""
    section = doc.split("\n## Every module\n", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^- `([^`]+\.py)`: \S", section, re.MULTILINE)}


def _layout_problems(root: Path, doc: str) -> list[str]:
    modules, named = _modules(root), _named_modules(doc)
    return ([f"{m}: not named in docs/layout.md" for m in sorted(modules - named)]
            + [f"{m}: named in docs/layout.md but not a module" for m in sorted(named - modules)])


def test_the_layout_check_sees_an_unnamed_module_and_a_stale_line(tmp_path):
    (tmp_path / "stats").mkdir()
    (tmp_path / "stats" / "__init__.py").write_text("")
    (tmp_path / "stats" / "elo.py").write_text("x = 1\n")
    (tmp_path / "stats" / "fit.py").write_text("x = 1\n")
    (tmp_path / "api.py").write_text("x = 1\n")
    doc = ("# Layout\n\n## Every module\n\n- `api.py`: the public face\n- `stats/fit.py`: fitted combinations\n"
           "- `stats/gone.py`: moved away\n\n## Next\n\n- `stats/elo.py`: outside the section, so not counted\n")
    assert _layout_problems(tmp_path, doc) == ["stats/elo.py: not named in docs/layout.md",
                                               "stats/gone.py: named in docs/layout.md but not a module"]


def test_docs_layout_names_every_module_with_a_line():
    assert _layout_problems(SRC, LAYOUT_DOC.read_text(encoding="utf-8")) == []


def test_every_app_is_in_the_independence_contract():
    # an app left out of the contract may import another unseen (as selection once imported refine)
    contracts = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    independent = next(c for c in contracts if c["type"] == "independence")["modules"]
    apps = {f"caprecon.apps.{p.stem if p.is_file() else p.name}" for p in (SRC / "apps").iterdir()
            if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    assert apps == set(independent)
