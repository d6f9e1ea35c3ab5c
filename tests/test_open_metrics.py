"""Metrics describe themselves and the registry is open: a metric written outside caprecon
runs through `score`, the report, `meta` and `compare`; the reference metrics run through `score`."""

import json
import re
import sys
import textwrap

import pytest

from caprecon.cli import main
from caprecon.core.errors import ConfigError
from caprecon.metrics.reference import java_available

# a user metric, as docs/layout.md shows it: a lower-is-better column, caption only
PLUGIN = '''
from caprecon.metrics.base import Column, Metric


class Wordiness(Metric):
    """Words in the caption: fewer is better."""

    name = "wordiness"
    needs_source_image = False
    columns = (Column("wordiness", higher_is_better=False, low=0.0),)

    def score(self, items, ctx):
        return [{"wordiness": float(len(item.caption.split()))} for item in items]


class Brevity(Metric):
    """Wordiness negated, declared higher-is-better: meta must agree with people alike on both."""

    name = "brevity"
    needs_source_image = False
    columns = (Column("brevity", higher_is_better=True),)

    def score(self, items, ctx):
        return [{"brevity": -float(len(item.caption.split()))} for item in items]
'''
CAPTIONS = {"short": ["a dog", "a cat", "two birds"],
            "long": ["a brown dog runs over the green grass", "a small cat sleeps on a red sofa today",
                     "two birds sit on a wire above the street"]}
REFS = [["a dog running across a field", "a brown dog on grass"], ["a cat asleep on a couch", "a cat on a red sofa"],
        ["two birds on a wire", "birds perched on a power line"]]


@pytest.fixture
def plugin_package(tmp_path, monkeypatch):
    """`userpkg.metrics:Wordiness`, installed with a `caprecon.metrics` entry point named `wordiness`."""
    site = tmp_path / "site"
    (site / "userpkg").mkdir(parents=True)
    (site / "userpkg" / "__init__.py").write_text("")
    (site / "userpkg" / "metrics.py").write_text(PLUGIN)
    dist = site / "userpkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: userpkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[caprecon.metrics]\nwordiness = userpkg.metrics:Wordiness\n")
    monkeypatch.syspath_prepend(str(site))
    yield site
    for name in [m for m in sys.modules if m == "userpkg" or m.startswith("userpkg.")]:
        del sys.modules[name]


def _input(tmp_path):
    path = tmp_path / "captions.jsonl"
    with path.open("w") as fh:
        for captioner, captions in CAPTIONS.items():
            for i, caption in enumerate(captions):
                fh.write(json.dumps({"id": f"{captioner}{i}", "image": None, "image_id": str(i), "caption": caption,
                                     "captioner": captioner, "refs": REFS[i]}) + "\n")
    return path


def _bold_row(html):
    """The summary table's rows whose wordiness cell is marked best (bold)."""
    table = re.search(r'<section id="summary">.*?</table>', html, re.S).group(0)
    return [row for row in re.findall(r"<tr>(.*?)</tr>", table, re.S) if 'class="best"' in row]


