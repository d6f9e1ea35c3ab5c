"""The mutation check of the headline formulas: change each by one token and see a test fail.

    python scripts/mutants.py                 # every mutant (make mutants)
    python scripts/mutants.py -k recon clip   # those whose name contains one of the words
    python scripts/mutants.py -j 1            # one mutant at a time (default: 2, or fewer cores)
    python scripts/mutants.py --no-fork       # each test run a fresh `python -m pytest`

Each mutant is data: the file (under src/caprecon), a snippet that must occur in it exactly
once, what replaces it, and the tests that should notice. The script copies src/ to a
temporary folder (one copy per job), applies one mutant there (never in the working tree),
runs its tests with PYTHONPATH pointing at the copy, and puts the snippet back. A snippet that
no longer occurs exactly once is reported as `stale` (the code moved: update the list) rather
than skipped. Exit status 1 when any mutant survives or is stale, or the unchanged copy fails.

First the tests run once on the unchanged copy, which must pass; that run (split over the jobs)
also records, with the probe plugin (`probe/mutants_probe.py`, tracing Python calls), which tests
call the function each mutant changes and how long each took. A mutant is then tried on those of
its named tests alone, quickest first, stopping at the first failure (`-x`); only when they all
pass are its named tests run whole (a test may reach the code in a subprocess, which the probe
cannot see), so a mutant is reported as surviving only if its named tests pass. A snippet at
module or class level, or in a signature (run on import), is tried on its named tests whole.
Mutants run `--jobs` at a time. `--named-only` skips the probe: every mutant on its named tests.

How a test run starts: this process first imports the third-party modules the tests use (PRELOAD:
torch, transformers, diffusers, numpy, scipy, PIL, pytest, hypothesis; never caprecon nor the
tests) and freezes their objects (`gc.freeze`: a child's collections skip them), and each run, the baseline's included, is a child forked from it (`os.fork`) that points
sys.path and PYTHONPATH at its copy, enters the repository root, sends its output to a file and
runs pytest: a fresh `python -m pytest` would spend about 3 s importing those modules again. One
loop, on one thread (a process with other threads running must not fork), starts the runs, polls
for their end, and kills a run that outlives `--timeout` with its whole process group (each run
leads its own, so what its tests started dies with it); a killed run counts as a failing one.
`--no-fork` runs each as a fresh subprocess instead, the way taken too where os.fork is missing or
a thread runs after the imports. The baseline runs the same way as the mutants, so a test that
fails only in a forked child fails there, on the unchanged code.
"""

from __future__ import annotations

import argparse
import ast
import gc
import importlib
import json
import math
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generator, Sequence

HERE = Path(__file__).resolve().parent  # probe/mutants_probe.py, the baseline's pytest plugin, lives under it
ROOT = HERE.parent
FORMULAS = "tests/test_formulas.py"
STAGES_TESTS = ("tests/test_adaptive_seeds.py", "tests/test_adaptive_stages.py")
DISTILL = "tests/test_distill.py"
REWARD_STATISTICS = "tests/test_reward_statistics.py"


@dataclass(frozen=True)
class Mutant:
    name: str  # the formula, and what the mutant does to it
    file: str  # under src/caprecon
    original: str
    mutated: str
    tests: tuple[str, ...] = (FORMULAS,)


# the cascade mutants whose code lives in apps/cascade/estimates.py (the others: the rounds, apps/cascade/__init__.py)
CASCADE_ESTIMATES = {
    'cascade: residual sd over n-2 -> n',
    'cascade: threshold margin loses abs',
    "cascade: best-of-n difference's variance of both -> the challenger's",
    "cascade: best-of-n difference's sd -> the sum of the sds",
    "cascade: best-of-n difference keeps the variance both share",
    "cascade: within-image variance's degrees of freedom n - 1 -> n",
    "cascade: within-image variance trusted from 1 degree of freedom",
    "cascade: image offsets' variance sigma^2 - within -> sigma^2",
    "cascade: image offset not shrunk to its weight",
    "cascade: image offset's variance between * within -> within",
    "cascade: allocation's gain per move, not per row",
    "cascade: allocation without the whole-system move",
    "cascade: allocation takes a move that lowers nothing",
    "cascade: swap chance over one se, not the difference's",
    "cascade: allocation in turn past a system's last row",
    'cascade: the leader no longer open with its challengers',
    'cascade: leave-one-out residual e / (1 - h) -> e',
    'cascade: leave-one-out sd over n - 3 -> n - 2',
    'cascade: coverage counts a row alone at its cheap score',
    'cascade: coverage within z sds -> 1.96 whatever z',
    'cascade: system mean plus its residual mean -> minus',
    "cascade: pooled sd's degrees of freedom n - 1 -> n",
    'cascade: system se loses the finite-population factor',
    'cascade: a wholly reconstructed system keeps an se',
    "cascade: system intervals' reach, sum of ses -> the larger",
    'cascade: swap chance over the others -> over all units',
}

