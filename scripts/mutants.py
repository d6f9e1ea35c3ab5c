"""The mutation check of the headline formulas: change each by one token and see a test fail.

    python scripts/mutants.py                 # every mutant (make mutants)
    python scripts/mutants.py -k recon clip   # those whose name contains one of the words

Each mutant is data: the file (under src/caprecon), a snippet that must occur in it exactly
once, what replaces it, and the tests that should notice. The script copies src/ to a
temporary folder, applies one mutant there (never in the working tree), runs its tests with
PYTHONPATH pointing at the copy, and puts the snippet back. A snippet that no longer occurs
exactly once is reported as `stale` (the code moved: update the list) rather than skipped.
First the tests run once on the unchanged copy, which must pass. Exit status 1 when any
mutant survives or is stale, or the unchanged copy fails.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORMULAS = "tests/test_formulas.py"
DISTILL = "tests/test_distill.py"


@dataclass(frozen=True)
class Mutant:
    name: str  # the formula, and what the mutant does to it
    file: str  # under src/caprecon
    original: str
    mutated: str
    tests: tuple[str, ...] = (FORMULAS,)


MUTANTS = [
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
    Mutant("VQAScore encoder-decoder first decoder step -> second", "models/vlm.py",
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
           'if str(entry.get("token", "")).strip() == target]',
           'if str(entry.get("token", "")).strip().casefold() == target.casefold()]',
           ("tests/test_openai_compat.py::test_token_matching_reads_every_option_by_one_rule",)),
    Mutant("server option outside the top-k counts as 0", "models/openai_compat.py",
           "[[_or(_token_prob(top, option), math.nan) for option in opts]",
           "[[_or(_token_prob(top, option), 0.0) for option in opts]",
           ("tests/test_openai_compat.py::test_an_option_outside_the_top_k_is_unknown_and_its_row_says_why",)),
    Mutant("VQAScore unknown P('Yes') passes as a number", "metrics/vqascore.py",
           "if any(math.isnan(p) for p in out):", "if False:", (FORMULAS,)),
    Mutant("VQAScore normalised without mass falls back to a value", "metrics/vqascore.py",
           "        if not yes + no > 0:", "        if False:", (FORMULAS,)),
    Mutant("claims supported at >= 0.5 -> > 0.5", "metrics/claims.py", "return self.p_yes >= SUPPORTED",
           "return self.p_yes > SUPPORTED", ("tests/test_halluc.py",)),
    Mutant("cached claims without the parser's revision", "metrics/claims.py", "parser=CLAIMS_PARSER_REVISION)", ")",
           ("tests/test_halluc.py",)),
    Mutant("batch-invariant generation still batched", "models/generator.py",
           "per_call = 1 if self.batch_invariant else self.batch_size", "per_call = self.batch_size",
           ("tests/test_scale.py::test_batch_invariant_reconstructions_do_not_depend_on_their_batch",)),
    Mutant("a hub captioner's first run reads no generation config", "models/captioner.py",
           "return generation_defaults(hub_generation_config(self.source.name, self.source.revision))",
           "return {}", ("tests/test_caption.py::test_a_hub_captioner_not_yet_downloaded_samples_with_its_own_settings",)),
    # refinement judged on held-out questions; its guard
    Mutant("refine keep-margin removed", "apps/refine.py", 'if row["score"] > before + margin:',
           'if row["score"] > before:', ("tests/test_refine.py",)),
    Mutant("refine tokens-cut verdict removed", "apps/refine.py", 'if row.get("tokens_cut"):', "if False:",
           ("tests/test_refine.py",)),
    Mutant("refine over-budget revision scored anyway", "apps/refine.py", "elif over > 0:", "elif False:",
           ("tests/test_refine.py",)),
    Mutant("refine reviser told the held-out flips", "apps/refine.py", 'states[s.id].get("turing_guiding_flipped")',
           'states[s.id].get("turing_flipped")', ("tests/test_refine.py",)),
    Mutant("refine guard reads the whole bank", "apps/refine.py",
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
    # distill and the distilled folder (issue 51 items 3, 5, 6, 11, 13; issue 50 item 4): the guards this round added
    Mutant("distill: an infinite metric value taken for a missing one", "apps/distill.py",
           "if isinstance(value, float) and not math.isfinite(value):", "if isinstance(value, float) and math.isnan(value):",
           (f"{DISTILL}::test_non_finite_values_are_refused_naming_their_rows_and_json_is_strict",)),
    Mutant("distill: values whose spread overflows standardised", "apps/distill.py",
           "    if not (math.isfinite(mean) and math.isfinite(scale)):\n        k =",
           "    if not (math.isfinite(mean) or math.isfinite(scale)):\n        k =",
           (f"{DISTILL}::test_non_finite_values_are_refused_naming_their_rows_and_json_is_strict",)),
    Mutant("distill: a reconstruction read from the path the row names", "apps/distill.py",
           "Stored(name, found[1], found[2])", "Stored(name, Path(name), found[2])",
           (f"{DISTILL}::test_reconstructions_are_read_from_the_store_by_key_only",)),
    Mutant("distill: a stored reconstruction's checksum unchecked", "apps/distill.py",
           "read_verified(path, wanted[path].checksum)", "read_verified(path, None)",
           (f"{DISTILL}::test_reconstructions_are_read_from_the_store_by_key_only",)),
    Mutant("distill: auto's reconstruction objective on rows the store lacks", "apps/distill.py",
           "all(x.path is not None for x in r.reconstructions)", "all(x.named for x in r.reconstructions)",
           (f"{DISTILL}::test_reconstructions_are_read_from_the_store_by_key_only",)),
    Mutant("distill: no warning when the text encoder chose the reconstructions", "apps/distill.py",
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
    Mutant("manifest written with NaN", "run/folder.py", "json.dumps(_finite(redact(manifest))",
           "json.dumps((redact(manifest))", (f"{DISTILL}::test_config_and_manifest_are_strict_json",)),
    Mutant("run lock: another thread of the process shares a held folder", "run/folder.py",
           "if key in _held and _held[key][3] != threading.get_ident():",
           "if key in _held and _held[key][3] == threading.get_ident():",
           (f"{DISTILL}::test_two_threads_of_one_process_never_hold_one_run_folder",)),
    Mutant("reward-audit: an audit of fewer than 3 captions", "apps/reward.py", "MIN_AUDIT_CAPTIONS = 3",
           "MIN_AUDIT_CAPTIONS = 1", ("tests/test_reward_audit.py",)),
    Mutant("reward-audit: captions with unreadable images audited", "apps/reward.py",
           "            read_image(row)\n", "            pass\n", ("tests/test_reward_audit.py",)),
]


def _environment(src: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(src), HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONSTARTUP", None)
    return env


def _pytest(tests: tuple[str, ...], src: Path, timeout: float) -> tuple[int, str]:
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly", *tests]
    try:
        done = subprocess.run(command, cwd=ROOT, env=_environment(src), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, "timed out"
    return done.returncode, done.stdout + done.stderr


def _first_failure(output: str) -> str:
    found = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    return found.group(1) if found else ("timed out" if output == "timed out" else "(see output)")


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", nargs="+", metavar="WORD", help="only mutants whose name contains one of these")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per test run (default 600)")
    args = parser.parse_args(argv)
    names = {m.name for m in MUTANTS}
    if len(names) != len(MUTANTS):
        raise SystemExit("two mutants share a name")
    mutants = [m for m in MUTANTS if not args.k or any(w.lower() in m.name.lower() for w in args.k)]
    if not mutants:
        raise SystemExit(f"no mutant matches {args.k}")

    with tempfile.TemporaryDirectory(prefix="caprecon-mutants-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        package = src / "caprecon"
        where = subprocess.run([sys.executable, "-c", "import caprecon; print(caprecon.__file__)"], cwd=ROOT,
                               env=_environment(src), capture_output=True, text=True).stdout.strip()
        if not where.startswith(str(package)):
            print(f"the tests would import caprecon from {where or '?'}, not from the copy {package}")
            return 1
        problems = _check_snippets(mutants, package)

        every_test = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
        started = time.perf_counter()
        code, output = _pytest(every_test, src, args.timeout)
        if code != 0:
            print(output[-4000:])
            print(f"the unchanged code fails its tests ({_first_failure(output)}): fix that first")
            return 1
        print(f"unchanged code: {len(every_test)} test files pass ({time.perf_counter() - started:.0f} s)\n")

        rows = []
        for m in mutants:
            if m.name in problems:
                rows.append((m, "STALE", problems[m.name], 0.0))
                print(f"STALE     {m.name}: {problems[m.name]}", flush=True)
                continue
            path = package / m.file
            text = path.read_text(encoding="utf-8")
            path.write_text(text.replace(m.original, m.mutated), encoding="utf-8")
            started = time.perf_counter()
            try:
                code, output = _pytest(m.tests, src, args.timeout)
            finally:
                path.write_text(text, encoding="utf-8")
            seconds = time.perf_counter() - started
            status = "killed" if code != 0 else "SURVIVED"
            by = _first_failure(output) if code != 0 else "no test failed"
            rows.append((m, status, by, seconds))
            print(f"{status:9} {m.name}  [{by}, {seconds:.0f} s]", flush=True)

    print("\n| mutant | file | result | first failing test |\n|---|---|---|---|")
    for m, status, by, _ in rows:
        print(f"| {m.name} | {m.file} | {status} | {by} |")
    bad = [m.name for m, status, _, _ in rows if status != "killed"]
    verdict = f"; not killed: {', '.join(bad)}" if bad else ""
    print(f"\n{len(rows) - len(bad)} of {len(rows)} mutants killed{verdict}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
