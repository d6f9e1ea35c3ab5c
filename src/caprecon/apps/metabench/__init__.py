"""Meta-evaluation benchmarks with their protocols pinned, one small entry each.

An entry names how its files are read, which statistic the literature reports on it
(Kendall τ_c or τ_b, pairwise accuracy per category, Pearson), how references are
handled, and the file or folder names it goes by where people keep it (`find_benchmarks`).
Its protocol, the fields that change a published number, is spelled out in three strings
(`refs_per_item`, `ties`, `sampling`) that the rows of `published.csv` beside this module
repeat (benchmark, metric, key, value ×100, refs, ties, sampling, source: paper and
table), so `verify` sees which rows were published under the protocol it runs.
`caprecon meta --benchmark NAME --data PATH` runs an entry's protocol;
`caprecon meta verify` puts our numbers beside the published ones.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

from caprecon.data.judgments import FLICKR8K_CROWDFLOWER, FLICKR8K_EXPERT, Judgments, JudgmentFormatError
from caprecon.data.loaders.composite import load_composite
from caprecon.data.loaders.flickr import load_flickr8k
from caprecon.data.loaders.foil import FOIL_FILE, load_foil
from caprecon.data.loaders.longcap import LONGCAP_PERSPECTIVES, LONGCAP_SPLITS, load_longcap
from caprecon.data.loaders.nebula import load_nebula, spica_corrected
from caprecon.data.loaders.pascal50s import load_pascal50s
from caprecon.data.loaders.polaris import POLARIS_CSV, load_polaris
from caprecon.data.loaders.thumb import THUMB_FILE, load_thumb
from caprecon.data.loaders.captionevalkit import captionevalkit_nebula_csv, load_captionevalkit_nebula
from caprecon.data.loaders.caparena import CAPARENA_FILE, load_caparena
from caprecon.data.loaders.expert import EXPERT_SCORES, expert_layout, load_expert_scores


# "three-way": a tie is a third label to agree on (CapArena), not credit on a decided pair
TIE_CREDIT = {"half": 0.5, "loss": 0.0, "three-way": math.nan}
PROTOCOL_FIELDS = ("refs", "ties", "sampling")
MODEL_LEVEL_KEYS = ("spearman_model", "kendall_model")
# what CapArena's model-level values were computed on, by the human ranking (`caparena.HUMAN_RANKINGS`)
CAPARENA_MODEL_SAMPLING = {
    "published": "every battle without the human caption; models against CapArena's published human ranking",
    "recomputed": "every battle without the human caption; models against people's Elo of the file, without the "
                  "human caption's battles",
}


@dataclass(frozen=True)
class Benchmark:
    name: str
    about: str
    load: Callable[[str], Judgments]
    statistic: str  # tau_c, tau_b, accuracy, pearson or caparena (three-way agreement, `caparena`)
    references: str  # how references are chosen, in words
    refs_per_item: str  # the protocol fields a published row repeats: references per judged item,
    sampling: str  # which items are judged (every rating, one pair per image, draws of references)
    ties: str = "half"  # a metric tie on a pair: "half" earns ½ (a random break, in expectation), "loss" earns 0
    reference_draws: int = 0  # > 0: sample 5 references per pair this many times and average (Pascal-50S 48 refs)
    # names (case-insensitive) the data goes by under a data root: files, folders, or a Hugging Face
    # cache folder `datasets--owner--name`, whose newest snapshot is then read
    finds: tuple[str, ...] = ()
    find_folder: bool = False  # hand the loader the folder holding the found file
    # copies of the data this benchmark reads besides its default one, each named for `--format`
    # (`load` then takes `layout=`); "auto" recognises the copy from the file
    layouts: tuple[str, ...] = ()

    @property
    def tie_credit(self) -> float:
        return TIE_CREDIT[self.ties]

    def protocol(self, key: str, human_ranking: str = "published") -> dict[str, str]:
        """The protocol fields a published value under `key` must carry to be this benchmark's:
        for a Kendall τ the variant is how ties count; for CapArena's model-level values, which
        human ranking the models were held against (`human_ranking`, `caparena.people_ranking`)."""
        ties = key if key in ("tau_b", "tau_c") else self.ties
        sampling = self.sampling
        if self.statistic == "caparena" and key in MODEL_LEVEL_KEYS:
            sampling = CAPARENA_MODEL_SAMPLING[human_ranking]
        return {"refs": self.refs_per_item, "ties": ties, "sampling": sampling}

    @property
    def tau_variant(self) -> str | None:
        """"b" or "c" where the protocol reports a Kendall τ, else None."""
        return self.statistic.removeprefix("tau_") if self.statistic.startswith("tau_") else None


def _longcap(test: str, perspective: str) -> Benchmark:
    split = LONGCAP_SPLITS[test]
    return Benchmark(
        f"longcaparena-{test}-{perspective}",
        f"LongCap-Arena {test[:4].title()}{test[4:].upper()} ({split}), {LONGCAP_PERSPECTIVES[perspective]}: "
        "human scores of long captions",
        partial(load_longcap, split=split, perspective=perspective),
        "tau_c",
        "the long reference caption(s) of each row",
        "the row's refs",
        f"{split}, {perspective}",
        finds=("datasets--Ka2ukiMatsuda--LongCap-Arena", "LongCap-Arena", "longcaparena", f"{perspective}_{split}.csv"),
        find_folder=True,
    )


PASCAL_DRAWS = "5 draws of 5 of the 48 references, averaged"

# The copies of Polaris and Nebula people download, as `--format` names them: `hub` (the Hugging
# Face dataset, or the Polos CSV for Polaris), `expert` (EXPERT's annotations/*_test.json),
# `captionevalkit` (nebula/nebula_test.csv with nebula/images/).
LAYOUTS = ("hub", "expert", "captionevalkit")


def _layout(path: str, layout: str, allowed: tuple[str, ...]) -> str:
    if layout == "auto":
        if expert_layout(path) == EXPERT_SCORES:
            return "expert"
        return "captionevalkit" if "captionevalkit" in allowed and captionevalkit_nebula_csv(path) else "hub"
    if layout not in allowed:
        raise JudgmentFormatError(f"--format {layout} is not a copy this benchmark reads (known: auto, {', '.join(allowed)})")
    return layout


def _load_polaris(path: str, layout: str = "auto") -> Judgments:
    if _layout(path, layout, ("hub", "expert")) == "expert":
        return load_expert_scores(path, "polaris")
    return load_polaris(path)


def _load_nebula(path: str, layout: str = "auto", *, corrected: bool = True) -> Judgments:
    """Nebula from any of its copies; `corrected` replaces the test labels by Spica's (the
    benchmark's name, `nebula` or `nebula-raw`, says which labels a number was computed on)."""
    chosen = _layout(path, layout, LAYOUTS)
    if chosen == "hub":
        return load_nebula(path, corrected=corrected)
    if chosen == "expert":
        judgments = load_expert_scores(path, "nebula")
    else:
        csv = captionevalkit_nebula_csv(path)
        if csv is None:
            raise JudgmentFormatError(f"{path}: no nebula_test.csv (CaptionEvalKit's nebula/ folder) there")
        judgments = load_captionevalkit_nebula(csv)
    return spica_corrected(judgments, path) if corrected else judgments


