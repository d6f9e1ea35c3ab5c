"""A metric's name is written once: in `caprecon.metrics.catalogue`, which the class reads."""

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import caprecon.metrics
from caprecon.cli import main
from caprecon.metrics import build_metric
from caprecon.metrics.base import Metric
from caprecon.metrics.catalogue import METRICS, Builtin, by_name

METRICS_DIR = Path(caprecon.metrics.__file__).parent


def test_each_single_name_class_carries_its_entrys_name_and_no_other_entry_names_it():
    for name, entry in METRICS.items():
        cls = entry.load()
        assert isinstance(cls, type) and issubclass(cls, Metric), entry.target
        sharing = [n for n, e in METRICS.items() if e.target == entry.target]
        # one class, one name: the class's own; a shared class is named per instance (below)
        assert cls.name == (name if sharing == [name] else ""), (name, cls.name)


def test_no_metric_module_writes_a_registered_name_as_a_metrics_name():
    # `name = "recon"` in a class body or `self.name = "halluc-f"` would spell the name a second time
    spelt = []
    for path in sorted(METRICS_DIR.glob("*.py")):
        if path.name == "catalogue.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) else []
            value = getattr(node, "value", None)
            for target in targets:
                named = (isinstance(target, ast.Name) and target.id == "name") or \
                        (isinstance(target, ast.Attribute) and target.attr == "name")
                if named and isinstance(value, ast.Constant) and value.value in METRICS:
                    spelt.append(f"{path.name}:{node.lineno} {value.value}")
    assert spelt == []


def test_a_builtin_class_that_sets_a_name_of_its_own_is_refused_as_it_is_defined():
    with pytest.raises(TypeError, match=r"sets name = 'recon2', but caprecon.metrics.catalogue names it recon"):
        type("ReconScore", (Metric,), {"name": "recon2", "__module__": "caprecon.metrics.recon",
                                      "__qualname__": "ReconScore"})
    # the same class without a name of its own takes the catalogue's
    assert type("ReconScore", (Metric,), {"__module__": "caprecon.metrics.recon",
                                         "__qualname__": "ReconScore"}).name == "recon"
    # a plug-in keeps its own
    assert type("Wordiness", (Metric,), {"name": "wordiness", "__module__": "mypkg.metrics"}).name == "wordiness"


def test_the_catalogue_refuses_a_name_given_twice_or_not_a_plain_word():
    first = Builtin("recon", "caprecon.metrics.recon:ReconScore", "one")
    with pytest.raises(ValueError, match=r"'recon' is given twice: caprecon.metrics.recon:ReconScore and x:Y"):
        by_name([first, Builtin("recon", "x:Y", "two")])
    for bad in ("Recon", "my:metric", "fused:x", "two words", "", "-recon"):
        with pytest.raises(ValueError, match="use lowercase letters, digits and '-'"):
            by_name([Builtin(bad, "x:Y", "bad")])
    assert list(by_name([first, Builtin("clip-s2", "x:Y", "ok")])) == ["recon", "clip-s2"]


def test_every_name_of_the_catalogue_passes_its_guard():
    # a dict literal keyed by names would keep the later of two equal keys without a word: every name
    # is written as a Builtin's first argument or a reference pair's first item, all through `by_name`
    tree = ast.parse((METRICS_DIR / "catalogue.py").read_text(encoding="utf-8"))
    keyed = [key.value for node in ast.walk(tree) if isinstance(node, ast.Dict)
             for key in node.keys if isinstance(key, ast.Constant) and key.value in METRICS]
    assert keyed == []
    written = [node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call)
               and getattr(node.func, "id", None) == "Builtin" and isinstance(node.args[0], ast.Constant)]
    written += [node.elts[0].value for node in ast.walk(tree) if isinstance(node, ast.Tuple) and len(node.elts) == 2
                and isinstance(node.elts[0], ast.Constant) and node.elts[0].value in METRICS]
    assert len(written) == len(set(written)) == 17  # and bleu-1..4 from one f-string
    assert set(written) | {f"bleu-{n}" for n in range(1, 5)} == set(METRICS)


def _halluc_roles_and_config():
    from halluc_fakes import ClaimLLM, PixelJudge
    from oracle import OracleGenerator

    from caprecon.reconstruct.reconstructor import ReconstructionSpec

    roles = SimpleNamespace(judge=PixelJudge(), llm=ClaimLLM(), generator=OracleGenerator(), judges_for={},
                            qa_bank=None)
    config = SimpleNamespace(qa_bank=None, generator="oracle", spec=ReconstructionSpec(), beta=2.0,
                             vqa_normalise=False, iou_threshold=0.5)
    return roles, config


@pytest.mark.parametrize("name, report, headline", [("halluc", "precision", "halluc"),
                                                    ("halluc-coverage", "coverage", "halluc_coverage"),
                                                    ("halluc-f", "f", "halluc_f")])
def test_a_shared_class_is_built_and_named_as_each_of_its_names(name, report, headline):
    from caprecon.metrics.halluc import Hallucination

    roles, config = _halluc_roles_and_config()
    built = build_metric(name, roles, config)
    assert (type(built), built.name, built.report, built.headline, built.beta) == \
        (Hallucination, name, report, headline, 2.0)
    # built from Python, the report alone names it as the catalogue does
    direct = Hallucination(roles.judge, roles.llm, generator=roles.generator, report=report)
    assert direct.name == name


@pytest.mark.parametrize("name", ["bleu-4", "rouge", "cider"])
def test_a_reference_metric_is_built_under_its_name(name):
    pytest.importorskip("pycocoevalcap")
    from caprecon.metrics.reference import REFERENCE_METRICS

    built = build_metric(name, SimpleNamespace(), SimpleNamespace())
    assert (built.name, [c.name for c in built.columns]) == (name, [name])
    assert REFERENCE_METRICS == ("bleu-1", "bleu-2", "bleu-3", "bleu-4", "meteor", "rouge", "cider", "spice")


def test_models_lists_every_name_with_what_it_measures(capsys):
    assert main(["models", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["metric"]
    assert list(listed) == ["recon", "clip-image", "turing", "vqascore", "captionqa", "fleur", "clipscore", "clip-s",
                            "refclipscore", "halluc", "halluc-coverage", "halluc-f", "claims", "bleu-1", "bleu-2",
                            "bleu-3", "bleu-4", "meteor", "rouge", "cider", "spice"]
    assert listed["recon"] == "ReconScore (1 + cos(F(I), F(Î)))/2, F = --embedder"
    assert listed["bleu-3"].startswith("BLEU-3 against the row's references")


def test_knowing_every_name_imports_no_metric_module_beyond_the_registrys_own():
    import subprocess
    import sys

    # the registry's package loads the interface, the catalogue and ReconScore (which it exports); the
    # modules of the other 20 names (the judge code among them) wait until one is built
    code = ("import sys\nfrom caprecon.metrics import METRICS, is_metric\nassert all(map(is_metric, METRICS))\n"
            "print(len(METRICS), *sorted(m for m in sys.modules if m.startswith('caprecon.metrics')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["21", "caprecon.metrics", "caprecon.metrics.base", "caprecon.metrics.catalogue",
                                   "caprecon.metrics.recon"]