MUTANTS = [
    # the walk of a score call (issue 55): the corpus step entered only for metrics with a corpus column
    Mutant("score: the corpus step skipped for the corpus columns", "run/score.py",
           "any(c.aggregate == CORPUS for c in m.columns)", "any(c.aggregate != CORPUS for c in m.columns)",
           ("tests/test_reference.py",)),
    # ReconScore paper: (1 + cos) / 2; CLIP-Image: the raw cosine of source and reconstruction
    Mutant("ReconScore (1+cos)/2 -> cos", "metrics/recon.py", "(1.0 + cos) / 2.0", "cos",
           (FORMULAS, "tests/test_recon.py")),
    Mutant("ReconScore (1+cos)/2 -> (1-cos)/2", "metrics/recon.py", "(1.0 + cos) / 2.0", "(1.0 - cos) / 2.0"),
    Mutant("CLIP-Image cos(source, reconstruction) -> cos(source, source)", "metrics/recon.py",
           "np.sum(source * rebuilt, axis=1)", "np.sum(source * source, axis=1)"),
    # CLIPScore (Hessel): 2.5 max(cos, 0) with "A photo depicts "; CLIP-S: 100 max(cos, 0), no prefix
    Mutant("CLIPScore clamp max(cos, 0) removed", "metrics/clipscore.py", "self.weight * np.maximum(cos, 0.0)",
           "self.weight * cos", (FORMULAS, "tests/test_clipscore.py")),
    Mutant("CLIPScore weight 2.5 -> 2", "metrics/clipscore.py", "WEIGHT = 2.5", "WEIGHT = 2",
           (FORMULAS, "tests/test_clipscore.py")),
    Mutant("CLIPScore prefix removed", "metrics/clipscore.py", 'PREFIX = "A photo depicts "', 'PREFIX = ""',
           (FORMULAS, "tests/test_clipscore.py")),
    Mutant("CLIP-S weight 100 -> 1", "metrics/clipscore.py", "CLIP_S_WEIGHT = 100.0", "CLIP_S_WEIGHT = 1.0",
           ("tests/test_clipscore.py", FORMULAS)),
    Mutant("CLIP-S gains CLIPScore's prefix", "metrics/clipscore.py", 'prefix: str = "", weight: float = CLIP_S_WEIGHT',
           "prefix: str = PREFIX, weight: float = CLIP_S_WEIGHT", ("tests/test_clipscore.py", FORMULAS)),
    # RefCLIPScore: harmonic mean of clipscore and the best (clamped) reference similarity
    Mutant("RefCLIPScore harmonic -> arithmetic mean", "metrics/clipscore.py",
           "float(2 * clip_s * ref_part / (clip_s + ref_part))", "float((clip_s + ref_part) / 2)",
           (FORMULAS, "tests/test_clipscore.py")),
    Mutant("RefCLIPScore best reference -> mean reference", "metrics/clipscore.py", "np.max(refs @ cand)",
           "np.mean(refs @ cand)", (FORMULAS, "tests/test_clipscore.py")),
    Mutant("RefCLIPScore reference clamp removed", "metrics/clipscore.py", "max(float(np.max(refs @ cand)), 0.0)",
           "float(np.max(refs @ cand))", (FORMULAS, "tests/test_clipscore.py")),
    Mutant("RefCLIPScore references without the prefix", "metrics/clipscore.py",
           "[self.prefix + r.strip() for r in item.sample.refs]", "[r.strip() for r in item.sample.refs]",
           (FORMULAS, "tests/test_clipscore.py")),
    # VQAScore: P("Yes") at the first answer token, softmax over the whole vocabulary
    Mutant("answer softmax over the vocabulary -> over positions", "models/llm.py",
           "torch.log_softmax(logits[i, s : s + c].float(), dim=-1)",
           "torch.log_softmax(logits[i, s : s + c].float(), dim=0)"),
    Mutant("VQAScore encoder-decoder first decoder step -> second", "models/vlm_transformers.py",
           "answer_rows(logits, [0] * len(chunk),", "answer_rows(logits, [1] * len(chunk),",
           ("tests/test_encoder_decoder.py",)),
    Mutant("VQAScore P('Yes') -> P('yes')", "metrics/vqascore.py", 'asks, images, ["Yes"])', 'asks, images, ["yes"])'),
    Mutant("VQAScore normalised P(yes)/(P(yes)+P(no)) -> P(no)/(...)", "metrics/vqascore.py",
           "out.append(yes / (yes + no))", "out.append(no / (yes + no))"),
    Mutant("VQAScore question wording", "metrics/vqascore.py", 'DEFAULT_TEMPLATE = "Is the figure showing: {caption}?"',
           'DEFAULT_TEMPLATE = "Does the figure show: {caption}?"'),
    # the Caption Turing Test: accuracy over questions, boxes by IoU >= threshold, mean IoU
    Mutant("IoU union + inter instead of - inter", "metrics/grading.py",
           "(b[2] - b[0]) * (b[3] - b[1]) - inter", "(b[2] - b[0]) * (b[3] - b[1]) + inter",
           (FORMULAS, "tests/test_qa.py")),
    Mutant("box correct at IoU >= t -> IoU > t", "metrics/grading.py", "Grade(iou >= iou_threshold,",
           "Grade(iou > iou_threshold,"),
    Mutant("Turing mean IoU -> max IoU / n", "metrics/turing.py", "sum(ious[row]) / len(ious[row])",
           "max(ious[row]) / len(ious[row])"),
    Mutant("accuracy over questions -> over categories", "metrics/categories.py",
           "self.total_correct / self.total_asked if", "self.total_correct / len(self.asked) if"),
    Mutant("Turing gap upper - score -> score - upper", "metrics/turing.py",
           'row["turing_gap"] = row["turing_upper"] - row["turing"]',
           'row["turing_gap"] = row["turing"] - row["turing_upper"]'),
    # CaptionQA: S = (1/k) sum 1[a_i = J(C, q_i)]
    Mutant("CaptionQA grades the gold answer instead of the LLM's", "metrics/captionqa.py",
           "score_answer(q, answer,", "score_answer(q, q.answer,"),
    Mutant("CaptionQA prompt without the caption", "metrics/captionqa.py",
           'PREAMBLE.replace("{caption}", caption.strip())', 'PREAMBLE.replace("{caption}", "")'),
    # the Caption Turing Test paper's Eq. 5 (average over datasets) and Eq. 4 (mean |gap| <= sigma)
    Mutant("Eq. 5 mean over datasets -> max", "apps/suites/table.py", "sum(values) / len(values)", "max(values)"),
    Mutant("Eq. 4 |J(I) - J(Î)| -> J(I) - J(Î)", "apps/suites/table.py",
           "abs(self.score(UPPER, d.name) - self.score(row, d.name))",
           "(self.score(UPPER, d.name) - self.score(row, d.name))"),
    Mutant("Eq. 4 <= sigma -> < sigma", "apps/suites/table.py", "value <= self.sigma", "value < self.sigma"),
    # the suites' per-dataset numbers: grounding by mean IoU (the paper's), MME by accuracy+
    Mutant("suite grounding headline mean IoU -> accuracy", "apps/suites/scoring.py",
           'out["miou"] = out["score"] = 100 * sum(ious) / len(ious)', 'out["miou"] = 100 * sum(ious) / len(ious)'),
    Mutant("suite accuracy+ all questions of an image -> any", "apps/suites/scoring.py",
           "sum(all(v) for v in groups.values())", "sum(any(v) for v in groups.values())"),
    # Eq. 7: cos(q_i, e) - alpha (1/n) sum_j cos(q_i, q_j)
    Mutant("Eq. 7 minus redundancy -> plus", "apps/cttd/rank.py", "q @ e - alpha *", "q @ e + alpha *"),
    Mutant("Eq. 7 (1/n) sum -> sum", "apps/cttd/rank.py", "(q @ q.T).mean(axis=1)", "(q @ q.T).sum(axis=1)"),
    # best-of-N: E[best of n] = sum_k s_(k) C(k-1, n-1) / C(N, n), averaged over images with >= n candidates
    Mutant("N-curve C(k-1, n-1) -> C(k-1, n)", "apps/selection.py", "math.comb(rank, n - 1)", "math.comb(rank, n)",
           (FORMULAS, "tests/test_caption.py::test_expected_best_equals_enumeration_of_subsets")),
    Mutant("N-curve ascending -> descending order", "apps/selection.py", "key=lambda i: (scores[i], -i)",
           "key=lambda i: (-scores[i], -i)",
           (FORMULAS, "tests/test_caption.py::test_expected_best_equals_enumeration_of_subsets")),
    Mutant("N-curve mean over images with n candidates -> over all images", "apps/selection.py",
           "for i in used) / len(used)}", "for i in used) / len(pools)}"),
    # Kendall tau_b / tau_c, direct and bootstrapped
    # Kendall tau is computed in numpy (no scipy.stats import): pin each variant's formula
    Mutant("kendall_tau ignores the variant (always tau_b)", "stats/correlation.py",
           "return kendall_taus(x, y)[variant]", 'return kendall_taus(x, y)["b"]'),
    Mutant("kendall tau_b sqrt(untied_x untied_y) -> sqrt(untied_x untied_x)", "stats/correlation.py",
           "concordance / math.sqrt(untied_x * untied_y)", "concordance / math.sqrt(untied_x * untied_x)"),
    Mutant("kendall tau_c (m-1)/m -> m/m", "stats/correlation.py",
           "(n**2 * (classes - 1) / classes)", "(n**2 * classes / classes)"),
    Mutant("kendall: pairs tied in x counted as untied", "stats/correlation.py",
           "pairs - _tied_pairs(x), pairs - _tied_pairs(y)", "pairs, pairs - _tied_pairs(y)"),
    Mutant("bootstrap tau_b sqrt(untied_x untied_y) -> sqrt(untied_x untied_x)", "stats/bootstrap.py",
           "concordance / np.sqrt(untied_x * untied_y)", "concordance / np.sqrt(untied_x * untied_x)",
           (FORMULAS, "tests/test_bootstrap.py")),
    Mutant("bootstrap tau_c (m - 1)/m -> m/m", "stats/bootstrap.py", "(size**2 * (classes - 1) / classes)",
           "(size**2 * (classes) / classes)", (FORMULAS, "tests/test_bootstrap.py")),
    # the paired bootstrap: both statistics on the same resample
    Mutant("paired bootstrap unpaired (B on all rows)", "stats/bootstrap.py",
           "lambda idx: statistic_a(idx) - statistic_b(idx)", "lambda idx: statistic_a(idx) - statistic_b(everything)",
           (FORMULAS, "tests/test_bootstrap.py")),
    # FLEUR's reference rule (its tests are tests/test_fleur.py)
    Mutant("FLEUR second decimal / 100 -> / 10", "metrics/fleur.py",
           "score += sum(d * v for d, v in enumerate(p)) / 100", "score += sum(d * v for d, v in enumerate(p)) / 10",
           ("tests/test_fleur.py",)),
    Mutant("FLEUR 1.0 -> 0.9 P(0) + P(0)", "metrics/fleur.py", "0.9 * p[0] + p[1]", "0.9 * p[0] + p[0]",
           ("tests/test_fleur.py",)),
    # scores over K seeds (issue 23; tests/test_seeds.py): the Student-t interval, the variance split,
    # the two-level bootstrap, seeds derived per index
    Mutant("seeds: t interval df K-1 -> K", "metrics/seeds.py", "float(stdtrit(n - 1, 0.5 + level / 2))",
           "float(stdtrit(n, 0.5 + level / 2))", ("tests/test_seeds.py",)),
    Mutant("seeds: sd over n-1 -> n", "metrics/seeds.py", "math.fsum((v - mean) ** 2 for v in values) / (n - 1)",
           "math.fsum((v - mean) ** 2 for v in values) / n", ("tests/test_seeds.py",)),
    Mutant("seeds: generator variance not divided by K", "metrics/seeds.py", "max(0.0, (between - within) / k)",
           "max(0.0, between - within)", ("tests/test_seeds.py",)),
    Mutant("seeds: two-level bootstrap keeps every seed", "stats/bootstrap.py",
           "seeds = rng.integers(0, paired.shape[1], (hi - lo, paired.shape[0], paired.shape[1]))",
           "seeds = np.broadcast_to(np.arange(paired.shape[1]), (hi - lo, paired.shape[0], paired.shape[1]))",
           ("tests/test_seeds.py",)),
    Mutant("seeds: every index gets the first seed", "reconstruct/reconstructor.py",
           'return first if index == 0 else derive_seed(first, "seed", index)', "return first",
           ("tests/test_seeds.py",)),
    # every number true (issue 37): each metric its own columns; one token rule over servers; no 0.5 for unknown
    Mutant("RefCLIPScore writes its CLIPScore part into clipscore", "metrics/clipscore.py",
           'row["refclipscore_clip"] = float(clip_s)', 'row["clipscore"] = float(clip_s)',
           ("tests/test_metric_columns.py",)),
    Mutant("two metrics writing one column pass silently", "run/local.py", "if key in row and row[key] != value:",
           "if False:", ("tests/test_metric_columns.py",)),
    Mutant("server token rule falls back on case", "models/openai_compat.py",
           'if str(entry.get("token", "")) == token]',
           'if str(entry.get("token", "")).casefold() == token.casefold()]',
           ("tests/test_openai_compat.py::test_token_matching_reads_every_option_by_one_rule",)),
    Mutant("server option outside the top-k counts as 0", "models/openai_compat.py",
           "[[_or(_token_prob(top, self._reply_start(option)), math.nan) for option in opts]",
           "[[_or(_token_prob(top, self._reply_start(option)), 0.0) for option in opts]",
           ("tests/test_openai_compat.py::test_an_option_outside_the_top_k_is_unknown_and_its_row_says_why",)),
    Mutant("VQAScore unknown P('Yes') passes as a number", "metrics/vqascore.py",
           "if any(math.isnan(p) for p in out):", "if False:", (FORMULAS,)),
    Mutant("VQAScore normalised without mass falls back to a value", "metrics/vqascore.py",
           "        if not yes + no > 0:", "        if False:", (FORMULAS,)),
    Mutant("claims supported at >= 0.5 -> > 0.5", "metrics/claims.py", "return self.p_yes >= SUPPORTED",
           "return self.p_yes > SUPPORTED", ("tests/test_halluc.py",)),
    Mutant("cached claims without the parser's revision", "metrics/claims.py", "parser=CLAIMS_PARSER_REVISION)", ")",
           ("tests/test_halluc.py",)),
    # claims with structure (DSG): the answer rule, the gate, the item score; on I and Î: each ratio
    Mutant("claims: an answer other than no scores 1", "metrics/claims.py",
           'strip().strip(".,!?").strip().lower() == "yes" else 0.0', 'strip().strip(".,!?").strip().lower() != "no" else 0.0',
           ("tests/test_claims.py",)),
    Mutant("claims gate: any parent -> all parents", "metrics/claims.py",
           "0.0 if any(scores.get(p, 0.0) < SUPPORTED", "0.0 if all(scores.get(p, 0.0) < SUPPORTED",
           ("tests/test_claims.py",)),
    Mutant("claims gate: a parent at exactly 0.5 gates", "metrics/claims.py",
           "0.0 if any(scores.get(p, 0.0) < SUPPORTED", "0.0 if any(scores.get(p, 0.0) <= SUPPORTED",
           ("tests/test_claims.py",)),
    Mutant("claims gate: a parent without a score vouches", "metrics/claims.py",
           "0.0 if any(scores.get(p, 0.0) < SUPPORTED", "0.0 if any(scores.get(p, 1.0) < SUPPORTED",
           ("tests/test_claims.py",)),
    Mutant("claims gated item score is the ungated one", "metrics/claims.py",
           "return ItemScore(sum(gated.values()) / len(gated),", "return ItemScore(sum(scores.values()) / len(gated),",
           ("tests/test_claims.py",)),
    Mutant("claims item score over the yes answers only", "metrics/claims.py",
           "sum(scores.values()) / len(scores), len(scores))",
           "sum(scores.values()) / max(1, sum(v > 0 for v in scores.values())), len(scores))", ("tests/test_claims.py",)),
    Mutant("check_claims gate: any parent -> all parents", "metrics/claims.py",
           "if any(not results[s][p].supported for p in claim.depends_on):",
           "if all(not results[s][p].supported for p in claim.depends_on):",
           ("tests/test_claim_check.py", "tests/test_halluc.py")),
    Mutant("claims precision over the conveyed", "metrics/claim_check.py",
           '"claims_precision": ratio(supported, n)', '"claims_precision": ratio(kept, n)',
           ("tests/test_claim_check.py",)),
    Mutant("claims conveyed over all claims", "metrics/claim_check.py",
           '{"claims_conveyed": ratio(kept, supported)', '{"claims_conveyed": ratio(kept, n)',
           ("tests/test_claim_check.py",)),
    Mutant("claims lost counts the hallucinated too", "metrics/claim_check.py",
           '"claims_lost": supported - kept', '"claims_lost": n - kept', ("tests/test_claim_check.py",)),
    Mutant("claims conveyed per type over the type's claims", "metrics/claim_check.py",
           'row[f"claims_conveyed/{kind}"] = ratio(both, on_i)', 'row[f"claims_conveyed/{kind}"] = ratio(both, total)',
           ("tests/test_claim_check.py",)),
    Mutant("claims precision per type over all claims", "metrics/claim_check.py",
           'row[f"claims_precision/{kind}"] = ratio(on_i, total)', 'row[f"claims_precision/{kind}"] = ratio(on_i, n)',
           ("tests/test_claim_check.py",)),
    Mutant("claims conveyed ignores Î", "metrics/claim_check.py",
           "counts[2] += seen.supported and rebuilt.supported", "counts[2] += seen.supported",
           ("tests/test_claim_check.py",)),
    Mutant("claims span end one short", "metrics/claim_check.py",
           "return (start, start + len(span)) if start >= 0 else None",
           "return (start, start + len(span) - 1) if start >= 0 else None", ("tests/test_claim_check.py",)),
    Mutant("reward part claims[column] reads the headline", "apps/reward/__init__.py",
           "return [metric_column(label)[1] or metric.headline for", "return [metric.headline for",
           ("tests/test_claim_check.py::test_the_reward_takes_precision_and_conveyed_as_parts_of_their_own",)),
    Mutant("claims rationale counts lost among all claims", "reports/html/collect.py",
           "    supported = len(evidence) - len(wrong)", "    supported = len(evidence)",
           ("tests/test_claim_check.py::test_the_rationale_is_built_from_the_evidence_alone",)),
    Mutant("turing gate: any parent right suffices", "metrics/turing.py",
           "return [ok and all(by_id.get(p, False) for p in q.parents)",
           "return [ok and any(by_id.get(p, False) for p in q.parents)",
           ("tests/test_claims.py::test_turing_scores_a_question_whose_parent_was_answered_wrong_as_wrong",)),
    Mutant("turing gate removed", "metrics/turing.py",
           "right = gated_right(questions, [graded[field][row][i][2] for i in range(len(questions))])",
           "right = [graded[field][row][i][2] for i in range(len(questions))]",
           ("tests/test_claims.py::test_turing_scores_a_question_whose_parent_was_answered_wrong_as_wrong",)),
    Mutant("cttd child of a dropped parent kept", "apps/cttd/curate.py",
           "missing = [p for p in item.parents if p not in ids]", "missing = []",
           ("tests/test_cttd.py::test_a_build_writes_parents_and_leaves_out_what_a_blind_llm_answers",)),
    Mutant("cttd dependency on itself accepted", "apps/cttd/generate.py",
           "and 0 <= p < k})", "and 0 <= p <= k})",
           ("tests/test_cttd.py::test_a_build_writes_parents_and_leaves_out_what_a_blind_llm_answers",)),
    Mutant("cttd blind questions kept by default", "apps/cttd/pipeline.py",
           "    blind_keep: bool = False", "    blind_keep: bool = True",
           ("tests/test_cttd.py::test_a_build_writes_parents_and_leaves_out_what_a_blind_llm_answers",)),
    Mutant("t2i DSG score ungated", "metrics/claim_check.py",
           "self.headline: result.gated,", "self.headline: result.ungated,",
           ("tests/test_claim_check.py::test_t2i_asks_dsgs_questions_of_live_judges",)),
    Mutant("tifa160 keeps unparsable dependencies", "apps/metabench/tifa160.py",
           "parents = {} if item in unparsed else", "parents = {} if False else", ("tests/test_claims.py",)),
    Mutant("batch-invariant generation still batched", "models/generator.py",
           "per_call = 1 if self.batch_invariant else self.batch_size", "per_call = self.batch_size",
           ("tests/test_scale.py::test_batch_invariant_reconstructions_do_not_depend_on_their_batch",)),
    Mutant("a hub captioner's first run reads no generation config", "models/captioner.py",
           "return generation_defaults(hub_generation_config(self.source.name, self.source.revision))",
           "return {}", ("tests/test_caption.py::test_a_hub_captioner_not_yet_downloaded_samples_with_its_own_settings",)),
    # refinement judged on held-out questions; its guard
    Mutant("refine keep-margin removed", "apps/refine/guard.py", 'if row["score"] > before + margin:',
           'if row["score"] > before:', ("tests/test_refine.py",)),
    Mutant("refine tokens-cut verdict removed", "apps/refine/guard.py", 'if row.get("tokens_cut"):', "if False:",
           ("tests/test_refine.py",)),
    Mutant("refine over-budget revision scored anyway", "apps/refine/run.py", "elif over > 0:", "elif False:",
           ("tests/test_refine.py",)),
    Mutant("refine reviser told the held-out flips", "apps/refine/feedback.py", 'states[s.id].get("turing_guiding_flipped")',
           'states[s.id].get("turing_flipped")', ("tests/test_refine.py",)),
    Mutant("refine guard reads the whole bank", "apps/refine/run.py",
           "measured = [build_metric(name, judging, cfg) for name in names]",
           "measured = [build_metric(name, roles, cfg) for name in names]", ("tests/test_refine.py",)),
    # compare on paired draws; CIDEr's IDF from the whole input
    Mutant("compare draws B's seeds apart from A's", "stats/bootstrap.py",
           "paired[picked[lo:hi, :, None], seeds].mean(axis=(1, 2))",
           "a[picked[lo:hi, :, None], seeds].mean(axis=(1, 2)) - b[picked[lo:hi, :, None], "
           "rng.integers(0, paired.shape[1], seeds.shape)].mean(axis=(1, 2))", ("tests/test_seeds.py",)),
    Mutant("compare pairs images asked other questions", "stats/seeds.py", "a[i].questions != b[i].questions]",
           "a[i].questions == b[i].questions]", ("tests/test_seeds.py",)),
    Mutant("compare counts every named seed as shared", "stats/seeds.py", "sum(x == y for x, y in named)",
           "len(named)", ("tests/test_seeds.py",)),
    Mutant("CIDEr IDF over the batch's documents", "metrics/reference.py", "np.log(float(documents))",
           "np.log(float(len(self.crefs)))", ("tests/test_reference.py",)),
    Mutant("CIDEr corpus from the shard, not the whole input", "run/score.py", "metric.prepare(whole)",
           "metric.prepare(rows)", ("tests/test_reference.py",)),
    # published values carry their protocol
    Mutant("verify compares values published with other references", "apps/metabench/verify.py",
           'if "refs" in differs:', 'if "ties" in differs:', ("tests/test_metabench.py",)),
    Mutant("benchmark tie credit fixed at a half", "apps/metabench/protocol.py",
           "    tie_credit = benchmark.tie_credit", "    tie_credit = 0.5", ("tests/test_benchmark_layouts.py",)),
    Mutant("FOIL one pair per image -> every foil", "data/loaders/foil.py", "        paired_images.add(image_id)\n",
           "", ("tests/test_benchmark_layouts.py",)),
    Mutant("expected file's tie rule unchecked", "apps/metabench/verify.py", 'and protocol["ties"] != row["key"]:',
           'and protocol["ties"] == "":', ("tests/test_metabench.py",)),
    Mutant("a tau row's variant ignored", "apps/metabench/__init__.py",
           '        ties = key if key in ("tau_b", "tau_c") else self.ties', "        ties = self.ties",
           ("tests/test_benchmark_layouts.py",)),
    # issue 50 item 6: meta reads each metric's declared direction
    Mutant("benchmark directions copied before the scorer fills them", "apps/metabench/protocol.py",
           "declared = {} if higher_is_better is None else higher_is_better", "declared = higher_is_better or {}",
           ("tests/test_meta.py::test_a_benchmark_reads_each_metrics_declared_direction_never_an_assumed_one",)),
    Mutant("benchmark ignores the --scores file's run manifest", "apps/metabench/meta.py",
           "{} if scored_columns is None else scored_columns,\n                                            *file_columns)",
           "{} if scored_columns is None else scored_columns)",
           ("tests/test_meta.py::test_a_benchmark_reads_each_metrics_declared_direction_never_an_assumed_one",)),
    Mutant("meta swaps its scorer's filling columns for a new mapping", "apps/metabench/meta.py",
           "scorable, {} if columns is None else columns)", "scorable, columns or {})",
           ("tests/test_meta.py::test_meta_reads_the_direction_of_caprecons_own_metrics_once_they_have_scored",)),
    Mutant("benchmark swaps the scorer's filling columns for a new mapping", "apps/metabench/meta.py",
           "files, {} if scored_columns is None else scored_columns)", "files, scored_columns or {})",
           ("tests/test_meta.py::test_meta_reads_the_direction_of_caprecons_own_metrics_once_they_have_scored",)),
    # issue 50 item 7: a fresh reconstruction is read once its queued write is done
    Mutant("reconstruction read before its queued write", "reconstruct/reconstructor.py",
           "if self.checksum is None and self.written is not None and self.path is not None:", "if False:",
           ("tests/test_store.py::test_a_fresh_reconstruction_asked_again_is_read_once_written_not_regenerated",)),
    # issue 50 item 2: one token per option, spelled exactly, over a server as locally; FLEUR's top-k floor
    Mutant("server token rule sums whitespace variants", "models/openai_compat.py",
           'if str(entry.get("token", "")) == token]', 'if str(entry.get("token", "")).strip() == token.strip()]',
           ("tests/test_openai_compat.py::test_one_token_rule_gives_the_same_number_over_the_server_and_locally",
            "tests/test_openai_compat.py::test_case_and_whitespace_variants_are_each_their_own_token_over_a_server")),
    Mutant("server reply_space ignored", "models/openai_compat.py",
           'return " " + option if self.reply_space and not option[:1].isspace() else option', "return option",
           ("tests/test_openai_compat.py::test_case_and_whitespace_variants_are_each_their_own_token_over_a_server",)),
    Mutant("server top-k covered mass -> its largest entry", "models/openai_compat.py",
           "math.fsum(math.exp(lp) for entry in top", "max(math.exp(lp) for entry in top",
           ("tests/test_openai_compat.py::test_fleur_over_the_server_reports_the_top_k_mass_and_below_its_floor_the_row_is_missing",)),
    Mutant("FLEUR top-k mass over the positions read: least -> most", "metrics/fleur.py",
           'mass = min(reply["covered"][k] for k', 'mass = max(reply["covered"][k] for k',
           ("tests/test_openai_compat.py::test_fleur_over_the_server_reports_the_top_k_mass_and_below_its_floor_the_row_is_missing",)),
    Mutant("FLEUR row below the top-k floor kept", "metrics/fleur.py", "if mass < self.topk_floor:", "if False:",
           ("tests/test_openai_compat.py::test_fleur_over_the_server_reports_the_top_k_mass_and_below_its_floor_the_row_is_missing",)),
    Mutant("FLEUR top-k floor 0.99 -> 0.9", "metrics/fleur.py", "TOPK_FLOOR = 0.99", "TOPK_FLOOR = 0.9",
           ("tests/test_openai_compat.py::test_fleur_over_the_server_reports_the_top_k_mass_and_below_its_floor_the_row_is_missing",)),
    # distill and the distilled folder (issue 51 items 3, 5, 6, 11, 13; issue 50 item 4): the guards this round added
    Mutant("distill: an infinite metric value taken for a missing one", "apps/distill/rows.py",
           "if isinstance(value, float) and not math.isfinite(value):", "if isinstance(value, float) and math.isnan(value):",
           (f"{DISTILL}::test_non_finite_values_are_refused_naming_their_rows_and_json_is_strict",)),
    Mutant("distill: values whose spread overflows standardised", "apps/distill/train.py",
           "    if not (math.isfinite(mean) and math.isfinite(scale)):\n        k =",
           "    if not (math.isfinite(mean) or math.isfinite(scale)):\n        k =",
           (f"{DISTILL}::test_non_finite_values_are_refused_naming_their_rows_and_json_is_strict",)),
    Mutant("distill: a reconstruction read from the path the row names", "apps/distill/rows.py",
           "Stored(name, found[1], found[2])", "Stored(name, Path(name), found[2])",
           (f"{DISTILL}::test_reconstructions_are_read_from_the_store_by_key_only",)),
    Mutant("distill: a stored reconstruction's checksum unchecked", "apps/distill/encode.py",
           "read_verified(path, wanted[path].checksum)", "read_verified(path, None)",
           (f"{DISTILL}::test_reconstructions_are_read_from_the_store_by_key_only",)),
    Mutant("distill: auto's reconstruction objective on rows the store lacks", "apps/distill/train.py",
           "all(x.path is not None for x in r.reconstructions)", "all(x.named for x in r.reconstructions)",
           (f"{DISTILL}::test_reconstructions_are_read_from_the_store_by_key_only",)),
    Mutant("distill: no warning when the text encoder chose the reconstructions", "apps/distill/__init__.py",
           'getattr(text_encoder, "fingerprint", None) in {', 'getattr(text_encoder, "fingerprint", None) not in {',
           (f"{DISTILL}::test_distill_warns_when_its_text_encoder_chose_the_reconstructions",)),
    Mutant("distilled folder: an encoder folder outside it", "models/distilled.py",
           "inside.is_relative_to(folder.resolve())", "inside.is_relative_to(folder.resolve().parent)",
           (f"{DISTILL}::test_a_distilled_folder_names_no_encoder_outside_itself",)),
    Mutant("distilled folder: module:Class encoders without allow_plugins", "models/distilled.py",
           "        if not allow_plugins:\n            raise registry.plugin_refused",
           "        if allow_plugins:\n            raise registry.plugin_refused",
           (f"{DISTILL}::test_a_distilled_folder_names_no_encoder_outside_itself",)),
    Mutant("-m distilled:FOLDER never given --allow-plugins", "metrics/__init__.py",
           'allow_plugins=bool(getattr(config, "allow_plugins", False))', "allow_plugins=False",
           (f"{DISTILL}::test_allow_plugins_reaches_a_distilled_metric_on_the_command_line",)),
    Mutant("RunConfig drops the caller's allow_plugins", "run/config.py",
           'values["allow_plugins"] = allow_plugins', 'values["allow_plugins"] = False',
           (f"{DISTILL}::test_allow_plugins_reaches_a_distilled_metric_on_the_command_line",)),
    Mutant("distilled folder: weights read past the head's size", "models/distilled.py",
           "most = 8 * sum(", "most = 800 * sum(", (f"{DISTILL}::test_a_damaged_distilled_folder_says_what_is_wrong",)),
    Mutant("distilled folder: integer weights taken", "models/distilled.py",
           "if not tensor.is_floating_point():", "if tensor.is_complex():",
           (f"{DISTILL}::test_a_damaged_distilled_folder_says_what_is_wrong",)),
    Mutant("distilled folder: a NaN weight taken", "models/distilled.py",
           "if not bool(torch.isfinite(tensor).all()):", "if not bool(torch.isfinite(tensor).any()):",
           (f"{DISTILL}::test_a_damaged_distilled_folder_says_what_is_wrong",)),
    Mutant("distilled folder: a size of 0 taken", "models/distilled.py",
           "and 1 <= value <= MAX_WIDTH", "and 0 <= value <= MAX_WIDTH",
           (f"{DISTILL}::test_a_damaged_distilled_folder_says_what_is_wrong",)),
    Mutant("distilled folder: a non-finite line onto the metric taken", "models/distilled.py",
           "if kind is float and not is_number(value):", "if kind is float and not isinstance(value, float):",
           (f"{DISTILL}::test_a_damaged_distilled_folder_says_what_is_wrong",)),
    Mutant("distilled folder: config.json written with Infinity", "models/distilled.py",
           "json.dumps(self.config, indent=2, allow_nan=False)", "json.dumps(self.config, indent=2, allow_nan=True)",
           (f"{DISTILL}::test_config_and_manifest_are_strict_json",)),
    Mutant("manifest written with NaN", "run/folder.py", "json.dumps(_finite(redact(plain))",
           "json.dumps((redact(plain))", (f"{DISTILL}::test_config_and_manifest_are_strict_json",)),
    Mutant("run lock: another thread of the process shares a held folder", "run/folder.py",
           "if key in _held and _held[key][3] != threading.get_ident():",
           "if key in _held and _held[key][3] == threading.get_ident():",
           (f"{DISTILL}::test_two_threads_of_one_process_never_hold_one_run_folder",)),
    Mutant("reward-audit: an audit of fewer than 3 captions", "apps/reward/audit.py", "MIN_AUDIT_CAPTIONS = 3",
           "MIN_AUDIT_CAPTIONS = 1", ("tests/test_reward_audit.py",)),
    Mutant("reward-audit: captions with unreadable images audited", "apps/reward/audit.py",
           "            read_image(row)\n", "            pass\n", ("tests/test_reward_audit.py",)),
    # the Reward is the score (issue 50 item 3, item 8): pictures keyed by content, files by score's id
    Mutant("reward deduplication keyed by row instead of image content", "apps/reward/__init__.py",
           "image = pictures.setdefault((base.image_key, base.sample.image_id), len(opened))",
           "image = pictures.setdefault((row, base.sample.image_id), len(opened))",
           ("tests/test_reward.py::test_identical_pictures_and_captions_are_scored_once_by_content_not_by_row",)),
    Mutant("reward names a file by its content, not by score's image id", "apps/reward/__init__.py",
           "                if not name:\n", "                if True:\n",
           ("tests/test_reward.py::test_reward_gives_what_score_gives_for_the_same_picture_and_caption",)),
    Mutant("retrieval leaves the source out by name only", "models/generator.py",
           "if gid == request.image_id or request.source_key in keys]", "if gid == request.image_id]",
           ("tests/test_reward.py::test_the_offline_reward_leaves_the_scored_photo_out_as_score_does",)),
    Mutant("an empty completion's reward is not `empty`", "apps/reward/__init__.py",
           "parts[EMPTY_PART] = [self.empty if blank else 0.0", "parts[EMPTY_PART] = [0.0 if blank else 0.0",
           ("tests/test_reward.py::test_an_empty_completion_gets_empty_whatever_the_metrics_weights_and_guards",)),
    Mutant("an empty completion's metric parts unknown, not 0", "apps/reward/__init__.py",
           "return [0.0 if blank else None if pair is None", "return [None if blank else None if pair is None",
           ("tests/test_reward.py::test_an_empty_completion_gets_empty_whatever_the_metrics_weights_and_guards",)),
    Mutant("a blank completion is not empty", "apps/reward/__init__.py", "empty = [not caption.strip() for caption in captions]",
           "empty = [not caption for caption in captions]",
           ("tests/test_reward.py::test_an_empty_completion_gets_empty_whatever_the_metrics_weights_and_guards",)),
    Mutant("a metric named twice passes", "apps/reward/__init__.py", "if labels.count(label) > 1}", "if labels.count(label) > 2}",
           ("tests/test_reward.py::test_a_metric_named_twice_is_refused",)),
    Mutant("reconstruction requests keep the caption's whitespace", "reconstruct/reconstructor.py",
           "caption = collapse_whitespace(s.caption)", "caption = s.caption",
           ("tests/test_reward.py::test_captions_differing_only_by_whitespace_cost_one_generation",)),
    Mutant("whitespace collapse only trims", "data/normalise.py", 'return " ".join(text.split())', "return text.strip()",
           ("tests/test_reward.py::test_captions_differing_only_by_whitespace_cost_one_generation",)),
    Mutant("a served file travels without its name", "apps/reward/wire.py",
           ', NAME: Path(picture).name}', "}",
           ("tests/test_serve.py::test_a_served_file_is_named_as_in_process_so_seeded_rewards_agree",)),
    Mutant("a served file's name dropped by the server", "apps/reward/wire.py",
           'return {"bytes": data, "path": name} if name else data', "return data",
           ("tests/test_serve.py::test_a_served_file_is_named_as_in_process_so_seeded_rewards_agree",)),
    # bad input on the training path (guard7b)
    Mutant("a path with a lone surrogate reaches the OS calls", "data/images.py", "if not str(path).isascii():",
           "if str(path).isascii():", ("tests/test_reward_bad_cells.py::test_a_path_with_a_lone_surrogate_is_refused_naming_the_problem",)),
    Mutant("a cell's empty bytes read as its path", "apps/reward/inputs.py",
           'image = image.get("path") if image.get("bytes") is None else image["bytes"]',
           'image = image.get("bytes") or image.get("path")',
           ("tests/test_reward_bad_cells.py::test_empty_bytes_are_the_rows_error_not_a_cue_to_open_the_path",)),
    Mutant("empty bytes hashed as a picture", "apps/reward/inputs.py",
           "if isinstance(image, (bytes, bytearray)) and not image:", "if isinstance(image, (bytes, bytearray)) and image is None:",
           ("tests/test_reward_bad_cells.py::test_empty_bytes_are_the_rows_error_not_a_cue_to_open_the_path",)),
    Mutant("the client sends the file an empty cell names", "apps/reward/wire.py",
           'picture = picture.get("path") if picture.get("bytes") is None else picture["bytes"]',
           'picture = picture.get("bytes") or picture.get("path")',
           ("tests/test_reward_bad_cells.py::test_empty_bytes_are_the_rows_error_not_a_cue_to_open_the_path",)),
    Mutant("a numpy array taken as a picture", "apps/reward/inputs.py",
           'return f"is {kind_of(picture)}{advice}; give {PICTURE_FORMS}, or None"', "return None",
           ("tests/test_reward_bad_cells.py::test_a_numpy_array_or_a_number_as_a_picture_is_refused_naming_the_row",)),
    Mutant("a cell of numpy bytes taken as a picture", "apps/reward/inputs.py",
           'return f"is a mapping whose bytes or path is neither bytes nor a path; give {PICTURE_FORMS}, or None"',
           "return None", ("tests/test_reward_bad_cells.py::test_a_numpy_array_or_a_number_as_a_picture_is_refused_naming_the_row",)),
    Mutant("verl's numpy picture reaches the client's encoding", "apps/reward/remote.py",
           "            if problem := picture_problem(picture):\n                raise ConfigError(f\"verl reward:",
           "            if problem := None:\n                raise ConfigError(f\"verl reward:",
           ("tests/test_reward_bad_cells.py::test_verls_reward_refuses_a_numpy_picture_naming_the_sample_before_any_request",)),
    Mutant("an empty completion's picture error reported", "apps/reward/__init__.py",
           "        if blank:\n            continue\n", "        if False:\n            continue\n",
           ("tests/test_reward_bad_cells.py::test_empty_bytes_are_the_rows_error_not_a_cue_to_open_the_path",)),
    Mutant("a metric's failure named on the next pair", "apps/reward/__init__.py",
           'failures.setdefault(at, f"{metric.name} failed: {result}")',
           'failures.setdefault(at + 1, f"{metric.name} failed: {result}")',
           ("tests/test_reward_bad_cells.py::test_a_served_reward_says_why_a_row_failed_inside_the_reward_redacted",)),
    Mutant("a reward's row error served unredacted", "apps/reward/service.py",
           "errors.setdefault(row, redact_text(failed[start + row]))", "errors.setdefault(row, failed[start + row])",
           ("tests/test_reward_bad_cells.py::test_a_served_reward_says_why_a_row_failed_inside_the_reward_redacted",)),
    Mutant("a numpy float64 guard weight kept as numpy's", "apps/reward/guards.py",
           "object.__setattr__(self, name, float(getattr(self, name)))", "object.__setattr__(self, name, getattr(self, name))",
           ("tests/test_reward_bad_cells.py::test_a_numpy_float64_weight_is_kept_as_pythons_float",)),
    # settings checked when built (issue 51 item 8)
    Mutant("guards' counts read as any number", "apps/reward/guards.py", "problem = count_problem(getattr(self, name), 1)",
           "problem = number_problem(getattr(self, name), 1)", ("tests/test_reward.py::test_settings_are_refused_when_the_object_is_built",)),
    Mutant("guards' weights unbounded below", "apps/reward/guards.py", "problem = number_problem(getattr(self, name), 0.0)",
           "problem = number_problem(getattr(self, name), None)",
           ("tests/test_reward.py::test_settings_are_refused_when_the_object_is_built",)),
    Mutant("reward's empty unchecked", "apps/reward/__init__.py", "problem = number_problem(empty)",
           "problem = number_problem(0.0)", ("tests/test_reward.py::test_settings_are_refused_when_the_object_is_built",)),
    # TRL-shaped inputs (issue 51 item 7)
    Mutant("a message's None content refused", "apps/reward/inputs.py", "if content is None or isinstance(content, str):",
           "if isinstance(content, str):", ("tests/test_reward.py::test_an_empty_completion_gets_empty_whatever_the_metrics_weights_and_guards",
                                             "tests/test_reward.py::test_trl_shaped_inputs_it_takes")),
    Mutant("a None text part joined", "apps/reward/inputs.py", 'return " ".join(text for text in texts if text)',
           'return " ".join(texts)', ("tests/test_reward.py::test_trl_shaped_inputs_it_takes",)),
    Mutant("a caption that is no text passes", "apps/reward/__init__.py", "if not isinstance(caption, str):",
           "if caption is None:", ("tests/test_reward.py::test_trl_shaped_inputs_it_refuses_naming_the_row",)),
    Mutant("a lone string read as captions", "apps/reward/inputs.py", "if isinstance(values, (str, bytes)) or",
           "if isinstance(values, bytes) or", ("tests/test_reward.py::test_trl_shaped_inputs_it_refuses_naming_the_row",)),
    Mutant("a reward call shows no progress", "apps/reward/__init__.py", 'unit="caption", disable=not self.progress,',
           'unit="caption", disable=True,',
           ("tests/test_reward.py::test_a_reward_call_shows_its_progress_unless_told_not_to",)),
    # every caprecon log record masked, whatever the entry point (issue 51 item 1)
    Mutant("only the caprecon logger itself masked", "__init__.py",
           'if name == "caprecon" or name.startswith("caprecon."):', 'if name == "caprecon":',
           ("tests/test_reward.py::test_no_log_record_of_a_python_reward_holds_the_server_password",
            "tests/test_redaction.py::test_a_caprecon_record_is_masked_as_it_is_made_whatever_handler_shows_it")),
    Mutant("a record's traceback unmasked", "core/redaction.py", "if record.exc_info and not record.exc_text:",
           "if False:", ("tests/test_redaction.py::test_a_caprecon_record_is_masked_as_it_is_made_whatever_handler_shows_it",)),
    # the metric contract on every call (issue 51 item 4)
    Mutant("contract: a row count other than the items' passes", "metrics/base.py", "if len(rows) != count:",
           "if len(rows) > count:", ("tests/test_metric_contract.py::test_score_and_the_reward_raise_the_same_error",)),
    Mutant("contract: a row without its headline passes", "metrics/base.py", "if metric.headline not in row:",
           "if metric.headline is None:", ("tests/test_metric_contract.py::test_score_and_the_reward_raise_the_same_error",)),
    Mutant("contract: text where a number is declared passes", "metrics/base.py",
           "if isinstance(value, bool) or not isinstance(value, (int, float)):", "if isinstance(value, bool):",
           ("tests/test_metric_contract.py::test_score_and_the_reward_raise_the_same_error",)),
    Mutant("contract: a value outside the declared range passes", "metrics/base.py",
           "if math.isfinite(value) and not _inside(value, column):", "if math.isfinite(value) and False:",
           ("tests/test_metric_contract.py::test_score_and_the_reward_raise_the_same_error",)),
    Mutant("contract: rounding slack 1e-6 -> 1e-3", "metrics/base.py", "RANGE_SLACK = 1e-6", "RANGE_SLACK = 1e-3",
           ("tests/test_metric_contract.py::test_a_value_within_rounding_of_its_bound_is_inside",)),
    Mutant("contract: a range with low above high passes", "metrics/base.py",
           "and column.low > column.high:", "and column.low > column.high + 1.0:",
           ("tests/test_metric_contract.py::test_impossible_declarations_are_refused_before_any_work",)),
    Mutant("contract: any direction passes", "metrics/base.py", "if column.higher_is_better not in (True, False, None):",
           'if column.higher_is_better not in (True, False, None, "up"):',
           ("tests/test_metric_contract.py::test_impossible_declarations_are_refused_before_any_work",)),
    Mutant("contract: columns unchecked when a run builds its metrics", "run/score.py",
           "    check_columns(built)  # declarations", "    (built)  # declarations",
           ("tests/test_metric_contract.py::test_impossible_declarations_are_refused_before_any_work",)),
    Mutant("contract: a broken metric retried row by row", "run/failures.py",
           "        except MetricContractError:\n            raise  # the metric's code",
           "        except ZeroDivisionError:\n            raise  # the metric's code",
           ("tests/test_metric_contract.py::test_score_and_the_reward_raise_the_same_error",)),
    Mutant("contract: the breaking batch's other metrics lost", "run/local.py",
           "except MetricContractError as exc:  # the batch's", "except ZeroDivisionError as exc:  # the batch's",
           ("tests/test_metric_contract.py::test_a_broken_metric_stops_the_run_naming_it_and_keeps_what_was_scored",)),
    Mutant("a stage's missing results asked for again for ever", "run/failures.py", "if len(done) != len(part):",
           "if len(done) > len(part):",
           ("tests/test_metric_contract.py::test_a_stage_that_returns_fewer_results_than_rows_stops_instead_of_spinning",)),
    Mutant("contract: a broken metric's batch retried on Ray", "run/ray.py",
           "except (RunError, MetricContractError) as stop:", "except RunError as stop:",
           ("tests/test_metric_contract.py::test_on_ray_a_broken_metric_stops_the_run_at_once_naming_it",)),
    # adaptive seeds (issue 50 items 1 and 8): Stein's two-stage size and interval, the moderated variance
    Mutant("adaptive: seeds for half the target width", "metrics/adaptive.py",
           "need = share * (2 * half / width) ** 2", "need = share * (2 * half / (width / 2)) ** 2", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive: the interval's factor 2 dropped from the seed count", "metrics/adaptive.py",
           "need = share * (2 * half / width)", "need = share * (half / width)", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive: seed count rounded down", "metrics/adaptive.py", "max(least, math.ceil(need))",
           "max(least, int(need))", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive: MAX ignored", "metrics/adaptive.py", "return min(most, max(least, math.ceil(need)))",
           "return max(least, math.ceil(need))", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive: interval from the sd of all draws, not the first stage's", "metrics/adaptive.py",
           'two_stage_interval(row[name], half, len(caption_rows))',
           'two_stage_interval(row[name], t_quantile(self.seeds - 1) * row[f"{name}_sd"], len(caption_rows))',
           ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive: interval over the first stage's seed count", "metrics/adaptive.py",
           'two_stage_interval(row[name], half, len(caption_rows))',
           'two_stage_interval(row[name], half, self.seeds)', ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive: log-variance bias correction's sign", "metrics/variance_priors.py",
           "centred = [z - (float(digamma(d / 2)) - math.log(d / 2))", "centred = [z - (float(digamma(d / 2)) + math.log(d / 2))",
           ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive: sampling variance of log s^2 not taken off", "metrics/variance_priors.py",
           "/ (len(centred) - 1)\n              - math.fsum(float(polygamma(1,", "/ (len(centred) - 1)\n              + math.fsum(float(polygamma(1,",
           ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive: prior holds the caption's own draws too", "metrics/variance_priors.py",
           "most = (len(seen) - 1) * math.fsum", "most = len(seen) * math.fsum", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive: prior scale's digamma sign", "metrics/variance_priors.py",
           "log_var = mean + float(digamma(prior_df / 2))", "log_var = mean - float(digamma(prior_df / 2))",
           ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive: moderated weights swapped", "metrics/variance_priors.py",
           "math.sqrt(self.df / total) * self.sd, math.sqrt(df / total) * sd",
           "math.sqrt(df / total) * self.sd, math.sqrt(self.df / total) * sd", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive: moderated df without the prior's", "metrics/variance_priors.py",
           "math.sqrt(df / total) * sd), total", "math.sqrt(df / total) * sd), df", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive: pooled df of one caption", "metrics/variance_priors.py", "return VariancePrior(total,",
           "return VariancePrior(dfs[0],", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive: variance fitted per batch, not over the input", "run/score.py",
           'if part.rule != "stein"]', 'if part.rule == "stein"]', ("tests/test_adaptive_seeds.py",)),
    # adaptive seeds' mixture prior (issue 54 item 2): the fit, the posterior and its quantile
    Mutant("adaptive mixture: posterior weights without the prior's", "metrics/variance_priors.py",
           "log_post = np.log(self.weights) + _log_marginal", "log_post = 0 * np.log(self.weights) + _log_marginal",
           ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive mixture: posterior df without the caption's", "metrics/variance_priors.py",
           "post_df = prior_df + df", "post_df = prior_df + 0", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive mixture: posterior variance without the caption's draws", "metrics/variance_priors.py",
           "(prior_df * prior_var + df * sd**2) / post_df", "(prior_df * prior_var + sd**2) / post_df", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive mixture: one-sided quantile", "metrics/variance_priors.py",
           "(2 * stdtr(post_df, half / post_sd) - 1)", "(stdtr(post_df, half / post_sd))", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive mixture: one component's early return inverted", "metrics/variance_priors.py",
           "if covered(low) >= 0:", "if covered(low) <= 0:", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive mixture: F density's scale term's sign", "metrics/variance_priors.py",
           "- df / 2 * np.log(scale)", "+ df / 2 * np.log(scale)", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive mixture: F density's exponent without the prior's df", "metrics/variance_priors.py",
           "- (df + prior_df) / 2 * np.log1p", "- df / 2 * np.log1p", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive mixture: BIC without its penalty", "metrics/variance_priors.py",
           "bic = -2 * loglik + (3 * k - 1) * math.log", "bic = -2 * loglik + 0 * math.log", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive mixture: components allowed on few captions", "metrics/variance_priors.py",
           "len(variances) < CAPTIONS_PER_COMPONENT * k:", "len(variances) < k:", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive mixture: a component's df capped by all captions, not its own", "metrics/variance_priors.py",
           "np.maximum(len(variances) * weights - 1, 0.01) * mean_df", "np.maximum(len(variances) - 1, 0.01) * mean_df", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive mixture: gradient's scale term sign", "metrics/variance_priors.py",
           "by_scale = -df / 2 +", "by_scale = df / 2 +", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive mixture: default rule one component", "metrics/variance_priors.py",
           'DEFAULT_RULE = "mixture"', 'DEFAULT_RULE = "moderated"', ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive mixture: the shared variance charged two parameters", "metrics/variance_priors.py",
           "-2 * shared_loglik + math.log(len(variances))", "-2 * shared_loglik + 2 * math.log(len(variances))", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive mixture: the shared variance's likelihood without its scale term", "metrics/variance_priors.py",
           "np.sum(-df / 2 * np.log(2 * shared) - df", "np.sum(-df / 2 * np.log(2) - df", ("tests/test_adaptive_seeds.py",)),
    Mutant("adaptive mixture: the shared variance's df of one caption", "metrics/variance_priors.py",
           "VariancePrior(float(df.sum()), math.sqrt(shared * unit)", "VariancePrior(float(df[0]), math.sqrt(shared * unit)",
           ("tests/test_adaptive_seeds.py",)),
    # adaptive seeds in stages (issue 54 item 2): each intermediate stage's share, the refit on all draws so far,
    # the fits with a df per caption
    Mutant("adaptive stages: an intermediate stage draws all of its need", "metrics/adaptive.py",
           "need = share * (2 * half / width) ** 2", "need = (2 * half / width) ** 2", STAGES_TESTS),
    Mutant("adaptive stages: the last decision at the intermediate share", "metrics/adaptive.py",
           "last = decision == self.stages - 2", "last = decision == self.stages - 1", STAGES_TESTS),
    Mutant("adaptive stages: another share", "metrics/adaptive.py", "STAGE_SHARE, LATER_SHARE = 0.35, 0.6",
           "STAGE_SHARE, LATER_SHARE = 0.5, 0.6",
           STAGES_TESTS),
    Mutant("adaptive stages: the former three by default", "metrics/adaptive.py", "DEFAULT_STAGES = 5", "DEFAULT_STAGES = 3",
           STAGES_TESTS),
    Mutant("adaptive stages: stein allowed more stages", "metrics/adaptive.py", 'if rule == "stein" and stages != 2:',
           'if rule == "stein" and stages == 2:', STAGES_TESTS),
    Mutant("adaptive stages: stein's default the others'", "metrics/adaptive.py",
           'return 2 if rule == "stein" else DEFAULT_STAGES', "return DEFAULT_STAGES", (*STAGES_TESTS, REWARD_STATISTICS)),
    Mutant("adaptive stages: the refit's df of the first stage", "metrics/adaptive.py",
           '[c["seeds"] - 1 for c in seen if name in c["sds"]]', '[self.seeds - 1 for c in seen if name in c["sds"]]',
           STAGES_TESTS),
    Mutant("adaptive stages: a decision's sd from the first stage's draws", "metrics/adaptive.py",
           "values = [r.get(name) for r in rows]\n", "values = [r.get(name) for r in rows[: self.seeds]]\n",
           STAGES_TESTS),
    Mutant("adaptive stages: a stopped caption's interval at the first stage's df", "metrics/adaptive.py",
           ".half_width(sd, len(r) - 1)", ".half_width(sd, self.seeds - 1)", STAGES_TESTS),
    Mutant("adaptive stages: a stopped caption's companion at the headline's half-width", "metrics/adaptive.py",
           "head if name == self.headline", "head if name != self.headline", STAGES_TESTS),
    Mutant("adaptive stages: a decision's need at the first stage's df", "metrics/adaptive.py",
           ".half_width(caption[self.headline], len(r) - 1)", ".half_width(caption[self.headline], self.seeds - 1)",
           STAGES_TESTS),
    Mutant("adaptive stages: a seed scored again at a later stage", "metrics/adaptive.py",
           "at_k = [i for i in open_ if had[i] <= k < want[i]]", "at_k = [i for i in open_ if k < want[i]]",
           STAGES_TESTS),
    Mutant("adaptive stages: later stages fitted per batch", "run/score.py",
           "for decision in range(max(part.stages for part in parts) - 1):", "for decision in range(1):",
           STAGES_TESTS),
    Mutant("adaptive stages: a stage's fit on the draws after it", "run/score.py",
           'StageDraws(part, f"stage {decision + 1} draws {i}", decision)',
           'StageDraws(part, f"stage {decision + 1} draws {i}", decision + 1)', STAGES_TESTS),
    Mutant("adaptive stages: pooled variance unweighted by df", "metrics/variance_priors.py",
           "math.fsum(d * (s / scale) ** 2 for", "math.fsum(1 * (s / scale) ** 2 for", STAGES_TESTS),
    Mutant("adaptive stages: the mixture's shared variance unweighted by df", "metrics/variance_priors.py",
           "shared = float(df @ variances / df.sum())", "shared = float(variances.mean())", STAGES_TESTS),
    Mutant("adaptive stages: the mixture's components at the mean df", "metrics/variance_priors.py",
           "float(df.mean()), df[None, :]", "float(df.mean()), float(df.mean())", STAGES_TESTS),
    Mutant("adaptive stages: the moderated fit's sampling variance at the mean df", "metrics/variance_priors.py",
           "math.fsum(float(polygamma(1, d / 2)) for _, d in seen) / len(seen)",
           "len(seen) * float(polygamma(1, math.fsum(d for _, d in seen) / len(seen) / 2)) / len(seen)", STAGES_TESTS),
    # adaptive seeds' one-component prior integrated over its (d0, s0) (issue 54 item 2: coverage where the fit
    # cannot know the spread)
    Mutant("adaptive integrated: the estimate plugged in again (one component not integrated)", "metrics/variance_priors.py",
           "return fit_integrated(sds, dfs) if one_component else mixture", "return mixture", STAGES_TESTS),
    Mutant("adaptive integrated: prior flat in logit B, not in B", "metrics/variance_priors.py",
           "return loglik + np.log(share * (1 - share))", "return loglik", STAGES_TESTS),
    Mutant("adaptive integrated: d0 = B / (1 - B) without the mean df in the likelihood", "metrics/variance_priors.py",
           "prior_df = mean_df * np.exp(logit)[:, None]", "prior_df = np.exp(logit)[:, None]", STAGES_TESTS),
    Mutant("adaptive integrated: d0 = B / (1 - B) without the mean df in the grid's points", "metrics/variance_priors.py",
           "prior_df = np.repeat(mean_df * np.exp(logit), FINE_GRID)[kept]",
           "prior_df = np.repeat(np.exp(logit), FINE_GRID)[kept]", STAGES_TESTS),
    Mutant("adaptive integrated: grid points' d0 and s0 paired wrongly", "metrics/variance_priors.py",
           "prior_df = np.repeat(mean_df", "prior_df = np.tile(mean_df", STAGES_TESTS),
    Mutant("adaptive integrated: the likelihood of one caption, not all", "metrics/variance_priors.py",
           "prior_var).sum(axis=2) for part in chunks)", "prior_var).max(axis=2) for part in chunks)", STAGES_TESTS),
    Mutant("adaptive integrated: the likelihood's last chunk of captions left out", "metrics/variance_priors.py",
           "for at in range(0, len(scaled), LIKELIHOOD_CHUNK))", "for at in range(0, len(scaled) - LIKELIHOOD_CHUNK, LIKELIHOOD_CHUNK))",
           ("tests/test_adaptive_stages.py::test_the_integrated_prior_takes_every_caption_whatever_its_likelihood_chunk",
            "tests/test_adaptive_stages.py")),
    # an adaptive number of stages (issue 54 item 2): met captions stop, later shares, the run's passes end
    Mutant("adaptive stages: a caption already met goes on to the last decision", "metrics/adaptive.py",
           "done = last or head is None or need <= len(r)", "done = last or head is None", STAGES_TESTS),
    Mutant("adaptive stages: a caption stops only when it needs fewer than it has", "metrics/adaptive.py",
           "done = last or head is None or need <= len(r)", "done = last or head is None or need < len(r)",
           STAGES_TESTS),
    Mutant("adaptive stages: later decisions at another share", "metrics/adaptive.py",
           "STAGE_SHARE, LATER_SHARE = 0.35, 0.6", "STAGE_SHARE, LATER_SHARE = 0.35, 0.5", STAGES_TESTS),
    Mutant("adaptive stages: later decisions at the first decision's share", "metrics/adaptive.py",
           "return STAGE_SHARE if decision == 0 else LATER_SHARE", "return STAGE_SHARE", STAGES_TESTS),
    Mutant("adaptive stages: a stopped caption's interval from the last prior fitted", "metrics/adaptive.py",
           "else priors[decision][name].half_width(", "else priors[-1][name].half_width(", STAGES_TESTS),
    Mutant("adaptive stages: every caption reported open to the run's fit", "metrics/adaptive.py",
           '"open": still}}', '"open": True}}', STAGES_TESTS),
    Mutant("adaptive stages: a prior fitted after every caption has stopped", "metrics/adaptive.py",
           "        if self.deciding:\n            self.priors.append", "        if True:\n            self.priors.append",
           STAGES_TESTS),
    Mutant("adaptive stages: the run's passes go on after every caption has stopped", "run/score.py",
           "fitting = [part for part in fitting if part.deciding]", "fitting = [part for part in fitting if True]",
           STAGES_TESTS),
    Mutant("adaptive integrated: the grid's mass kept inverted", "metrics/variance_priors.py",
           "np.cumsum(weights[order]), 1 - GRID_MASS)", "np.cumsum(weights[order]), GRID_MASS)", STAGES_TESTS),
    Mutant("adaptive integrated: fine grid's box without the coarse posterior's reach", "metrics/variance_priors.py",
           "coarse >= coarse.max() - GRID_SPAN", "coarse >= coarse.max()", STAGES_TESTS),
    Mutant("adaptive integrated: the quantile's mixture weights ignored", "metrics/variance_priors.py",
           "float(weights @ (2 * stdtr(", "float(np.mean(2 * stdtr(", STAGES_TESTS),
    Mutant("adaptive integrated: one df's t quantiles held for every df", "metrics/variance_priors.py",
           "quantiles = self.quantiles.get((df, level))", "quantiles = self.quantiles.get((2, level))", STAGES_TESTS),
    Mutant("seeds: a run of one caption ranked", "stats/seeds.py", "if by is None and len(rows) < 2:",
           "if by is None and len(rows) < 1:", ("tests/test_bad_inputs.py",)),
    # the guards as TRL reward functions: tokens when TRL gives them, the rule of `Guards`
    Mutant("TRL guard ignores completion_ids", "rewards.py", "        if completion_ids is not None:\n",
           "        if False:\n", ("tests/test_trl_guards.py",)),
    Mutant("TRL length guard gives the repetition term", "rewards.py", 'if self.__name__ == "length":',
           'if self.__name__ != "length":', ("tests/test_trl_guards.py",)),
    Mutant("guard repetition share over distinct n-grams inverted", "apps/reward/guards.py",
           "return 1.0 - len(set(grams)) / len(grams) if grams", "return len(set(grams)) / len(grams) if grams",
           ("tests/test_trl_guards.py",)),
    # the reward service and its clients: rows answered apart, limits, the token, the callers' protocols
    Mutant("service: a batch's second request gets the first's rows", "apps/reward/service.py",
           "values[start:stop]", "values[:stop - start]", ("tests/test_serve.py",)),
    Mutant("service: a bad cell's row counted from the batch's start", "apps/reward/service.py",
           "known_bad = {start + row for", "known_bad = {row for", ("tests/test_serve.py",)),
    Mutant("service: a wrong bearer token let in", "apps/reward/service.py",
           'if scheme.lower() != "bearer" or not hmac', 'if scheme.lower() != "bearer" and not hmac', ("tests/test_serve.py",)),
    Mutant("service: a declared body length over the limit read", "apps/reward/service.py",
           "        if int(declared) > self.settings.max_body_bytes:", "        if False:", ("tests/test_serve.py",)),
    # bad input on the training path (a review of the reward service's inputs): each guard and the test it failed
    Mutant("service: a streamed body read past its limit", "apps/reward/service.py", "            if size > limit:",
           "            if False:", ("tests/test_serve.py::test_a_body_over_the_limit_is_read_no_further_than_the_limit",)),
    Mutant("service: a Content-Length that is no number reaches int()", "apps/reward/service.py",
           "        if not declared.strip().isdigit():", "        if False:",
           ("tests/test_serve.py::test_deep_json_and_a_content_length_that_is_no_number_are_refused",)),
    Mutant("service: a ValueError of the JSON parser not answered", "apps/reward/service.py",
           "    except ValueError as exc:  # not JSON", "    except json.JSONDecodeError as exc:  # not JSON",
           ("tests/test_serve.py::test_deep_json_and_a_content_length_that_is_no_number_are_refused",)),
    Mutant("service: deep JSON's RecursionError not answered", "apps/reward/service.py", "    except RecursionError:",
           "    except ZeroDivisionError:", ("tests/test_serve.py::test_deep_json_and_a_content_length_that_is_no_number_are_refused",)),
    Mutant("service: a caption that is not text keeps the empty reward", "apps/reward/service.py",
           "                        values[row] = None", "                        pass",
           ("tests/test_serve.py::test_a_caption_that_is_not_text_gets_no_reward",)),
    Mutant("service: a broken metric contract answered as retryable", "apps/reward/service.py",
           "        except MetricContractError as exc:", "        except ZeroDivisionError as exc:",
           ("tests/test_serve.py::test_a_metric_that_breaks_its_contract_on_the_server_raises_at_once_as_in_process",)),
    Mutant("service: a failure's message answered unmasked", "apps/reward/service.py",
           'return 500, {"error": redact_text(f"{type(exc).__name__}: {exc}"), "kind": "internal"}',
           'return 500, {"error": (f"{type(exc).__name__}: {exc}"), "kind": "internal"}',
           ("tests/test_serve.py::test_any_other_failure_is_answered_redacted_and_retried",)),
    Mutant("service: OpenRLHF prompts read per character", "apps/reward/service.py",
           "    if not isinstance(prompts, list) or not isinstance(labels, list):", "    if False:",
           ("tests/test_serve.py::test_openrlhf_prompts_or_labels_that_are_not_lists_are_refused",)),
    Mutant("serve: a token no client can send accepted", "apps/reward/serve.py",
           "if token and (problem := token_problem(token)):", 'if token and (problem := token_problem("")):',
           ("tests/test_serve.py::test_a_server_token_no_client_can_send_is_refused_before_anything_starts",)),
    Mutant("serve command: a --token-env naming an unset variable serves open", "cli/serve.py",
           "    if args.token_env and token is None:", "    if False:",
           ("tests/test_serve.py::test_a_token_env_named_but_unset_is_refused_before_serving",)),
    Mutant("wire: an empty encoded cell passed on with its name", "apps/reward/wire.py", "    if not data:  #",
           "    if False:  #", ("tests/test_serve.py::test_an_empty_encoded_cell_never_opens_the_file_its_name_names",)),
    Mutant("wire: a path's lone surrogate reaches the file system", "apps/reward/wire.py",
           "(kind, value if kind == PATH else None)", "(kind, None)",
           ("tests/test_serve.py::test_a_path_or_name_no_file_system_takes_is_an_error_of_its_row",)),
    Mutant("wire: a name's lone surrogate or NUL passed on", "apps/reward/wire.py", "(NAME, name)):", "(NAME, None)):",
           ("tests/test_serve.py::test_a_path_or_name_no_file_system_takes_is_an_error_of_its_row",)),
    Mutant("wire: NUL taken for a character", "apps/reward/wire.py", 'if "\\x00" in text else', 'if "\\x00" in "" else',
           ("tests/test_serve.py::test_a_path_or_name_no_file_system_takes_is_an_error_of_its_row",)),
    Mutant("wire: pictures over PIL's pixel limit decoded", "apps/reward/wire.py",
           "    if limit and width * height > limit:", "    if False:",
           ("tests/test_serve.py::test_garbage_and_decompression_bombs_are_row_errors_that_say_why",)),
    Mutant("wire: encoded bytes not identified before scoring", "apps/reward/wire.py",
           "    pixels_within_limit(kind, data)\n", "    None\n",
           ("tests/test_serve.py::test_garbage_and_decompression_bombs_are_row_errors_that_say_why",)),
    Mutant("wire: a token with a space taken", "apps/reward/wire.py", 'if not "!" <= char <= "~":',
           'if not " " <= char <= "~":',
           ("tests/test_serve.py::test_the_client_refuses_url_credentials_and_unsendable_tokens_without_showing_them",)),
    Mutant("wire: a client's file read whole, whatever it is", "apps/reward/wire.py",
           "        data = read_image_file(picture)", "        data = Path(picture).read_bytes()",
           ("tests/test_serve.py::test_a_picture_file_the_client_cannot_read_is_a_row_without_reward_as_in_process",)),
    Mutant("client: a picture it cannot read stops the call", "apps/reward/remote.py",
           "            except SampleError as exc:", "            except ZeroDivisionError as exc:",
           ("tests/test_serve.py::test_a_picture_file_the_client_cannot_read_is_a_row_without_reward_as_in_process",)),
    Mutant("client: a URL's user:password@ let through", "apps/reward/remote.py",
           "        if urllib.parse.urlsplit(url).username is not None:", "        if False:",
           ("tests/test_serve.py::test_the_client_refuses_url_credentials_and_unsendable_tokens_without_showing_them",)),
    Mutant("client: a token no header can carry let through", "apps/reward/remote.py",
           "(problem := token_problem(self.token))", '(problem := token_problem(""))',
           ("tests/test_serve.py::test_the_client_refuses_url_credentials_and_unsendable_tokens_without_showing_them",)),
    Mutant("client: a redirect followed, the token with it", "apps/reward/remote.py",
           "urllib.request.build_opener(_NoRedirect).open(", "urllib.request.build_opener().open(",
           ("tests/test_serve.py::test_a_redirect_is_not_followed_so_the_token_goes_nowhere_else",)),
    Mutant("client: an answer's part of fewer values summed", "apps/reward/remote.py",
           "or len(values) != rows:", "or len(values) > rows:",
           ("tests/test_serve.py::test_an_answer_not_shaped_as_reward_parts_is_refused",)),
    Mutant("client: an answer's NaN summed", "apps/reward/remote.py", "or not math.isfinite(value)):",
           "or not math.isfinite(0.0)):", ("tests/test_serve.py::test_a_nan_or_a_page_that_is_not_json_is_refused",)),
    Mutant("client: an answer's boolean summed", "apps/reward/remote.py", "(isinstance(value, bool) or",
           "(False or", ("tests/test_serve.py::test_an_answer_not_shaped_as_reward_parts_is_refused",)),
    Mutant("client: a page that is not JSON raises raw", "apps/reward/remote.py",
           "    except ValueError:  # a proxy's", "    except ZeroDivisionError:  # a proxy's",
           ("tests/test_serve.py::test_a_nan_or_a_page_that_is_not_json_is_refused",)),
    Mutant("service: a model object's text made after the manifest is redacted", "apps/reward/service.py",
           "return redact(json.loads(json.dumps(self.settings.manifest, default=str)))",
           "return json.loads(json.dumps(redact(self.settings.manifest), default=str))",
           ("tests/test_serve.py::test_the_manifest_masks_a_key_in_the_text_of_a_model_given_as_an_object",)),
    Mutant("manifest: an object's text left unredacted", "run/folder.py",
           "json.dumps(_finite(redact(plain)),", "json.dumps(_finite(plain),",
           ("tests/test_redaction.py::test_a_manifest_masks_a_key_in_the_text_of_an_object_it_holds",)),
    Mutant("serve: no word of an open service on the network", "apps/reward/serve.py",
           "    if not token and not loopback(host):", "    if not token and loopback(host):", ("tests/test_serve.py::test_serving_beyond_this_machine_without_a_token_is_warned_of",)),
    Mutant("serve: a private address taken for this machine", "apps/reward/serve.py",
           "ipaddress.ip_address(host).is_loopback", "ipaddress.ip_address(host).is_private", ("tests/test_serve.py::test_serving_beyond_this_machine_without_a_token_is_warned_of",)),
    Mutant("write_file follows a link planted at its path", "core/paths.py",
           '| os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)', '| os.O_TRUNC | getattr(os, "O_NOFOLLOW_", 0)',
           ("tests/test_security.py::test_write_file_never_writes_through_a_link_at_its_path",)),
    Mutant("service: a file sent by its path scored as bare bytes, another seed", "apps/reward/service.py",
           'return {"bytes": data, "path": path}', "return data",
           ("tests/test_serve.py::test_a_file_sent_by_its_path_is_named_as_in_process_so_seeded_rewards_agree",)),
    Mutant("service: a file under the root decoded whatever its pixels", "apps/reward/service.py",
           "            pixels_within_limit(PATH, data)", "            None",
           ("tests/test_serve.py::test_a_file_under_the_root_over_the_pixel_limit_is_an_error_of_its_row",)),
    Mutant("serve: a NaN `missing` taken", "apps/reward/serve.py", '    check_number("missing", missing)\n',
           "    pass\n", ("tests/test_serve.py::test_serve_from_python_refuses_what_the_command_line_refuses",)),
    Mutant("serve: a byte limit of 0 taken for the default", "apps/reward/serve.py", "check_count(name, value, 1)",
           "check_count(name, value, 0)", ("tests/test_serve.py::test_serve_from_python_refuses_what_the_command_line_refuses",)),
    Mutant("client: retries unbounded", "apps/reward/remote.py",
           'check_count("RemoteReward: retries", retries, 0, MAX_RETRIES)',
           'check_count("RemoteReward: retries", retries, 0, None)', ("tests/test_serve.py::test_the_clients_refuse_settings_that_would_fail_later",)),
    Mutant("verl: a NaN `missing` taken", "apps/reward/remote.py",
           'float(check_number("verl reward: missing", missing))', "float(missing)", ("tests/test_serve.py::test_the_clients_refuse_settings_that_would_fail_later",)),
    Mutant("serve command: --allow-plugins dropped", "cli/serve.py",
           "    settings = run_settings(args)  # with allow_plugins",
           '    settings = run_settings(args); settings.pop("allow_plugins")  # with allow_plugins',
           ("tests/test_serve.py::test_allow_plugins_reaches_the_reward_a_config_file_names_plugins_for",)),
    Mutant("checks: a numpy bool given numpy advice", "core/checks.py",
           'or isinstance(value.item(), bool):', 'or isinstance(value.item(), str):',
           ("tests/test_reward_inputs.py::test_a_numpy_number_is_refused_with_what_to_give_instead",)),
    Mutant("checks: a numpy number refused without advice", "core/checks.py",
           '    if type(value).__module__ != "numpy" or', '    if type(value).__module__ != "numpy_" or',
           ("tests/test_reward_inputs.py::test_a_numpy_number_is_refused_with_what_to_give_instead",)),
    Mutant("service: a replica's handlers left unmasked", "apps/reward/serve.py",
           "    logging.basicConfig(level=logging.WARNING)\n    install_log_filter()\n",
           "    logging.basicConfig(level=logging.WARNING)\n",
           ("tests/test_serve.py::test_a_replica_masks_secrets_in_every_record_it_logs",)),
    Mutant("client: a configuration the server cannot score retried", "apps/reward/remote.py",
           "or kind == CONFIG_KIND:", "or kind == CONTRACT_KIND:",
           ("tests/test_serve.py::test_a_configuration_the_server_cannot_score_is_refused_once_not_retried",)),
    Mutant("service: a configuration error answered as retryable", "apps/reward/service.py",
           "        except ConfigError as exc:", "        except ZeroDivisionError as exc:",
           ("tests/test_serve.py::test_a_configuration_the_server_cannot_score_is_refused_once_not_retried",)),
    Mutant("client: a broken metric contract retried", "apps/reward/remote.py", "if kind == CONTRACT_KIND:",
           "if kind == CONFIG_KIND:",
           ("tests/test_serve.py::test_a_metric_that_breaks_its_contract_on_the_server_raises_at_once_as_in_process",)),
    Mutant("wire: image limit unchecked", "apps/reward/wire.py", "    if len(data) > max_bytes:", "    if False:", ("tests/test_serve.py",)),
    Mutant("wire: a picture sent as held, not upright", "apps/reward/wire.py",
           'decode_image(picture, "the image given").save(', "picture.save(", ("tests/test_serve.py",)),
    Mutant("OpenRLHF: the prompt left in the caption", "apps/reward/service.py",
           "q[len(p):] if isinstance(q, str)", "q if isinstance(q, str)", ("tests/test_serve.py",)),
    # named alone: the test that asserts a refused request is sent once (others reaching it pass, retrying)
    Mutant("client: a refused request retried", "apps/reward/remote.py", "if exc.code < 500 or", "if exc.code < 400 or",
           ("tests/test_serve.py::test_bearer_token_is_checked_and_never_shown",)),
    Mutant("verl: the picture taken from ground_truth only", "apps/reward/remote.py",
           "        if isinstance(extra_info, Mapping) and extra_info.get(self.image_key) is not None:",
           "        if False:", ("tests/test_serve.py",)),
    # the store for training: keep policies and the size cap (oldest first, down to 90 %)
    Mutant("store keep: a record-only image found without records", "store/images.py",
           "                if records and (checksum is None", "                if (checksum is None",
           ("tests/test_keep.py",)),
    Mutant("store keep: vectors writes the picture", "store/images.py",
           '        if self.keep != "images":\n            return self._put_records',
           '        if self.keep == "none":\n            return self._put_records', ("tests/test_keep.py",)),
    Mutant("size cap prunes to the cap, not below it", "store/cap.py",
           "goal = self.max_size * CAP_LOW_WATER", "goal = self.max_size", ("tests/test_keep.py",)),
    Mutant("size cap deletes the newest first", "store/cap.py",
           'FROM results ORDER BY created")]', 'FROM results ORDER BY created DESC")]', ("tests/test_keep.py",)),
    Mutant("size cap: at the cap counts as over it", "store/cap.py",
           "            if total > self.max_size:", "            if total >= self.max_size:", ("tests/test_keep.py",)),
    # issue 53: under --keep vectors a claim lasts until what a waiter reads (the embedding) is written
    Mutant("vectors: a picture's claim goes with its record inside a metric's batch", "store/images.py",
           'with_rows = [] if self.keep == "vectors" and self._keep_past_write(release) else release',
           "with_rows = release", ("tests/test_keep.py",)),
    Mutant("vectors: a record another store still claims counts as there", "store/images.py",
           "for key in self.claimed_elsewhere(records_only):", "for key in self.claimed_elsewhere([]):",
           ("tests/test_keep.py",)),
    Mutant("a store waits on another's claim keeping its own", "reconstruct/reconstructor.py",
           "                if time.monotonic() - waiting_since >= self.KEPT_PATIENCE_S:\n                    self.store.release_kept()",
           "                if False:\n                    self.store.release_kept()", ("tests/test_keep.py",)),
    Mutant("a store waiting on another's claim lets its own go at once", "reconstruct/reconstructor.py",
           "if time.monotonic() - waiting_since >= self.KEPT_PATIENCE_S:", "if time.monotonic() - waiting_since >= 0:",
           ("tests/test_keep.py",)),
    Mutant("a rollback with no transaction open turns Ctrl-C into an sqlite error", "core/transactions.py",
           "        if db.in_transaction:\n            db.execute(\"ROLLBACK\")", "        db.execute(\"ROLLBACK\")",
           ("tests/test_store.py",)),
    Mutant("a COMMIT that fails is left open, not rolled back", "core/transactions.py",
           '        yield db\n        db.execute("COMMIT")  # inside: a COMMIT that fails (a deferred constraint, a busy '
           'database) is rolled back\n    except BaseException:\n        if db.in_transaction:\n            '
           'db.execute("ROLLBACK")\n        raise',
           '        yield db\n    except BaseException:\n        if db.in_transaction:\n            '
           'db.execute("ROLLBACK")\n        raise\n    db.execute("COMMIT")',
           ("tests/test_store.py::test_a_commit_that_fails_is_rolled_back_and_leaves_no_transaction_open",
            "tests/test_store.py")),
    Mutant("kept claims are not renewed", "store/leases.py", "keys = list(store._held | store._kept)",
           "keys = list(store._held)", ("tests/test_keep.py",)),
    Mutant("kept claims stay held after the block", "store/leases.py",
           "            if last:\n                self.release_kept()", "            if False:\n                self.release_kept()",
           # its killing test named alone: under it, test_keep.py's later tests each wait out the kept claims'
           # leases, and the whole file outran the 600 s a run may take
           ("tests/test_keep.py::test_claims_on_pictures_not_kept_last_until_the_block_that_made_them_ends",)),
    # its killing test named alone: under it, an earlier test's rerun waits out its own kept claims' leases (240 s)
    Mutant("kept claims under write_behind never released", "store/leases.py",
           "            self._drain_behind(keys)", "            pass",
           ("tests/test_keep.py::test_claims_on_pictures_not_kept_last_until_the_block_that_made_them_ends",)),
    Mutant("a metric's batch keeps no claim", "run/local.py",
           "        with self.ctx.store.keeping_claims():\n            return isolated(rows, items, self.watch)",
           "        return isolated(rows, items, self.watch)", ("tests/test_keep.py",)),
    Mutant("a metric's batch of pairs keeps no claim", "run/local.py",
           "        with self.ctx.store.keeping_claims():  # as in `score`\n            return isolated(rows, list(pairs), self.watch)",
           "        return isolated(rows, list(pairs), self.watch)", ("tests/test_keep.py",)),
    # merge (issue 51 items 12 and 16): an id held twice is refused; a wrong --input is refused whatever the
    # metrics; the merged folder gets score's reports
    Mutant("merge refuses an id held twice -> thrice", "run/shards.py",
           "holders.items() if len(folders) > 1}", "holders.items() if len(folders) > 2}", ("tests/test_scale.py",)),
    Mutant("merge checks --input only when a metric pools", "run/shards.py",
           'first.get("image_root")) if samples is not None else None',
           'first.get("image_root")) if pooled and samples is not None else None', ("tests/test_scale.py",)),
    Mutant("merge writes no report.html", "run/shards.py",
           '    write_reports(out_dir, records, summary, manifest.get("metric_names") or summarised)', "    pass",
           ("tests/test_scale.py",)),
    # cache verify on a damaged index (issue 51 item 17): one line naming the file, exit 1
    Mutant("cache verify on a damaged index exits 0", "cli/cache.py",
           '"(the rest is recomputed when next needed)", file=sys.stderr)\n        return 1',
           '"(the rest is recomputed when next needed)", file=sys.stderr)\n        return 0', ("tests/test_store.py",)),
    Mutant("a folder for an index is not named as one", "store/maintenance.py", "    if not index.is_file():  # SQLite",
           "    if False:  # SQLite", ("tests/test_store.py",)),
    # the cache commands' writes in one transaction each, rolled back when stopped part way (the old layouts:
    # BEGIN and COMMIT written by hand), and keys read from an index never naming a file outside the cache
    *[Mutant(name, file, original, mutated, ("tests/test_store_maintenance.py",)) for name, file, original, mutated in (
        ("maintenance: verify --repair's writes begun and committed by hand", "store/maintenance.py",
         '        with store.transaction() as db:\n            sql.delete_results(db, bad_keys)\n'
         '            db.executemany("UPDATE results SET checksum = ?, file_checksum = ?, '
         'file_size = ? WHERE key = ?", backfill)\n            db.execute("DELETE FROM claims WHERE expires < ?", (now,))',
         '        db.execute("BEGIN IMMEDIATE")\n        sql.delete_results(db, bad_keys)\n'
         '        db.executemany("UPDATE results SET checksum = ?, file_checksum = ?, '
         'file_size = ? WHERE key = ?", backfill)\n        db.execute("DELETE FROM claims WHERE expires < ?", (now,))\n'
         '        db.execute("COMMIT")'),
        ("maintenance: prune's delete begun and committed by hand", "store/maintenance.py",
         '    with store.transaction() as db:\n        sql.delete_results(db, sorted(doomed))',
         '    db.execute("BEGIN IMMEDIATE")\n    sql.delete_results(db, sorted(doomed))\n    db.execute("COMMIT")'),
        ("maintenance: prune empties the thumbnails before its transaction", "store/maintenance.py",
         "        return report\n    with store.transaction() as db:",
         "        return report\n    [path.unlink() for path, _ in thumbs]\n    with store.transaction() as db:"),
        ("maintenance: merge's models outside its transaction, its results begun and committed by hand",
         "store/maintenance.py",
         '            with target.transaction() as out:\n                sql.insert_rows(out, "models", '
         '"fingerprint, description",\n                                db.execute("SELECT fingerprint, description '
         'FROM models").fetchall(),\n                                on_conflict="IGNORE")\n'
         '                sql.insert_rows(out, "results", sql.RESULT_COLUMNS, batch, on_conflict="IGNORE")',
         '            sql.insert_rows(out, "models", "fingerprint, description",\n'
         '                            db.execute("SELECT fingerprint, description FROM models").fetchall(),\n'
         '                            on_conflict="IGNORE")\n'
         '            out.execute("BEGIN")\n'
         '            sql.insert_rows(out, "results", sql.RESULT_COLUMNS, batch, on_conflict="IGNORE")\n'
         '            out.execute("COMMIT")'),
        ("maintenance: merge replaces the target's description of a model", "store/maintenance.py",
         'FROM models").fetchall(),\n                                on_conflict="IGNORE")',
         'FROM models").fetchall(),\n                                on_conflict="REPLACE")'),
        ("maintenance: an insert told to keep the row there replaces it", "store/sql.py",
         'db.execute(f"INSERT OR {on_conflict} INTO', 'db.execute(f"INSERT OR REPLACE INTO'),
        ("maintenance: an insert's conflict rule goes into the SQL unchecked", "store/sql.py",
         "    if on_conflict not in ON_CONFLICT:", "    if False:"),
        ("maintenance: a rebuild reads the new index's columns by a wrong name", "store/maintenance.py",
         'for c in sql.RESULT_COLUMNS.split(", "))', 'for c in sql.RESULT_COLUMNS.split(","))'),
        ("maintenance: merge keeps the files it copied for a source that failed", "store/maintenance.py",
         "            for destination in copied_files:  # no index row names them: they would be orphans\n"
         "                destination.unlink(missing_ok=True)",
         "            for destination in copied_files:  # no index row names them: they would be orphans\n"
         "                pass"),
        ("maintenance: merge checks each source only when it comes to it", "store/maintenance.py",
         "    for root in roots:  # every source and the target checked before anything is copied",
         "    for root in roots[:1]:  # every source and the target checked before anything is copied"),
        ("maintenance: merge into a file left to mkdir's traceback", "store/maintenance.py",
         "    if Path(into).exists() and not Path(into).is_dir():", "    if False:"),
        ("maintenance: a rebuild moves the damaged index aside before the new one is whole", "store/maintenance.py",
         "    rows = _readable_rows(index)\n    fresh = index.with_name(INDEX + \".rebuilding\")",
         "    rows = _readable_rows(index)\n    _move_with_logs(index, index.with_name(f\"{INDEX}.damaged-early\"))\n"
         "    fresh = index.with_name(INDEX + \".rebuilding\")"),
        ("maintenance: a rebuild stopped part way leaves its half-built index", "store/maintenance.py",
         "        db.close()\n        _remove_with_logs(fresh)\n        raise",
         "        db.close()\n        raise"),
        ("maintenance keys: a leading dot names a file", "store/images.py",
         'FILE_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")', 'FILE_KEY = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*")'),
        ("maintenance keys: a slash names a file", "store/images.py",
         'FILE_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")', 'FILE_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")'),
        ("maintenance keys: image_path takes any key", "store/images.py",
         "        if problem:\n            raise ValueError", "        if False:\n            raise ValueError"),
        ("maintenance keys: verify checks an unsafe key's file", "store/maintenance.py",
         "            if key_problem(key):\n                report[\"unsafe_keys\"]",
         "            if False:\n                report[\"unsafe_keys\"]"),
        ("maintenance keys: verify --repair deletes an unsafe key's file", "store/maintenance.py",
         "        for key in bad_keys:\n            if key_problem(key) is None:",
         "        for key in bad_keys:\n            if True:"),
        ("maintenance keys: prune deletes an unsafe key's file", "store/maintenance.py",
         "    for key in doomed:\n        if key_problem(key) is None:  # a key no picture",
         "    for key in doomed:\n        if True:  # a key no picture"),
        ("maintenance keys: merge copies an unsafe key's file", "store/maintenance.py",
         "                    if key_problem(key):  # it could name a file outside either store",
         "                    if False:  # it could name a file outside either store"),
        ("maintenance keys: the size cap deletes an unsafe key's file", "store/cap.py",
         "            if key_problem(key) is None:  # a key no picture", "            if True:  # a key no picture"),
    )],
    # a completion that is not valid Unicode (a lone surrogate) on the training path: None, named, never at a model
    *[Mutant(name, file, original, mutated, ("tests/test_reward_inputs.py",)) for name, file, original, mutated in (
        ("reward unicode: a lone surrogate passes as text", "core/records.py",
         '        text.encode("utf-8")\n', '        text.encode("utf-8", "surrogatepass")\n'),
        ("reward unicode: a broken caption reaches the models", "apps/reward/__init__.py",
         "None if empty[i] or i in broken else", "None if empty[i] else"),
        ("reward unicode: the served row error left out", "apps/reward/__init__.py",
         'why = (f"caption {broken[row]}" if row in broken else', 'why = (f"caption {broken[row]}" if False else'),
        ("reward inputs: a cache folder that is a file passes for a read-only cache", "run/config.py",
         "            if folder is not None and Path(folder).exists() and not Path(folder).is_dir():",
         "            if False:"),
    )],
    # a module:Class metric goes through the plug-in trust check (issue 50 item 8)
    Mutant("module:Class metrics skip the plug-in trust check", "metrics/__init__.py",
           "found = registry.import_plugin(name)",
           'found = getattr(__import__(name.split(":")[0], fromlist=["_"]), name.split(":")[1])',
           ("tests/test_open_metrics.py",)),
    # failures explained (issue 51 item 23): a server's failure says how to go on; a foreign error keeps its type
    Mutant("a model server's failure loses its advice", "run/failures.py",
           'return f"the model server failed: {text}; {RESUME_AFTER_SERVER}"', 'return text',
           ("tests/test_messages.py",)),
    Mutant("a server's failure counted under its client's class", "run/failures.py",
           '    if isinstance(exc, ServerError):  # the server\'s failure, whichever client class said it',
           '    if False:  # the server\'s failure, whichever client class said it', ("tests/test_messages.py",)),
    Mutant("an unexpected error loses its type", "run/failures.py",
           '(an unexpected {type(exc).__name__} inside the model or metric',
           '(an unexpected error inside the model or metric',
           ("tests/test_messages.py",)),
    # a module:Class in the working folder says PYTHONPATH is what is missing (issue 51 item 15)
    Mutant("a missing plug-in module gives no PYTHONPATH advice", "models/registry.py",
           "if exc.name and module.split(\".\")[0] == exc.name else \"\")", "if False else \"\")",
           ("tests/test_docs.py::test_a_user_metric_in_the_working_folder_needs_pythonpath",)),
    # a resumed refinement ends as the uninterrupted one (issue 51 item 22)
    Mutant("refine resume keeps the line a kill cut", "apps/refine/resume.py",
           'whole = text[: text.rfind("\\n") + 1]  # a kill', "whole = text  # a kill", ("tests/test_refine.py",)),
    Mutant("refine resume redoes a round a caption finished", "apps/refine/run.py",
           'return last["round"] < round_no and last["accepted"]',
           'return last["round"] <= round_no and last["accepted"]',
           ("tests/test_refine.py",)),
    # CapArena's model level as the paper computes it (issue 50, item 5)
    Mutant("CapArena people's Elo counts skip and bad as ties", "apps/metabench/caparena.py",
           'kept = [it for it in items if it.verdict in (*it.systems, "equal", "")]', "kept = list(items)",
           ("tests/test_metabench.py",)),
    Mutant("model-level Kendall interval from Spearman", "stats/elo.py",
           "result.kendall_ci = bootstrap_ci(lambda i: agreement(i).kendall,",
           "result.kendall_ci = bootstrap_ci(lambda i: agreement(i).spearman,", ("tests/test_metabench.py",)),
    Mutant("CapArena published human ranking read upside down", "apps/metabench/caparena.py",
           "return {m: -float(k) for k, m in enumerate(PUBLISHED_HUMAN_RANKING, 1)",
           "return {m: float(k) for k, m in enumerate(PUBLISHED_HUMAN_RANKING, 1)", ("tests/test_metabench.py",)),
    Mutant("CapArena human ranking recomputed by default on the command line", "cli/meta.py",
           '"--human-ranking", choices=HUMAN_RANKINGS, default="published"',
           '"--human-ranking", choices=HUMAN_RANKINGS, default="recomputed"', ("tests/test_metabench.py",)),
    Mutant("CapArena human ranking recomputed by default in caprecon.meta", "apps/metabench/meta.py",
           '    human_ranking: str = "published",\n', '    human_ranking: str = "recomputed",\n',
           ("tests/test_metabench.py",)),
    Mutant("CapArena model-level rows' sampling ignores the human ranking", "apps/metabench/__init__.py",
           "sampling = CAPARENA_MODEL_SAMPLING[human_ranking]", "sampling = self.sampling",
           ("tests/test_metabench.py",)),
    # benchmark images confined to their root (issue 51, item 2)
    Mutant("a benchmark's images unconfined without --images", "data/judgments.py",
           "(self.confined or images_root is not None)", "(self.confined and images_root is not None)",
           ("tests/test_loader_inputs.py",)),
    Mutant("one's own judgments file confined without --images", "data/judgments.py",
           "    return Judgments(fmt, items, path, confined=False)", "    return Judgments(fmt, items, path)",
           ("tests/test_loader_inputs.py",)),
    Mutant("meta scores a refused row's image", "apps/metabench/scoring.py",
           "if s.image is not None and i not in refused]", "if s.image is not None]",
           ("tests/test_loader_inputs.py",)),
    Mutant("bootstrap τ on no scored row", "stats/bootstrap.py", "    if not len(x):  # every row failed",
           "    if False:  # every row failed", ("tests/test_loader_inputs.py",)),
    # CapArena files (issue 51, item 9)
    Mutant("CapArena winner outside the labels read as a tie", "data/loaders/caparena.py",
           "if winner not in (a, b, *NO_WINNER):", "if not winner:", ("tests/test_loader_inputs.py",)),
    Mutant("CapArena repeated battle kept", "data/loaders/caparena.py", "        if key in seen:",
           "        if key is None:", ("tests/test_loader_inputs.py",)),
    Mutant("CapArena model against itself kept", "data/loaders/caparena.py", "        if a == b:",
           "        if a is None:", ("tests/test_loader_inputs.py",)),
    Mutant("CapArena model level on two models", "apps/metabench/caparena.py", "MIN_MODELS = 3", "MIN_MODELS = 2",
           ("tests/test_loader_inputs.py",)),
    Mutant("CapArena file of ties read", "apps/metabench/caparena.py",
           "if all(it.preference == 0.5 for it in kept):", "if all(it.preference == 0.0 for it in kept):",
           ("tests/test_loader_inputs.py",)),
    # EXPERT and Pascal-50S field types (issue 51, item 10)
    Mutant("a NaN human score read", "data/loaders/common.py", "(finite or not math.isnan(number))",
           "(False or not math.isnan(number))", ("tests/test_loader_inputs.py",)),
    Mutant("a JSON reference list given as text read", "data/loaders/common.py",
           "if isinstance(value, str) and written:", "if isinstance(value, str):", ("tests/test_loader_inputs.py",)),
    Mutant("a caption that is a number read", "data/loaders/common.py", "    if not isinstance(value, str):\n",
           "    if value is None:\n", ("tests/test_loader_inputs.py",)),
    Mutant("an unknown Pascal-50S category ignored", "data/loaders/pascal50s.py",
           "for c in data if c not in PASCAL_CATEGORIES]", "for c in data if c not in data]",
           ("tests/test_loader_inputs.py",)),
    # meta --fit and verify (issue 51, items 18, 19)
    Mutant("meta --fit lets infinite scores through", "apps/metabench/fit.py", "np.flatnonzero(np.isinf(values))",
           "np.flatnonzero(np.isnan(values))", ("tests/test_fit.py",)),
    Mutant("verify asks for the scores of a part the file lacks", "apps/metabench/verify.py",
           "if key in PART_KEYS and", "if key in () and", ("tests/test_loader_inputs.py",)),
    Mutant("meta verify --fit accepted", "apps/metabench/meta.py", "    if fitting:", "    if False:",
           ("tests/test_loader_inputs.py",)),
    # cttd import (issue 51, item 20)
    Mutant("cttd import keeps a question whose image is neither base64 nor a row", "apps/cttd/importers.py",
           "                    if raw is None:", "                    if raw is False:", ("tests/test_cttd.py",)),
    Mutant("one builder: a fused metric's components built without the run's seeds", "metrics/__init__.py",
           "lambda component: build_metric(component, roles, config, finish)",
           "lambda component: build_metric(component, roles, config)", ("tests/test_fit.py",)),
    Mutant("one builder: a metric built by name left unfinished", "metrics/__init__.py",
           "return finish(name, built) if finish else built", "return built", ("tests/test_fit.py",)),
    # the cascade (issue 54 item 3; tests/test_cascade.py, its fast tests): the calibration's residual sd,
    # the margins each decision reads, which rows are open, the calibration sample, the full pipeline's count
    *[Mutant(name, "apps/cascade/estimates.py" if name in CASCADE_ESTIMATES else "apps/cascade/__init__.py",
             original, mutated, tuple(f"tests/test_cascade.py::{t}" for t in (
        "test_calibration_by_hand", "test_calibration_coverage_leaves_each_row_out", "test_margins_by_hand",
        "test_image_effects_by_hand", "test_best_of_n_shifts_siblings_by_their_image_offset",
        "test_allocation_by_the_gaps",
        "test_system_means_by_hand", "test_threshold_reconstructs_only_rows_near_it",
        "test_best_of_n_settles_wide_margins_without_generation",
        "test_rank_systems_settles_separated_systems_in_the_calibration_round",
        "test_rank_systems_reconstructs_only_overlapping_systems", "test_budget_caps_generations")))
      for name, original, mutated in (
        ("cascade: residual sd over n-2 -> n", "np.sum(residuals ** 2) / (n - 2)", "np.sum(residuals ** 2) / n"),
        ("cascade: threshold margin loses abs", "np.abs(value - decision.threshold) / sd",
         "(value - decision.threshold) / sd"),
        ("cascade: best-of-n difference's variance of both -> the challenger's",
         "sd[i] ** 2 + sd[leader] ** 2 - 2 * common", "sd[i] ** 2 - 2 * common"),
        ("cascade: best-of-n difference's sd -> the sum of the sds",
         "spread = math.sqrt(max(sd[i] ** 2 + sd[leader] ** 2 - 2 * common, 0.0))", "spread = sd[i] + sd[leader]"),
        ("cascade: best-of-n difference keeps the variance both share", "sd[leader] ** 2 - 2 * common",
         "sd[leader] ** 2 - 0 * common"),
        ("cascade: within-image variance's degrees of freedom n - 1 -> n",
         "freedom = sum(len(v) - 1 for v in members.values())", "freedom = sum(len(v) for v in members.values())"),
        ("cascade: within-image variance trusted from 1 degree of freedom", "if freedom >= MIN_WITHIN_FREEDOM",
         "if freedom >= 1"),
        ("cascade: image offsets' variance sigma^2 - within -> sigma^2", "between = max(0.0, sigma ** 2 - within)",
         "between = max(0.0, sigma ** 2)"),
        ("cascade: image offset not shrunk to its weight", "float(np.mean(v)) * len(v) * between / weight",
         "float(np.mean(v))"),
        ("cascade: image offset's variance between * within -> within", "between * within / weight",
         "within / weight"),
        ("cascade: allocation's gain per move, not per row",
         "float(np.sum(_swap_chance(means.mean[others] - means.mean[s], after, se[others])))) / extra",
         "float(np.sum(_swap_chance(means.mean[others] - means.mean[s], after, se[others])))) / 1"),
        ("cascade: allocation without the whole-system move", "for extra in {1, sizes[s] - taken[s]}:",
         "for extra in {1}:"),
        ("cascade: allocation takes a move that lowers nothing", "if gain > best_gain:", "if gain >= best_gain:"),
        ("cascade: swap chance over one se, not the difference's", "spread = np.hypot(se, others)",
         "spread = se + 0 * others"),
        ("cascade: a round of systems reports no row open", "still_open = sum(len(q) for q in queues.values())",
         "still_open = 0"),
        ("cascade: allocation in turn past a system's last row",
         "left = [s for s in left if taken[s] < sizes[s]]", "left = [s for s in left if taken[s] <= sizes[s]]"),
        ("cascade: an unreconstructed row's sd loses its image offset's variance",
         "sd = np.sqrt(effects.within + shared)", "sd = np.sqrt(effects.within + 0 * shared)"),
        ("cascade: decision score minus its image offset", "value += np.array([effects.shift(g) for g in groups])",
         "value -= np.array([effects.shift(g) for g in groups])"),
        ("cascade: the leader no longer open with its challengers", "out[leader] = min(out[leader], m)",
         "out[leader] = out[leader]"),
        ("cascade: leave-one-out residual e / (1 - h) -> e", "left_out = e / (1 - h)", "left_out = e"),
        ("cascade: leave-one-out sd over n - 3 -> n - 2", "e * left_out, 0.0) / (n - 3))",
         "e * left_out, 0.0) / (n - 2))"),
        ("cascade: coverage counts a row alone at its cheap score", "testable = leverage < 1 - 1e-9",
         "testable = leverage < 2"),
        ("cascade: coverage within z sds -> 1.96 whatever z", "np.abs(left_out) <= z * sd_left_out",
         "np.abs(left_out) <= 1.96 * sd_left_out"),
        ("cascade: system mean plus its residual mean -> minus", "mean[s] = float(np.mean(predicted[m])) + residual_mean[s]",
         "mean[s] = float(np.mean(predicted[m])) - residual_mean[s]"),
        ("cascade: pooled sd's degrees of freedom n - 1 -> n", "freedom += len(residuals) - 1",
         "freedom += len(residuals)"),
        ("cascade: system se loses the finite-population factor", "sigma * math.sqrt((1 - n / size) / n)",
         "sigma * math.sqrt(1 / n)"),
        ("cascade: a wholly reconstructed system keeps an se", "if n == size:", "if n == size + 1:"),
        ("cascade: system intervals' reach, sum of ses -> the larger", "reach = means.se[s] + means.se[t]",
         "reach = max(means.se[s], means.se[t])"),
        ("cascade: calibration sample's rows per system < -> <=", "taken.get(units[i], 0) < MIN_PER_SYSTEM",
         "taken.get(units[i], 0) <= MIN_PER_SYSTEM"),
        ("cascade: a tight budget cuts the calibration sample before each system's rows",
         "return (per_system + [i for i in first if i not in chosen])[:limit]",
         "return ([i for i in first if i not in chosen] + per_system)[:limit]"),
        ("cascade: open systems margin < z -> > z", "if margin[s] < z]", "if margin[s] > z]"),
        ("cascade: a system's unsampled rows lose its residual mean",
         "value += np.array([means.residual_mean[index[u]] for u in units])",
         "value += 0 * np.array([means.residual_mean[index[u]] for u in units])"),
        ("cascade: open when margin < z -> > z", "if margin[i] < z and", "if margin[i] > z and"),
        ("cascade: calibration sample max -> min", "max(MIN_CALIBRATION, len(order) // CALIBRATION_EVERY)",
         "min(MIN_CALIBRATION, len(order) // CALIBRATION_EVERY)"),
        ("cascade: full pipeline's generations n / done -> done / n", "round(needed * n / done)",
         "round(needed * done / n)"),
        ("cascade: swap chance over the others -> over all units", "chance.sum(axis=1) / (units - 1)",
         "chance.sum(axis=1) / units"),
        ("cascade: best-of-n pick > -> <", "value[i] > value[best[g]]", "value[i] < value[best[g]]"),
    )],
    # a metric's name is written once, in metrics/catalogue.py: its guards and the naming it drives
    *[Mutant(f"metric name: {name}", file, original, mutated, ("tests/test_metric_names.py",))
      for name, file, original, mutated in (
        ("a name given twice is kept", "metrics/catalogue.py", "if entry.name in table:", "if entry.name in ():"),
        ("a name only starting as a word is kept", "metrics/catalogue.py", "NAME_PATTERN.fullmatch(entry.name)",
         "NAME_PATTERN.match(entry.name)"),
        ("a name may hold ':'", "metrics/catalogue.py", 'r"[a-z][a-z0-9-]*"', 'r"[a-z][a-z0-9:-]*"'),
        ("a class's own name beside its entry is kept", "metrics/base.py", 'if "name" in cls.__dict__:',
         'if "names" in cls.__dict__:'),
        ("a shared class named after its first entry", "metrics/base.py", "if len(names) == 1 else",
         "if len(names) >= 1 else"),
        ("an instance named by its class alone, not its options", "metrics/catalogue.py",
         "entry.target == target and dict(entry.options) == options", "entry.target == target"),
        ("a built-in built without its entry's options", "metrics/__init__.py",
         "from_roles(roles, config, **METRICS[name].options)", "from_roles(roles, config)"),
    )],
    # corpus statistics of BLEU, METEOR, CIDEr kept per row and merged (issue 55 item 10)
    *[Mutant(f"mergeable-stats: {name}", "metrics/reference_statistics.py", original, mutated,
             ("tests/test_reference_statistics.py",)) for name, original, mutated in (
        ("BLEU closest reference length -> farthest",
         'min((abs(length - testlen), length) for length in cooked["reflen"])[1]',
         'max((abs(length - testlen), length) for length in cooked["reflen"])[1]'),
        ("BLEU closest reference tie -> the first listed",
         'min((abs(length - testlen), length) for length in cooked["reflen"])[1]',
         'min(cooked["reflen"], key=lambda length: abs(length - testlen))'),
        ("BLEU tiny 1e-15 -> 1e-12", "BLEU_TINY, BLEU_SMALL = 1e-15, 1e-9", "BLEU_TINY, BLEU_SMALL = 1e-12, 1e-9"),
        ("BLEU small 1e-9 -> 1e-6", "BLEU_TINY, BLEU_SMALL = 1e-15, 1e-9", "BLEU_TINY, BLEU_SMALL = 1e-15, 1e-6"),
        ("BLEU root 1/n -> 1/(n+1)", "product ** (1.0 / (k + 1))", "product ** (1.0 / (k + 2))"),
        ("BLEU brevity penalty exp(1 - 1/ratio) -> exp(1 - ratio)", "math.exp(1 - 1 / ratio)", "math.exp(1 - ratio)"),
        ("BLEU penalty on the longer corpus", "if ratio < 1:", "if ratio > 1:"),
        ("BLEU reference lengths not summed", 'reflen += row["reflen"]', 'reflen = row["reflen"]'),
        ("BLEU matches not summed", 'correct[k] += row["correct"][k]', 'correct[k] = row["correct"][k]'),
        ("CIDEr corpus mean -> median", "float(np.mean(np.array(rows, dtype=float)))",
         "float(np.median(np.array(rows, dtype=float)))"),
        ("merge lets a row be in two parts", "if row_id in holder:", "if False:"),
        ("merge lets other implementations merge", "if part.implementation != first.implementation:", "if False:"),
        ("rows need not be the scored ones", "if missing or extra:", "if missing:"),
        ("CIDEr parts of other references merge", 'made["cider_corpus"] = dict(cider_corpus or {})',
         'made["cider_corpus"] = {}'),
        ("a BLEU row may match more n-grams than it has", "if any(c > g for c, g in", "if any(c > g + g for c, g in"),
    )],
    Mutant("mergeable-stats: METEOR corpus from the rows' mean, not the jar's pooled statistics",
           "metrics/reference_statistics.py", "return meteor_evaluate(meteor, rows)[0]",
           "return float(np.mean(meteor_evaluate(meteor, rows)[1]))", ("tests/test_reference.py",)),
    Mutant("mergeable-stats: merge's corpus value from the first shard's statistics", "run/shards.py",
           'entry["corpus"] = corpus_value(part, order)', 'entry["corpus"] = corpus_value(held[0][1])',
           ("tests/test_reference.py",)),
    # issue 54: prompt tokens counted one prompt at a time on a copy of the Rust tokenizer, whole
    Mutant("tokens cut: the copied tokenizer keeps the pipeline's truncation", "models/generator.py",
           "    own.no_truncation()\n", "    pass\n", ("tests/test_recon.py",)),
    Mutant("tokens cut: the copied tokenizer keeps the pipeline's padding", "models/generator.py",
           "    own.no_padding()\n", "    pass\n", ("tests/test_recon.py",)),
    Mutant("tokens cut: a Python tokenizer taken for a Rust one", "models/generator.py",
           "    if backend is None:\n        return lambda prompts", "    if backend is not None:\n        return lambda prompts",
           ("tests/test_recon.py",)),
    # issue 54: the report takes the names of the thumbnails the run made, naming only the others
    Mutant("report thumbnails: the run's names not taken", "store/thumbs.py",
           "    known = known or {}\n", "    known = {}\n", ("tests/test_cache_work.py",)),
    Mutant("report thumbnails: a linked picture not recorded as made", "store/thumbs.py",
           "                        self.made[p] = name\n", "                        pass\n", ("tests/test_cache_work.py",)),
    # issue 54: a batch's digests go into the memo file in one write once the batch is read
    Mutant("digest memo: the batch's digests not written after it is read", "run/local.py",
           "        write_remembered()  # the digests", "        pass  # the digests", ("tests/test_cache_work.py",)),
    Mutant("digest memo: a digest remembered later written at once", "core/digests.py",
           "    if later:\n        with _unwritten_lock:", "    if False:\n        with _unwritten_lock:",
           ("tests/test_cache_work.py",)),
    # issue 54: a picture's folder is made by the first picture filed in it, not 256 when the store opens
    Mutant("store folders: a missing picture folder is not made", "core/paths.py",
           "        make_folder(os.path.dirname(path))", "        pass",
           ("tests/test_keep.py", "tests/test_cache_work.py")),
    # issue 54: an image file read through its descriptor, in one read when its length is what fstat said;
    # the store's pictures written through a descriptor
    Mutant("image read: a short read taken for the whole file", "data/images.py",
           "        if len(data) != size:\n", "        if len(data) > size:\n", ("tests/test_security.py",)),
    Mutant("image read: reading stops at the limit without looking past it", "data/images.py",
           "            while data and got <= limit:", "            while data and got < limit:",
           ("tests/test_security.py",)),
    Mutant("write_file: one write taken for all", "core/paths.py",
           "        while view:  # a write may", "        if view:  # a write may", ("tests/test_security.py",)),
    Mutant("make_folder: a folder whose parent is missing is not made", "core/paths.py",
           "        os.makedirs(folder, exist_ok=True)\n", "        pass\n", ("tests/test_security.py",)),
    Mutant("write_file: a file already there is not emptied", "core/paths.py",
           "    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC |", "    flags = os.O_WRONLY | os.O_CREAT |",
           ("tests/test_security.py",)),
    Mutant("store keep: a store without pictures makes no root", "store/index.py",
           "            self.root.mkdir(parents=True, exist_ok=True)", "            pass", ("tests/test_keep.py",)),
    # issue 54 (speed7): a run's rows gathered into the writer's next transaction or the batch's end
    Mutant("gathered rows: a queued row starts a write of its own", "store/writer.py",
           "            if self.gather_rows:  # written with", "            if False:  # written with",
           ("tests/test_store.py",)),
    Mutant("gathered rows: the batch's end starts no write", "store/writer.py",
           "        if self._queued:\n            self._drain_behind()", "        if False:\n            self._drain_behind()",
           ("tests/test_store.py",)),
    Mutant("gathered rows: a write pending does not take them", "store/writer.py",
           "        if release or not due:", "        if True:", ("tests/test_store.py",)),
    Mutant("gathered rows: kept claims not released while a write is pending", "store/writer.py",
           "        if release or not due:", "        if not due:", ("tests/test_keep.py", "tests/test_store.py")),
    Mutant("gathered rows: flush leaves them queued", "store/writer.py",
           "        self.write_gathered()\n        pending, self._pending", "        pending, self._pending",
           ("tests/test_store.py",)),
    Mutant("gathered rows: the run does not gather", "run/local.py",
           "store.write_behind = store.gather_rows = not store.read_only", "store.write_behind = not store.read_only",
           ("tests/test_store.py",)),
    # issue 54 (speed7): a content key's JSON through one encoder, the text json.dumps made
    Mutant("content key: its JSON's fields unsorted", "store/index.py",
           "_KEY_JSON = json.JSONEncoder(sort_keys=True,", "_KEY_JSON = json.JSONEncoder(sort_keys=False,",
           ("tests/test_text_inputs.py",)),
    Mutant("content key: its JSON escapes what is not ASCII", "store/index.py",
           "json.JSONEncoder(sort_keys=True, ensure_ascii=False,", "json.JSONEncoder(sort_keys=True, ensure_ascii=True,",
           ("tests/test_text_inputs.py",)),
    # issue 54 (speed7): the thumbnail cache links pictures that are their own thumbnails in one folder,
    # and finds those an older cache kept in its names' folders
    Mutant("thumbs as-is: an own thumbnail linked into its name's folder", "store/thumbs.py",
           "    if known and _shown_as_is(head[1], head[0], image.size, side):\n        return _linked(source, _as_is(",
           "    if known and _shown_as_is(head[1], head[0], image.size, side):\n        return _linked(source, _cached(",
           ("tests/test_cache_work.py",)),
    Mutant("thumbs as-is: an older cache's links in its names' folders not found", "store/thumbs.py",
           "    return _link(_as_is(cache, name), target) or _link(_cached(cache, name), target)",
           "    return _link(_as_is(cache, name), target)", ("tests/test_cache_work.py",)),
    Mutant("thumbs as-is: the one folder not looked in before reading the file", "store/thumbs.py",
           "        for there in (_as_is(cache, name), target):", "        for there in (target,):",
           ("tests/test_cache_work.py",)),
    Mutant("thumbs as-is: the report does not look in the cache first", "store/thumbs.py",
           "            if _from_cache(cache, target.name, target):  # made or linked before",
           "            if False:  # made or linked before", ("tests/test_cache_work.py", "tests/test_htmlreport.py")),
    # a run's frame (issue 55 item 4): the caller's store, and the clock from when the run began
    Mutant("run frame opens its own store beside the one given", "run/frame.py",
           "store = store if store is not None else open_store(cfg, out_dir)", "store = open_store(cfg, out_dir)",
           ("tests/test_frame.py",)),
    Mutant("run frame's start time read now", "run/frame.py", "time.localtime(self.started)", "time.localtime()",
           ("tests/test_frame.py",)),
    # the all-pairs call (issue 55 item 9; tests/test_all_pairs.py): which image and text each pair names,
    # the matrix's order and shape, the empty-list guard, a single text refused, ReconScore's shared form
    # (which vector each pair reads, a subclass's own `score` kept), and the reward's pairs
    *[Mutant(name, file, original, mutated, tuple(f"tests/test_all_pairs.py::{t}" for t in (
        "test_recon_matrix_is_every_image_with_every_text_each_image_embedded_once",
        "test_under_the_default_seed_policy_each_image_has_its_own_noise",
        "test_the_generic_form_builds_the_rows_once_in_image_major_order",
        "test_bad_input_is_refused_before_any_work")))
      for name, file, original, mutated in (
        ("all pairs: generic pair (i, j) -> (j, i)", "metrics/base.py",
         "with_caption(texts[j]) for i, j in pairs], ctx)", "with_caption(texts[j]) for j, i in pairs], ctx)"),
        ("all pairs: text-major order", "metrics/base.py",
         "pairs = [(i, j) for i in range(len(images)) for j in range(len(texts))]",
         "pairs = [(i, j) for j in range(len(texts)) for i in range(len(images))]"),
        ("all pairs: matrix shaped n x m", "metrics/base.py",
         "len(images), len(texts))", "len(texts), len(images))"),
        ("all pairs: empty guard or -> and", "metrics/base.py",
         "if not images or not texts:", "if not images and not texts:"),
        ("all pairs: a single text no longer refused", "metrics/base.py",
         "isinstance(values, (str, bytes, Path, Image.Image))", "isinstance(values, (bytes, Path, Image.Image))"),
        ("all pairs: recon pair reads the text's index as the image's", "metrics/recon.py",
         "source[[row_of[pairs[at][0]] for at in chunk]]", "source[[row_of[pairs[at][-1] % len(used)] for at in chunk]]"),
        ("all pairs: recon pair reads the first reconstruction", "metrics/recon.py",
         "rebuilt[[position[recons[at].key] for at in chunk]]", "rebuilt[[0 for at in chunk]]"),
    )],
    Mutant("all pairs: a ReconScore subclass's own score bypassed", "metrics/recon.py",
           "if type(self).score is not ReconScore.score:", "if type(self).score is ReconScore.score:",
           ("tests/test_reward.py::test_identical_pictures_and_captions_are_scored_once_by_content_not_by_row",)),
    Mutant("all pairs: the reward's captions all one text", "apps/reward/__init__.py",
           "texts.setdefault(caption, len(texts))", "texts.setdefault(caption, 0)",
           ("tests/test_reward.py::test_each_picture_is_embedded_once_and_each_distinct_caption_reconstructed_once",)),
    Mutant("all pairs: the reward's repeated pairs scored again", "apps/reward/__init__.py",
           "pairs = list(dict.fromkeys(pair for pair in row_pairs if pair is not None))",
           "pairs = [pair for pair in row_pairs if pair is not None]",
           ("tests/test_reward.py::test_identical_pictures_and_captions_are_scored_once_by_content_not_by_row",)),
    # text that is not valid Unicode on the score path: the row's error, escaped by every writer
    Mutant("unicode guard: a row's broken text no longer its error", "data/images.py",
           "if problem := text_problem(sample):", "if problem := None:", ("tests/test_text_inputs.py",)),
    Mutant("unicode guard: only the first reference checked", "data/samples.py",
           "for i, ref in enumerate(sample.refs))", "for i, ref in enumerate(sample.refs[:1]))", ("tests/test_text_inputs.py",)),
    Mutant("unicode guard: the image id unchecked", "data/samples.py",
           '("image_id", sample.image_id)]', '("image_id", "")]', ("tests/test_text_inputs.py",)),
    Mutant("unicode guard: json_text writes a lone surrogate as itself", "core/records.py",
           "return text if text.isascii() else", "return text if True else", ("tests/test_text_inputs.py",)),
    Mutant("unicode guard: samples with a lone surrogate refused as a whole file", "data/loaders/__init__.py",
           "read_records(path, SampleFormatError, keep_surrogates=True)",
           "read_records(path, SampleFormatError, keep_surrogates=False)", ("tests/test_text_inputs.py",)),
    Mutant("unicode guard: the report page written strictly", "reports/html/page.py",
           'errors="backslashreplace")', 'errors="strict")', ("tests/test_text_inputs.py",)),
    Mutant("unicode guard: the report refuses the scores it reads back", "reports/html/collect.py",
           "_with_error_redacted(record) for _, record in read_jsonl(path, keep_surrogates=True)",
           "_with_error_redacted(record) for _, record in read_jsonl(path, keep_surrogates=False)", ("tests/test_text_inputs.py",)),
    Mutant("unicode guard: a lone surrogate printed as itself", "core/tables.py",
           r"\u2066-\u2069\ud800-\udfff]", r"\u2066-\u2069]", ("tests/test_text_inputs.py",)),
    Mutant("unicode guard: parquet exports written with a lone surrogate", "run/captioning.py",
           'return value.encode("utf-8", "backslashreplace").decode("utf-8")', "return value",
           ("tests/test_text_inputs.py",)),
    Mutant("unicode guard: the store's JSON values written with a lone surrogate", "store/index.py",
           'json_text(v).encode("utf-8")', 'json.dumps(v, ensure_ascii=False).encode("utf-8")',
           ("tests/test_text_inputs.py",)),
    Mutant("unicode guard: a t2i caption set with a lone surrogate refused as a whole", "data/caption_sets.py",
           "read_records(path, SampleFormatError, keep_surrogates=True)",
           "read_records(path, SampleFormatError, keep_surrogates=False)", ("tests/test_text_inputs.py",)),
    # a content key of text that is not valid Unicode names the field, never a bare UnicodeEncodeError
    *[Mutant(name, "store/index.py", original, mutated, ("tests/test_text_inputs.py",)) for name, original, mutated in (
        ("content key: a lone surrogate keyed as if it were text",
         '        data = blob.encode("utf-8")\n', '        data = blob.encode("utf-8", "surrogatepass")\n'),
        ("content key: the bare UnicodeEncodeError reaches the caller",
         "    except UnicodeEncodeError:\n        raise ValueError(f\"cannot key",
         "    except KeyError:\n        raise ValueError(f\"cannot key"),
        ("content key: a nested field named without its parent",
         'label = f"{field}.{name}" if field else str(name)', "label = str(name)"),
        ("content key: an item of a list named without its place",
         '_broken_field(item, f"{field}[{i}]")', "_broken_field(item, field)"),
        ("content key: a broken field name not looked for",
         "if isinstance(name, str) and (problem := unicode_problem(name)):", "if False:"),
    )],
    Mutant("digest memo: every digest remembered later written to the first run's memo", "core/digests.py",
           "        _write(folder, remembered)", "        _write(rows[0][0], remembered)", ("tests/test_cache_work.py",)),
    Mutant("digest memo: a path that is not text written to SQLite", "core/digests.py",
           "if unicode_problem(ident[0]) is None]", "if True]", ("tests/test_cache_work.py",)),
    # the memo of file digests in the run's cache folder, and nowhere a run was not told to write
    Mutant("memo folder: --cache-dir ignored", "run/config.py",
           "else Path(self.cache_dir or default_cache_dir())", "else Path(default_cache_dir())",
           ("tests/test_cache_folders.py",)),
    Mutant("memo folder: written into a read-only cache", "run/config.py",
           "None if self.no_cache or self.cache_read_only else", "None if self.no_cache else", ("tests/test_cache_folders.py",)),
    Mutant("memo folder: written under --no-cache", "run/config.py",
           "None if self.no_cache or self.cache_read_only else", "None if self.cache_read_only else",
           ("tests/test_cache_folders.py",)),
    Mutant("memo folder: distill's in the default folder", "apps/distill/__init__.py",
           "keep_memo_in(None if store.read_only else store.root)", "keep_memo_in(default_cache_dir())", ("tests/test_cache_folders.py",)),
    Mutant("memo folder: none means the default folder", "core/digests.py",
           "    if folder is None or writing and _meant_read_only(folder):",
           "    from caprecon.core.paths import default_cache_dir\n    folder = folder or default_cache_dir()\n"
           "    if writing and _meant_read_only(folder):",
           ("tests/test_cache_folders.py", "tests/test_cache_work.py")),
    # issue: the memo follows each run's folder, not the last config built in the process
    Mutant("memo scope: a run's folder outlives its call", "core/digests.py",
           "        return contextvars.copy_context().run(call, *args, **kwargs)", "        return call(*args, **kwargs)",
           ("tests/test_cache_folders.py",)),
    Mutant("memo scope: a reward keeps no memo of its own", "apps/reward/__init__.py",
           "        keep_memo_in(self.cfg.memo_folder)\n", "        pass\n", ("tests/test_cache_folders.py",)),
    Mutant("memo scope: a score run keeps no memo of its own", "run/score.py",
           "    keep_memo_in(cfg.memo_folder)  # this run's", "    pass  # this run's", ("tests/test_cache_folders.py",)),
    Mutant("memo scope: a Ray stage keeps no memo", "run/ray.py",
           "        keep_memo_in(self.memo)  # for this batch alone", "        pass  # for this batch alone",
           ("tests/test_scale.py::test_ray_stages_keep_the_memo_in_each_runs_cache_folder",)),
    Mutant("memo scope: the reading threads get no memo", "core/digests.py",
           "    def in_folder(*args, **kwargs):\n        keep_memo_in(folder)\n",
           "    def in_folder(*args, **kwargs):\n        pass\n", ("tests/test_cache_folders.py",)),
    Mutant("memo folder: written into a cache folder without a write bit", "core/digests.py",
           "if folder is None or writing and _meant_read_only(folder):", "if folder is None:",
           ("tests/test_store.py::test_read_only_cache_is_read_and_new_work_goes_to_an_overlay",)),
    # reward7: the reward's statistics reviewed afresh
    Mutant("reward and cascade: adaptive seeds under a rule that borrows from the batch", "metrics/adaptive.py",
           'if max_seeds is not None and rule != "stein":', 'if max_seeds is not None and rule == "stein":',
           (REWARD_STATISTICS,)),
    Mutant("reward: adaptive seeds' rule unchecked", "apps/reward/__init__.py",
           "        check_seed_rule(self.cfg)\n", "        pass\n", (REWARD_STATISTICS,)),
    Mutant("cascade: adaptive seeds' rule unchecked", "apps/cascade/__init__.py",
           '    check_scored_alone(cfg.max_seeds, cfg.adaptive_rule, "a cascade",',
           '    print(cfg.max_seeds, cfg.adaptive_rule, "a cascade",', (REWARD_STATISTICS,)),
    Mutant("distill: a held-out image's caption learnt from", "apps/distill/__init__.py",
           "    train = ~test & ~shared\n", "    train = ~test\n", (REWARD_STATISTICS,)),
    Mutant("distill: a held-out caption in other case learnt from", "apps/distill/__init__.py",
           "return collapse_whitespace(caption).casefold()", "return collapse_whitespace(caption)", (REWARD_STATISTICS,)),
    Mutant("distill: one photo under two paths taken for two images", "apps/distill/__init__.py",
           "    return [first[photo] for photo in photos]", "    return list(images)", (REWARD_STATISTICS,)),
    Mutant("seeds: seed 0's value passes for the K-seed mean where a seed gave none", "metrics/seeds.py",
           "                out[name] = None  # and seed 0's value must not pass for it",
           "                pass  # and seed 0's value must not pass for it", (REWARD_STATISTICS,)),
    Mutant("ensemble: the first generator's value passes where another gave none", "metrics/seeds.py",
           '                        row.update({name: None, f"{name}_seeds": None, f"{name}_sd": None, f"{name}_ci": None})',
           "                        pass", (REWARD_STATISTICS,)),
    Mutant("adaptive: a caption alone looked at again on its own variance", "metrics/adaptive.py",
           "need <= len(r) or borrows_nothing(prior)", "need <= len(r)", (REWARD_STATISTICS,)),
    Mutant("adaptive: a pooled prior taken for borrowing nothing", "metrics/adaptive.py",
           "and not prior.pooled and prior.df == 0", "and prior.df == 0 or prior.pooled", STAGES_TESTS),
]


def _check_snippets(mutants: list[Mutant], package: Path) -> dict[str, str]:
    """Mutant name -> why it cannot be applied (its snippet is missing or ambiguous)."""
    problems = {}
    for m in mutants:
        path = package / m.file
        if not path.is_file():
            problems[m.name] = f"{m.file} does not exist"
            continue
        count = path.read_text(encoding="utf-8").count(m.original)
        if count != 1:
            problems[m.name] = f"snippet found {count} times in {m.file}: {m.original!r}"
    return problems


# -- which tests reach a mutant ---------------------------------------------------------------


def function_of(text: str, snippet: str) -> tuple[int, ...] | None:
    """The first lines (a decorated function's code starts at its first decorator) of the innermost
    function whose body holds the whole snippet, or None when it lies at module or class level (run
    on import) or in a function's signature (its defaults are evaluated where the function is defined)."""
    start = text.count("\n", 0, text.index(snippet)) + 1
    end = start + snippet.count("\n")
    found = None
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body[0].lineno <= start \
                and end <= node.end_lineno:
            if found is None or node.lineno > found.lineno:
                found = node
    if found is None:
        return None
    return tuple(sorted({found.lineno, *(d.lineno for d in found.decorator_list)}))


def _probe_targets(mutants: list[Mutant], package: Path) -> dict[str, list]:
    """Mutant name -> [its file in the copy, the first lines of the function holding its snippet]."""
    targets = {}
    for m in mutants:
        path = package / m.file
        lines = function_of(path.read_text(encoding="utf-8"), m.original)
        if lines is not None:
            targets[m.name] = [str(path), list(lines)]
    return targets


def _narrowed(named: Sequence[str], reached: Sequence[str]) -> list[str]:
    """Of the tests that called the mutated function (node ids, quickest first), those inside the
    mutant's named tests (files, or node ids)."""
    def inside(node: str, entry: str) -> bool:
        return node == entry or node.startswith(entry + "::") or node.startswith(entry + "[")

    return [node for node in reached if any(inside(node, entry) for entry in named)]


def _split(files: Sequence[str], parts: int) -> list[list[str]]:
    """The test files dealt round robin into `parts` groups (the baseline's parallel runs)."""
    groups = [list(files[i::parts]) for i in range(parts)]
    return [g for g in groups if g]


# -- running pytest: forked from this process, or as a subprocess -----------------------------

# the third-party modules the tests import, imported once here so that each forked run starts
# with them loaded (a fresh interpreter spends about 3 s importing them); never caprecon nor the
# tests, which each run imports afresh from its own copy. HF_HUB_OFFLINE and TRANSFORMERS_VERBOSITY
# are read as huggingface_hub and transformers load, so `_preload` sets them first, as conftest does.
PRELOAD = ("numpy", "scipy", "scipy.stats", "PIL.Image", "torch", "transformers", "diffusers",
           # what the tiny models (tests/tiny_models.py) import: CLIP's and Stable Diffusion's code, 1.6 s
           "transformers.modeling_utils", "transformers.models.clip.modeling_clip",
           "diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion",
           # pytest and the plugins it loads at every start
           "pytest", "hypothesis", "_hypothesis_pytestplugin", "anyio.pytest_plugin", "pytest_timeout",
           "platformdirs.pytest_plugin")
TIMED_OUT = -1  # the exit code of a run killed at --timeout
POLL_SECONDS = 0.02  # how often the scheduler looks for a finished run


def _environment(src: Path, **extra: str) -> dict[str, str]:
    """The tests' environment: caprecon from `src`; with the probe's settings, the probe importable too."""
    path = [str(src), *([str(HERE / "probe")] if extra else [])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1",
               **extra)
    env.pop("PYTHONSTARTUP", None)
    return env


def _pytest_command(tests: Sequence[str], *options: str) -> list[str]:
    """The interpreter's arguments for pytest on `tests` (files or node ids), stopping at the first failure."""
    return ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly", *options, *tests]


def _preload(modules: Sequence[str] = PRELOAD) -> str | None:
    """Import `modules` here, for forked runs to inherit; None when forking is then safe, else why not
    (no os.fork, a thread running: a forked child gets only the thread that forked, and any lock
    another thread held stays locked in it)."""
    if not hasattr(os, "fork"):
        return "this system has no os.fork"
    # what tests/conftest.py sets before its own imports, set before these: a module reads it as it loads
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # an optional extra not installed: its tests import it (and fail) on their own
    if threading.active_count() > 1:
        return f"{threading.active_count()} threads run after importing {', '.join(modules)}"
    loaded = sorted(n for n in sys.modules if n.split(".")[0] in ("caprecon", "tests", "conftest"))
    if loaded:
        raise RuntimeError(f"the preload imported {loaded}: each run must import them from its own copy")
    # the imported modules' objects out of the collector's sight: a child's collections would otherwise
    # walk them all, and touching each one's header copies the pages it shares with this process
    gc.freeze()
    return None


class Run:
    """One interpreter running `command` (`_pytest_command`, or `-c CODE`) with caprecon from a copy
    of src/, its output going to a file: a child forked from this process (which has imported
    PRELOAD), or a subprocess. Either leads a process group of its own, so that killing it at the
    timeout kills what its tests started too."""

    def __init__(self, command: Sequence[str], env: dict[str, str], output: Path, fork: bool):
        self.output = output
        self.started = time.perf_counter()
        self.popen: subprocess.Popen | None = None
        if not fork:
            with open(output, "wb") as sink:
                self.popen = subprocess.Popen([sys.executable, *command], cwd=ROOT, env=env, stdout=sink,
                                              stderr=subprocess.STDOUT, start_new_session=True)
            self.pid = self.popen.pid
            return
        sys.stdout.flush()  # else the child would write this process's unflushed lines again
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            os._exit(_child(list(command), env, output))

    def finished(self) -> int | None:
        """The exit code once the run has ended, else None."""
        if self.popen is not None:
            return self.popen.poll()
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        return None if pid == 0 else os.waitstatus_to_exitcode(status)

    def kill(self) -> None:
        """End the run and whatever it started (its process group), and reap it."""
        if hasattr(os, "killpg"):
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # the group is gone (or never formed): the run itself is ended below
        if self.popen is not None:
            self.popen.kill()  # a no-op once it has ended
            self.popen.wait()
            return
        try:
            os.kill(self.pid, signal.SIGKILL)  # not yet reaped, so its pid is still its own
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)

    def text(self) -> str:
        return self.output.read_text(encoding="utf-8", errors="replace")


