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

import pytest

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


# -- the scheduler: a tiny fake caprecon and its tests, driven in a fresh interpreter (forking from
# this pytest process, whose other tests may have left threads and imported caprecon, proves nothing)

FAKE_CALC = "def double(x):\n    return 2 * x\n"
FAKE_TESTS = '''import os, subprocess, sys, time
from caprecon import calc

def test_double():
    assert calc.double(3) == 6

def test_hangs_after_starting_a_sleeper_under_the_hanging_mutant():
    if os.environ.get("FAKE_HANG") and calc.double(0) is None:  # the hanging mutant
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open(os.environ["FAKE_HANG"], "w").write(str(sleeper.pid))
        while True:
            time.sleep(0.1)
'''
DRIVER = '''import importlib.util, json, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("mutants_script", sys.argv[1])
mutants = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mutants
spec.loader.exec_module(mutants)
root, fork = Path(sys.argv[2]), sys.argv[3] == "fork"
mutants.ROOT = root  # the fake project: runs start there
if fork:
    assert mutants._preload(("pytest",)) is None
M = mutants.Mutant
named = ("tests/test_calc.py",)
work = [M("killed", "calc.py", "2 * x", "3 * x", named), M("equivalent", "calc.py", "2 * x", "x * 2", named),
        M("hangs", "calc.py", "return 2 * x", "return None if x == 0 else 2 * x", named)]
reached = {"killed": ["tests/test_calc.py::test_double"], "equivalent": ["tests/test_calc.py::test_double"]}
rows = {}
mutants.drive([mutants._try_mutant(m, reached, lambda m, *row: rows.__setitem__(m.name, row)) for m in work],
              [root / "copy0" / "src", root / "copy1" / "src"], root / "scratch", float(sys.argv[4]), fork)
print(json.dumps(rows))
'''


@pytest.mark.parametrize("way", ["fork", "subprocess"])
def test_the_scheduler_reports_killed_surviving_and_hung_mutants_and_restores_each_copy(tmp_path, way):
    if way == "fork" and not hasattr(os, "fork"):
        pytest.skip("no os.fork here")
    for copy in ("copy0", "copy1"):
        (tmp_path / copy / "src" / "caprecon").mkdir(parents=True)
        (tmp_path / copy / "src" / "caprecon" / "__init__.py").write_text("")
        (tmp_path / copy / "src" / "caprecon" / "calc.py").write_text(FAKE_CALC)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the fake project's root: node ids start at tests/
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_calc.py").write_text(FAKE_TESTS)
    (tmp_path / "scratch").mkdir()
    (tmp_path / "driver.py").write_text(DRIVER)
    sleeper = tmp_path / "sleeper.pid"
    # the real caprecon must not be found: the runs import the fake one from their copy or fail
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"FAKE_HANG": str(sleeper)}
    timeout = 6.0
    done = subprocess.run([sys.executable, "driver.py", str(SCRIPTS / "mutants.py"), str(tmp_path), way,
                           str(timeout)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(done.stdout.splitlines()[-1])
    # the killed one dies on the test the probe named, the equivalent one passes that and its named tests
    assert rows["killed"][:2] == ["killed", "tests/test_calc.py::test_double"]
    assert rows["killed"][3] == "1 test(s) reaching it"
    assert rows["equivalent"][:2] == ["SURVIVED", "no test failed"]
    assert rows["equivalent"][3] == "1 test(s) reaching it, then its named tests"
    # the hung run is killed at the timeout (counted as killed, "timed out"), and what it started with it
    assert rows["hangs"][:2] == ["killed", "timed out"] and timeout <= rows["hangs"][2] < timeout + 5
    pid = int(sleeper.read_text())
    stat = Path(f"/proc/{pid}/stat")
    if Path("/proc").is_dir():
        assert not stat.exists() or stat.read_text().split(") ")[1][0] == "Z"  # gone, or a zombie for init to reap
    for copy in ("copy0", "copy1"):  # each mutant was put back
        assert (tmp_path / copy / "src" / "caprecon" / "calc.py").read_text() == FAKE_CALC
