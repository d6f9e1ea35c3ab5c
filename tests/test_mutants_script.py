"""scripts/mutants.py's narrowing: the function a snippet lies in, the tests the probe saw call it,
and the named tests they are narrowed to. Expected values are written out by hand from the
small sources below."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parents[1] / "scripts"
spec = importlib.util.spec_from_file_location("mutants_script", SCRIPTS / "mutants.py")
mutants = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mutants  # its dataclass looks its module up there
spec.loader.exec_module(mutants)

SOURCE = '''WEIGHT = 2.5


def plain(x, prefix=""):
    return x * WEIGHT


@staticmethod
@other
def decorated(x):
    def inner(y):
        return y + 1
    return inner(x) - 1


class Holder:
    name = "holder"

    def method(self):
        return [v * 2 for v in range(3)]
'''


def test_the_function_of_a_snippet_is_the_innermost_whose_body_holds_it():
    assert mutants.function_of(SOURCE, "return x * WEIGHT") == (4,)
    assert mutants.function_of(SOURCE, "return y + 1") == (11,)  # the inner function, not decorated
    assert mutants.function_of(SOURCE, "return inner(x) - 1") == (8, 9, 10)  # a decorated function's lines
    assert mutants.function_of(SOURCE, "v * 2 for v") == (19,)  # a comprehension runs inside its method
    # run on import: module and class level, and a signature's defaults
    assert mutants.function_of(SOURCE, "WEIGHT = 2.5") is None
    assert mutants.function_of(SOURCE, 'name = "holder"') is None
    assert mutants.function_of(SOURCE, 'prefix=""') is None


def test_reached_tests_are_narrowed_to_the_named_files_and_node_ids():
    reached = ["tests/test_a.py::test_one", "tests/test_b.py::test_two[x-1]", "tests/test_ab.py::test_three",
               "tests/test_c.py::test_four"]
    assert mutants._narrowed(("tests/test_a.py", "tests/test_b.py::test_two"), reached) == reached[:2]
    assert mutants._narrowed(("tests/test_c.py::test_four",), reached) == reached[3:]
    assert mutants._narrowed(("tests/test_d.py",), reached) == []
    assert mutants._split(["a", "b", "c"], 2) == [["a", "c"], ["b"]]
    assert mutants._split(["a"], 2) == [["a"]]


def test_the_probe_records_the_tests_that_call_a_function(tmp_path):
    (tmp_path / "lib.py").write_text(SOURCE.replace("@staticmethod\n@other\n", ""))
    (tmp_path / "test_lib.py").write_text(
        "import threading\nimport lib\n\n"
        "def test_calls_plain():\n    assert lib.plain(2) == 5.0\n\n"
        "def test_calls_nothing():\n    assert lib.WEIGHT == 2.5\n\n"
        "def test_calls_method_in_a_thread():\n"
        "    t = threading.Thread(target=lib.Holder().method)\n    t.start()\n    t.join()\n")
    targets = {"plain": [str(tmp_path / "lib.py"), [4]], "method": [str(tmp_path / "lib.py"), [17]]}
    plan, out = tmp_path / "targets.json", tmp_path / "out.json"
    plan.write_text(json.dumps(targets))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SCRIPTS / "probe"), str(tmp_path)]),
           "MUTANTS_PROBE_TARGETS": str(plan), "MUTANTS_PROBE_OUT": str(out)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "mutants_probe", "-p", "no:cacheprovider",
                           "test_lib.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    probed = json.loads(out.read_text())
    assert probed["reached"] == {"plain": ["test_lib.py::test_calls_plain"],
                                 "method": ["test_lib.py::test_calls_method_in_a_thread"]}
    assert set(probed["seconds"]) == {"test_lib.py::test_calls_plain", "test_lib.py::test_calls_nothing",
                                      "test_lib.py::test_calls_method_in_a_thread"}