def _child(command: list[str], env: dict[str, str], output: Path) -> int:
    """In a forked child: become what `python COMMAND` would be with `env` in ROOT (caprecon and the
    probe found first on sys.path, as PYTHONPATH would put them; the same environment for the
    subprocesses the tests start), run it, and return its exit code."""
    code = 1
    try:
        os.setsid()
        sink = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(sink, 1)
        os.dup2(sink, 2)
        os.close(sink)
        # this process's own PYTHONPATH (perhaps the working tree's src/) and scripts/ are left out
        inherited = {os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
        inherited |= {os.path.realpath(p) for p in ("", str(HERE))}
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = [str(ROOT), *env["PYTHONPATH"].split(os.pathsep),
                       *(p for p in sys.path if os.path.realpath(p) not in inherited)]
        sys.dont_write_bytecode = True  # a .pyc of a mutant may not outlive it (same size, same second)
        os.chdir(ROOT)
        try:
            if command[0] == "-m":
                sys.argv = [command[1], *command[2:]]
                runpy.run_module(command[1], run_name="__main__", alter_sys=True)
            else:  # -c CODE
                sys.argv = ["-c", *command[2:]]
                exec(compile(command[1], "<string>", "exec"), {"__name__": "__main__"})
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _first_failure(output: str) -> str:
    found = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    return found.group(1) if found else ("timed out" if output == "timed out" else "(see output)")


# a piece of work: given a free copy of src/, a generator that yields the runs it wants one after
# another, as (command, extra environment), receives each one's (exit code, output), and may end
# before or after any of them; the copy is its own until it ends
Work = Callable[[Path], Generator[tuple[list[str], dict[str, str]], tuple[int, str], None]]


def drive(work: Sequence[Work], copies: Sequence[Path], scratch: Path, timeout: float, fork: bool) -> None:
    """Do the pieces of `work` in order, as many at once as there are `copies`, from this one thread
    (no thread may run while a child is forked): start each run a piece asks for, poll for the ones
    that end, kill a run at `timeout` seconds (its exit code TIMED_OUT, its output "timed out"), and
    hand each piece its run's outcome. On an exception (Ctrl-C) the runs under way are killed and the
    pieces closed, so that each puts its copy's file back."""
    waiting = list(reversed(work))
    free = list(copies)
    running: list[tuple[Run, Generator, Path]] = []
    count = 0

    def advance(piece: Generator, copy: Path, outcome: tuple[int, str] | None) -> None:
        nonlocal count
        try:
            command, extra = piece.send(outcome)
        except StopIteration:
            free.append(copy)
            return
        count += 1
        running.append((Run(command, _environment(copy, **extra), scratch / f"run-{count}.txt", fork), piece, copy))

    try:
        while waiting or running:
            while waiting and free:
                copy = free.pop()
                advance(waiting.pop()(copy), copy, None)
            ended = False
            for entry in list(running):
                run, piece, copy = entry
                code = run.finished()
                if code is None and time.perf_counter() - run.started > timeout:
                    run.kill()
                    code = TIMED_OUT
                if code is not None:
                    running.remove(entry)
                    ended = True
                    advance(piece, copy, (code, "timed out" if code == TIMED_OUT else run.text()))
            if not ended:
                time.sleep(POLL_SECONDS)
    finally:
        for run, piece, _ in running:
            run.kill()
            piece.close()


def _one_run(command: list[str], outcomes: list[tuple[int, str]], **extra: str) -> Work:
    """A piece of work that is one run, its outcome appended to `outcomes`."""
    def piece(copy: Path):
        outcomes.append((yield command, extra))
    return piece


def _baseline(tests: Sequence[str], targets: dict[str, list], src: Path, jobs: int, timeout: float,
              scratch: Path, fork: bool) -> tuple[int, str, dict[str, list[str]]]:
    """The tests once on the unchanged code, run as the mutants' runs are (forked, or not), in `jobs`
    parallel runs, each with the probe plugin recording which test called the function of each
    mutant. All on the first copy: the probe knows a function by its file there."""
    plan = scratch / "targets.json"
    plan.write_text(json.dumps(targets))
    groups = _split(list(tests), jobs)
    reports = [scratch / f"reached-{i}.json" for i in range(len(groups))]
    runs: list[tuple[int, str]] = []
    drive([_one_run(_pytest_command(group, "-p", "mutants_probe"), runs, MUTANTS_PROBE_TARGETS=str(plan),
                    MUTANTS_PROBE_OUT=str(report)) for group, report in zip(groups, reports)],
          [src] * len(groups), scratch, timeout, fork)
    reached: dict[str, list[str]] = {}
    seconds: dict[str, float] = {}
    shares = []  # each parallel run's time in its tests: how evenly the round robin split them
    for report in reports:
        if report.is_file():
            probed = json.loads(report.read_text())
            seconds.update(probed["seconds"])
            shares.append(f"{sum(probed['seconds'].values()):.0f} s")
            for name, nodes in probed["reached"].items():
                reached.setdefault(name, []).extend(nodes)
    print(f"the baseline's runs spent {', '.join(shares)} in their tests", flush=True)
    for nodes in reached.values():  # the quickest first: with -x, a mutant dies at its first failing test
        nodes.sort(key=lambda node: seconds.get(node, math.inf))
    failed = [(code, output) for code, output in runs if code != 0]
    code, output = failed[0] if failed else (0, "")
    return code, output, reached


def _try_mutant(m: Mutant, reached: dict[str, list[str]] | None,
                report: Callable[[Mutant, str, str, float, str], None]) -> Work:
    """A piece of work: apply `m` to the copy it is given, run the tests that reach it (all its
    named tests when none is known to, or when the narrowed ones pass: a test the probe could not
    see, in a subprocess, may still kill it), put the code back, and `report` (mutant, status,
    first failing test, seconds, what ran)."""
    def piece(copy: Path):
        path = copy / "caprecon" / m.file
        text = path.read_text(encoding="utf-8")
        path.write_text(text.replace(m.original, m.mutated), encoding="utf-8")
        started = time.perf_counter()
        try:
            narrowed = _narrowed(m.tests, reached.get(m.name, [])) if reached is not None else []
            ran = f"{len(narrowed)} test(s) reaching it"
            code, output = (yield _pytest_command(narrowed), {}) if narrowed else (0, "")
            if code == 0:
                ran = "its named tests" if not narrowed else ran + ", then its named tests"
                code, output = yield _pytest_command(m.tests), {}
        finally:
            path.write_text(text, encoding="utf-8")
        seconds = time.perf_counter() - started
        if code != 0:
            report(m, "killed", _first_failure(output), seconds, ran)
        else:
            report(m, "SURVIVED", "no test failed", seconds, ran)
    return piece


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", nargs="+", metavar="WORD", help="only mutants whose name contains one of these")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per test run (default 600)")
    parser.add_argument("-j", "--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="mutants tried at once, each in its own copy of src/ (default: 2, or fewer cores)")
    parser.add_argument("--named-only", action="store_true",
                        help="run each mutant's named tests whole (no probe, no narrowing): the old, slower way")
    parser.add_argument("--no-fork", action="store_true",
                        help="each test run a fresh `python -m pytest` subprocess, not a child forked from this "
                             "process with the third-party modules already imported (the way where os.fork is "
                             "missing)")
    args = parser.parse_args(argv)
    names = {m.name for m in MUTANTS}
    if len(names) != len(MUTANTS):
        raise SystemExit("two mutants share a name")
    if args.jobs < 1:
        raise SystemExit("--jobs must be at least 1")
    mutants = [m for m in MUTANTS if not args.k or any(w.lower() in m.name.lower() for w in args.k)]
    if not mutants:
        raise SystemExit(f"no mutant matches {args.k}")
    jobs = min(args.jobs, len(mutants))
    whole = time.perf_counter()
    fork = not args.no_fork
    if fork:
        why_not = _preload()
        if why_not:
            print(f"each test run a subprocess: {why_not}")
            fork = False
    print(f"preloaded {', '.join(PRELOAD)} in {time.perf_counter() - whole:.1f} s; each run forked from here\n"
          if fork else "each test run a fresh `python -m pytest` subprocess\n", flush=True)

    with tempfile.TemporaryDirectory(prefix="caprecon-mutants-") as tmp:
        scratch = Path(tmp)
        copies = [scratch / f"copy{i}" / "src" for i in range(jobs)]
        for src in copies:
            shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        package = copies[0] / "caprecon"
        where: list[tuple[int, str]] = []
        drive([_one_run(["-c", "import caprecon; print(caprecon.__file__)"], where)], copies[:1], scratch, 60, fork)
        if not where[0][1].strip().startswith(str(package)):
            print(f"the tests would import caprecon from {where[0][1].strip() or '?'}, not from the copy {package}")
            return 1
        problems = _check_snippets(mutants, package)
        live = [m for m in mutants if m.name not in problems]

        every_test = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
        started = time.perf_counter()
        if args.named_only:
            runs: list[tuple[int, str]] = []
            drive([_one_run(_pytest_command(every_test), runs)], copies[:1], scratch, args.timeout, fork)
            (code, output), reached = runs[0], None
        else:
            code, output, reached = _baseline(every_test, _probe_targets(live, package), copies[0], jobs, args.timeout,
                                              scratch, fork)
        if code != 0:
            print(output[-4000:])
            print(f"the unchanged code fails its tests ({_first_failure(output)}): fix that first")
            return 1
        print(f"unchanged code: {len(every_test)} test entries pass ({time.perf_counter() - started:.0f} s, "
              f"{len(copies) if not args.named_only else 1} at once)\n", flush=True)

        rows = {m.name: (m, "STALE", problems[m.name], 0.0) for m in mutants if m.name in problems}
        for name, (_, _, why, _) in rows.items():
            print(f"STALE     {name}: {why}", flush=True)

        def report(m: Mutant, status: str, by: str, seconds: float, ran: str) -> None:
            rows[m.name] = (m, status, by, seconds)
            print(f"{status:9} {m.name}  [{by}, {seconds:.0f} s; ran {ran}]", flush=True)

        drive([_try_mutant(m, reached, report) for m in live], copies, scratch, args.timeout, fork)

    ordered = [rows[m.name] for m in mutants]
    print("\n| mutant | file | result | first failing test |\n|---|---|---|---|")
    for m, status, by, _ in ordered:
        print(f"| {m.name} | {m.file} | {status} | {by} |")
    bad = [m.name for m, status, _, _ in ordered if status != "killed"]
    verdict = f"; not killed: {', '.join(bad)}" if bad else ""
    print(f"\n{len(ordered) - len(bad)} of {len(ordered)} mutants killed{verdict} "
          f"({time.perf_counter() - whole:.0f} s in all)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