@pytest.mark.parametrize("spec", ["userpkg.metrics:Wordiness", "wordiness"])
def test_a_user_metric_runs_through_score_report_and_compare(plugin_package, tmp_path, capsys, spec):
    out = tmp_path / "run"
    assert main(["score", "-i", str(_input(tmp_path)), "-m", spec, "--out", str(out), "--no-cache"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["wordiness"]["mean"] == pytest.approx((8 + 9 + 9 + 2 + 2 + 2) / 6)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["columns"]["wordiness"]["higher_is_better"] is False
    html = (out / "report.html").read_text()
    bold = _bold_row(html)
    assert len(bold) == 1 and "short" in bold[0]  # the fewer words win: its declared direction
    gallery = re.search(r'<script type="application/json" id="gallery-data">(.*?)</script>', html, re.S).group(1)
    assert json.loads(gallery)["lower_is_better"] == ["wordiness"]
    capsys.readouterr()
    assert main(["compare", str(out), "--by", "captioner", "-m", "wordiness", "--resamples", "200"]) == 0
    assert "wordiness" in capsys.readouterr().out


def test_a_user_metric_runs_through_meta(plugin_package, tmp_path, capsys):
    judgments = tmp_path / "human.jsonl"
    with judgments.open("w") as fh:
        for captioner, captions in CAPTIONS.items():
            for i, caption in enumerate(captions):
                fh.write(json.dumps({"image": f"img{i}", "caption": caption,
                                     "score": 1.0 if captioner == "short" else 0.0}) + "\n")
    out = tmp_path / "meta"
    code = main(["meta", "--judgments", str(judgments), "--metric", "userpkg.metrics:Wordiness", "--out", str(out),
                 "--no-cache"])
    assert code == 0, capsys.readouterr()
    assert "userpkg.metrics:Wordiness" in capsys.readouterr().out


def _meta_rows(out):
    import csv

    with (out / "meta.csv").open() as fh:
        return {row["metric"]: row for row in csv.DictReader(fh)}


def _ratings(tmp_path):
    """People prefer fewer words, though not in every case: a rating per caption, three images."""
    from PIL import Image

    path = tmp_path / "human.jsonl"
    ratings = {"short": [5, 4, 2], "long": [1, 2, 3]}
    for i in range(3):  # the metric reads no image, but meta scores only rows whose image opens
        Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(tmp_path / f"img{i}.png")
    with path.open("w") as fh:
        for captioner, captions in CAPTIONS.items():
            for i, caption in enumerate(captions):
                fh.write(json.dumps({"id": f"{captioner}{i}", "image": f"img{i}.png", "caption": caption,
                                     "score": ratings[captioner][i]}) + "\n")
    return path


def test_meta_reads_a_lower_is_better_metric_negated(plugin_package, tmp_path, capsys):
    """A metric declared lower-is-better agrees with people exactly as its negation declared higher-is-better;
    before, meta read it higher-is-better and gave it the opposite sign."""
    out = tmp_path / "meta"
    code = main(["meta", "--judgments", str(_ratings(tmp_path)), "--metric", "userpkg.metrics:Wordiness",
                 "--metric", "userpkg.metrics:Brevity", "--compare", "userpkg.metrics:Wordiness",
                 "userpkg.metrics:Brevity", "--out", str(out), "--no-cache", "--bootstrap", "50"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    rows = _meta_rows(out)
    wordy, brief = rows["userpkg.metrics:Wordiness"], rows["userpkg.metrics:Brevity"]
    assert float(wordy["value"]) > 0.3
    assert float(wordy["value"]) == pytest.approx(float(brief["value"]))
    assert float(wordy["pair_accuracy"]) == pytest.approx(float(brief["pair_accuracy"]))
    assert (wordy["direction"], brief["direction"]) == ("lower", "higher")
    assert "userpkg.metrics:Wordiness: declared lower-is-better" in printed
    assert "= +0.0000" in printed  # --compare: the two agree equally once each is read by its direction
    assert "better" in (out / "meta.md").read_text()


def test_meta_reads_the_direction_of_a_scores_file_from_its_run_manifest(plugin_package, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["score", "-i", str(_input(tmp_path)), "-m", "userpkg.metrics:Wordiness", "--out", str(run),
                 "--no-cache"]) == 0
    # the same run under a column name the registry does not know: only its manifest declares it
    (tmp_path / "plain").mkdir()
    for name in ("run", "plain"):
        (tmp_path / name / "scores.jsonl").write_text((run / "scores.jsonl").read_text().replace('"wordiness"',
                                                                                                  '"words"'))
    (run / "manifest.json").write_text((run / "manifest.json").read_text().replace('"wordiness"', '"words"'))
    found = {}
    for name in ("run", "plain"):
        out = tmp_path / f"meta-{name}"
        assert main(["meta", "--judgments", str(_ratings(tmp_path)), "--metric", "words", "--scores",
                     str(tmp_path / name / "scores.jsonl"), "--out", str(out), "--bootstrap", "0"]) == 0
        row = _meta_rows(out)["words"]
        found[name] = (float(row["value"]), row["direction"])
    printed = capsys.readouterr().out
    assert found["run"][0] > 0.3 and found["run"][1] == "lower"
    assert found["plain"] == (-found["run"][0], "higher (assumed)")  # nothing says otherwise: read as it is
    assert "words: no declared direction" in printed


def test_the_registry_declares_an_installed_metrics_direction(plugin_package):
    from caprecon.metrics import declared_column

    assert declared_column("wordiness").higher_is_better is False
    assert declared_column("cider").higher_is_better is True
    assert declared_column("recon") is None  # declared once built, in its run's manifest


def test_compare_and_seeds_name_the_winner_by_the_declared_direction(plugin_package, tmp_path, capsys):
    """Fewer words win: compare said nothing of who was better (and its Elo ranked the wordiest first)."""
    run = tmp_path / "run"
    assert main(["score", "-i", str(_input(tmp_path)), "-m", "userpkg.metrics:Wordiness", "--out", str(run),
                 "--no-cache"]) == 0
    capsys.readouterr()
    out = tmp_path / "compare.jsonl"
    assert main(["compare", str(run), "--by", "captioner", "-m", "wordiness", "--resamples", "50",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (row["a"], row["b"], row["better"]) == ("long", "short", "short")
    assert "wordiness: lower is better (declared in the run's manifest)" in printed
    assert re.search(r"long\s+short\s.*\sshort\s*$", printed, re.M)
    # seeds needs draws per seed; a caption-only metric has one, so give each row three, spread around it
    rows = [json.loads(line) for line in (run / "scores.jsonl").read_text().splitlines()]
    for k, r in enumerate(rows):
        r["wordiness_seeds"] = [r["wordiness"] + d for d in (-0.5, 0.1 * k, 0.5)]
    (run / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["seeds", str(run), "--by", "captioner", "-m", "wordiness", "--resamples", "20",
                 "--out", str(tmp_path / "seeds")]) == 0
    printed = capsys.readouterr().out
    assert "best captioner at 3 seed(s), by its mean wordiness: short" in printed


def test_a_config_file_cannot_name_a_metric_plug_in_without_allow_plugins(plugin_package, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("metrics: [userpkg.metrics:Wordiness]\n")
    assert main(["score", "-i", str(_input(tmp_path)), "--config", str(config), "--out", str(tmp_path / "a")]) == 2
    assert "--allow-plugins" in capsys.readouterr().err
    assert "userpkg.metrics" not in sys.modules  # refused before it was imported
    assert main(["score", "-i", str(_input(tmp_path)), "--config", str(config), "--allow-plugins",
                 "--out", str(tmp_path / "b"), "--no-cache"]) == 0


def test_halluc_rate_is_declared_lower_is_better():
    """The report inferred direction from a `_gap` suffix, so it bolded the worst halluc_rate."""
    from caprecon.metrics.base import read_columns
    from caprecon.metrics.halluc import Hallucination
    from halluc_fakes import ClaimLLM, PixelJudge

    metric = Hallucination(PixelJudge(), ClaimLLM())
    columns = read_columns({"columns": {c.name: c.to_json() for c in metric.columns}})
    assert columns["halluc_rate"].higher_is_better is False and columns["halluc"].higher_is_better is True
    assert columns["halluc_rate"].best([(0.1, "A"), (0.6, "B")]) == "A"


@pytest.mark.skipif(not java_available(), reason="the PTB tokenizer needs Java")
def test_score_cider_and_bleu4_give_pycocoevalcaps_values(tmp_path):
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    out = tmp_path / "run"
    assert main(["score", "-i", str(_input(tmp_path)), "-m", "cider", "-m", "bleu-4", "--out", str(out),
                 "--no-cache"]) == 0
    records = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    captions = [c for cs in CAPTIONS.values() for c in cs]
    refs = REFS * 2
    tokens = PTBTokenizer().tokenize({**{k: [{"caption": r} for r in refs[k]] for k in range(6)},
                                      **{6 + k: [{"caption": c}] for k, c in enumerate(captions)}})
    gts, res = {k: tokens[k] for k in range(6)}, {k: tokens[6 + k] for k in range(6)}
    cider, cider_each = Cider().compute_score(gts, res)
    bleu, bleu_each = Bleu(4).compute_score(gts, res, verbose=0)
    assert [r["cider"] for r in records] == pytest.approx(list(cider_each), abs=1e-9)
    assert [r["bleu-4"] for r in records] == pytest.approx(bleu_each[3], abs=1e-9)
    summary = json.loads((out / "summary.json").read_text())["metrics"]
    # the summary gives the corpus value: corpus BLEU pools n-gram counts, it is no mean of the captions'
    assert summary["bleu-4"]["corpus"] == pytest.approx(bleu[3], abs=1e-9)
    assert summary["bleu-4"]["corpus"] != pytest.approx(summary["bleu-4"]["mean"], abs=1e-6)
    assert summary["cider"]["corpus"] == pytest.approx(cider, abs=1e-9)


def test_a_metric_plug_in_named_in_an_untrusted_config_text_is_refused_though_named_elsewhere(tmp_path,
                                                                                             monkeypatch):
    """Issue 50 item 8: a `module:Class` metric goes through the plug-in trust check like every other
    plug-in. A config file read without --allow-plugins may hold the spec inside a text (a template,
    which is never taken for a plug-in itself); a metric of that spec is then refused before its module
    is imported, wherever it was named. A spec of its own, so no other test meets the distrust."""
    import caprecon

    site = tmp_path / "site"
    (site / "trustpkg").mkdir(parents=True)
    (site / "trustpkg" / "__init__.py").write_text("")
    (site / "trustpkg" / "metrics.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(site))
    config = tmp_path / "run.yaml"
    config.write_text('template: "trustpkg.metrics:Wordiness {caption}"\n')
    with pytest.raises(ConfigError, match=r"run\.yaml: template names the plug-in "
                                                   r"'trustpkg\.metrics:Wordiness'.*--allow-plugins"):
        caprecon.score(_input(tmp_path), metrics=["trustpkg.metrics:Wordiness"], config=config, no_cache=True)
    assert "trustpkg.metrics" not in sys.modules  # refused before it was imported