def _tifa160_reads_three_files(path: str) -> Judgments:
    raise JudgmentFormatError("tifa160 reads --judgments (its Likert file), --questions and --answers, not --data")


def _foil(n_refs: int | None, pairs: str) -> Benchmark:
    """FOIL under the two protocols papers use: CLIPScore's (Table 5: one (original, foil)
    pair per image, 1 or 4 references) and Polos' (`validate/compute_foil.py`: every foil
    with its original, the first reference or all but the original, a tie counted wrong)."""
    per_image = pairs == "per-image"
    refs = "all but the original" if n_refs is None else str(n_refs)
    which = {1: "the first COCO caption", None: "every COCO caption"}.get(n_refs, f"the first {n_refs} COCO captions")
    return Benchmark(
        f"foil-{n_refs}ref" if per_image else f"foil-polos-{n_refs or 'all'}ref",
        "FOIL-COCO: original caption vs. the same caption with one word foiled, "
        + ("one pair per image (CLIPScore)" if per_image else "every foil (Polos)"),
        partial(load_foil, n_refs=n_refs, pairs=pairs),
        "accuracy",
        f"{which} of the image other than the original (captions_val2014.json)",
        refs,
        "one pair per image" if per_image else "every foil with its original",
        ties="half" if per_image else "loss",
        finds=(FOIL_FILE,),
    )


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            "flickr8k-expert",
            "Flickr8k-Expert: 3 expert ratings (1-4) per caption, each its own judgment (5,664 in all)",
            partial(load_flickr8k, format=FLICKR8K_EXPERT),
            "tau_c",
            "the image's 5 references; a candidate that is one of them is skipped",
            "5, a candidate among them skipped",
            "each expert rating its own judgment",
            finds=("flickr8k.json", "datasets--yuwd--Flickr8k-HumanEval"),
        ),
        Benchmark(
            "flickr8k-crowdflower",
            "Flickr8k-CrowdFlower: fraction of crowd workers saying the caption fits the image",
            partial(load_flickr8k, format=FLICKR8K_CROWDFLOWER),
            "tau_b",
            "the image's references less the candidate itself when it is one of them",
            "the image's, less the candidate",
            "mean crowd vote per caption",
            finds=("crowdflower_flickr8k.json", "datasets--yuwd--Flickr8k-HumanEval"),
        ),
        Benchmark(
            "composite",
            "Composite: 1-5 correctness ratings on Flickr8k, Flickr30k and COCO captions",
            load_composite,
            "tau_c",
            "the image's references less the rated caption when it is one of them",
            "the image's, less the rated caption",
            "every rating",
            finds=("composite.json", "en_test_composite_da2.csv", "en_test_composite_da.csv",
                   "datasets--yuwd--Composite"),
        ),
        Benchmark(
            "pascal50s",
            "Pascal-50S: which of two captions people prefer, in categories HC, HI, HM, MM",
            load_pascal50s,
            "accuracy",
            "the 5 references stored with each pair",
            "5",
            "the file's 5 of the 48 references (one draw)",
            finds=("pascal50s.json", "pascal_50s.json"),
        ),
        Benchmark(
            "pascal50s-48",
            "Pascal-50S from the original 48-reference files, 5 references sampled per pair",
            load_pascal50s,
            "accuracy",
            "5 of the pair's 48 references, sampled under --seed, 5 draws, accuracy averaged",
            "5",
            PASCAL_DRAWS,
            reference_draws=5,
        ),
        _foil(1, "per-image"),
        _foil(4, "per-image"),
        _foil(1, "all"),
        _foil(None, "all"),
        Benchmark(
            "thumb",
            "THumB 1.0: precision/recall/total human scores of COCO system captions",
            load_thumb,
            "pearson",
            "the 4 references of mscoco_references.json, by seg_id",
            "4",
            "every caption",
            finds=(THUMB_FILE,),
        ),
        Benchmark(
            "polaris",
            "Polaris: human scores of candidate captions, test split",
            _load_polaris,
            "tau_c",
            "the `refs` of each row",
            "the row's refs",
            "test split",
            finds=("datasets--yuwd--Polaris", POLARIS_CSV, "polaris_test.json", "Polaris"),
            layouts=("hub", "expert"),
        ),
        Benchmark(
            "nebula",
            "Nebula: human scores of candidate captions, test split, labels corrected from Spica",
            _load_nebula,
            "tau_c",
            "the `refs` of each row",
            "the row's refs",
            "test split, labels corrected from Spica",
            finds=("datasets--Ka2ukiMatsuda--Nebula", "nebula_test.json", "nebula_test.csv", "Nebula"),
            layouts=LAYOUTS,
        ),
        Benchmark(
            "nebula-raw",
            "Nebula: human scores of candidate captions, test split, labels as released",
            partial(_load_nebula, corrected=False),
            "tau_c",
            "the `refs` of each row",
            "the row's refs",
            "test split, labels as released",
            finds=("datasets--Ka2ukiMatsuda--Nebula", "nebula_test.json", "nebula_test.csv", "Nebula"),
            layouts=LAYOUTS,
        ),
        *(_longcap(test, p) for test in LONGCAP_SPLITS for p in LONGCAP_PERSPECTIVES),
        Benchmark(
            "caparena",
            "CapArena: people's pairwise verdicts on detailed captions of 14 models and DOCCI's human one",
            load_caparena,
            "caparena",
            "DOCCI's human description of the image (`ref`)",
            "1",
            "every battle without the human caption, ties included",
            ties="three-way",
            finds=(CAPARENA_FILE,),
        ),
        Benchmark(
            "tifa160",
            "TIFA160 (DSG): 800 generated images rated 1-5 for prompt consistency; a question bank's item score "
            "from recorded VQA answers (`caprecon.apps.metabench.tifa160`)",
            _tifa160_reads_three_files,
            "tau_b",
            "none: the prompt's questions, answered on the image",
            "0",
            "every rated image (160 prompts x 5 generators), mean rating per image",
        ),
    )
}


def get_benchmark(name: str) -> Benchmark:
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise KeyError(f"unknown benchmark {name!r} (known: {', '.join(BENCHMARKS)})") from None


def find_benchmarks(root: str | Path, *, depth: int = 4) -> list[tuple[Benchmark, Path]]:
    """Every benchmark whose data lies under `root` (at most `depth` folders down), with the
    path its loader takes; the first name in `Benchmark.finds` that is found wins."""
    root = Path(root)
    found: dict[str, Path] = {}
    base = len(root.parts)
    for folder, dirs, files in os.walk(root, followlinks=True):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if len(here.parts) - base < depth else []
        for name in [*dirs, *sorted(files)]:
            found.setdefault(name.lower(), here / name)
    out = []
    for bench in BENCHMARKS.values():
        for name in bench.finds:
            path = found.get(name.lower())
            if path is None:
                continue
            if name.lower().startswith("datasets--"):
                snapshots = sorted((path / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime)
                if not snapshots:
                    continue
                path = snapshots[-1]
            elif bench.find_folder and path.is_file():
                path = path.parent
            out.append((bench, path))
            break
    return out
