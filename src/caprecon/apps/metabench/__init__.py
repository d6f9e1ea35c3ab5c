"""Meta-evaluation benchmarks with their protocols pinned, one small entry each.

An entry names how its files are read, which statistic the literature reports on it
(Kendall τ_c or τ_b, pairwise accuracy per category, Pearson), how references are
handled, and the file or folder names it goes by where people keep it (`find_benchmarks`).
The values published for it live in `published.csv` beside this module (benchmark,
metric, key, value ×100, source: paper and table), read by `verify.published_values`.
`caprecon meta --benchmark NAME --data PATH` runs an entry's protocol;
`caprecon meta verify` puts our numbers beside the published ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

from caprecon.data.judgments import FLICKR8K_CROWDFLOWER, FLICKR8K_EXPERT, Judgments
from caprecon.data.loaders import benchmarks as loaders


@dataclass(frozen=True)
class Benchmark:
    name: str
    about: str
    load: Callable[[str], Judgments]
    statistic: str  # tau_c, tau_b, accuracy or pearson
    references: str  # how references are chosen, in words
    reference_draws: int = 0  # > 0: sample 5 references per pair this many times and average (Pascal-50S 48 refs)
    # names (case-insensitive) the data goes by under a data root: files, folders, or a Hugging Face
    # cache folder `datasets--owner--name`, whose newest snapshot is then read
    finds: tuple[str, ...] = ()
    find_folder: bool = False  # hand the loader the folder holding the found file

    @property
    def tau_variant(self) -> str | None:
        """"b" or "c" where the protocol reports a Kendall τ, else None."""
        return self.statistic.removeprefix("tau_") if self.statistic.startswith("tau_") else None


def _longcap(test: str, perspective: str) -> Benchmark:
    split = loaders.LONGCAP_SPLITS[test]
    return Benchmark(
        f"longcaparena-{test}-{perspective}",
        f"LongCap-Arena {test[:4].title()}{test[4:].upper()} ({split}), {loaders.LONGCAP_PERSPECTIVES[perspective]}: "
        "human scores of long captions",
        partial(loaders.load_longcap, split=split, perspective=perspective),
        "tau_c",
        "the long reference caption(s) of each row",
        finds=("datasets--Ka2ukiMatsuda--LongCap-Arena", "LongCap-Arena", "longcaparena", f"{perspective}_{split}.csv"),
        find_folder=True,
    )


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            "flickr8k-expert",
            "Flickr8k-Expert: 3 expert ratings (1-4) per caption, each its own judgment (5,664 in all)",
            partial(loaders.load_flickr8k, format=FLICKR8K_EXPERT),
            "tau_c",
            "the image's 5 references; a candidate that is one of them is skipped",
            finds=("flickr8k.json", "datasets--yuwd--Flickr8k-HumanEval"),
        ),
        Benchmark(
            "flickr8k-crowdflower",
            "Flickr8k-CrowdFlower: fraction of crowd workers saying the caption fits the image",
            partial(loaders.load_flickr8k, format=FLICKR8K_CROWDFLOWER),
            "tau_b",
            "the image's references less the candidate itself when it is one of them",
            finds=("crowdflower_flickr8k.json", "datasets--yuwd--Flickr8k-HumanEval"),
        ),
        Benchmark(
            "composite",
            "Composite: 1-5 correctness ratings on Flickr8k, Flickr30k and COCO captions",
            loaders.load_composite,
            "tau_c",
            "the image's references less the rated caption when it is one of them",
            finds=("composite.json", "en_test_composite_da2.csv", "en_test_composite_da.csv",
                   "datasets--yuwd--Composite"),
        ),
        Benchmark(
            "pascal50s",
            "Pascal-50S: which of two captions people prefer, in categories HC, HI, HM, MM",
            loaders.load_pascal50s,
            "accuracy",
            "the 5 references stored with each pair",
            finds=("pascal50s.json", "pascal_50s.json"),
        ),
        Benchmark(
            "pascal50s-48",
            "Pascal-50S from the original 48-reference files, 5 references sampled per pair",
            loaders.load_pascal50s,
            "accuracy",
            "5 of the pair's 48 references, sampled under --seed, 5 draws, accuracy averaged",
            reference_draws=5,
        ),
        Benchmark(
            "foil-1ref",
            "FOIL-COCO: original caption vs. the same caption with one word foiled",
            partial(loaders.load_foil, n_refs=1),
            "accuracy",
            "the first COCO caption of the image other than the original (captions_val2014.json)",
            finds=(loaders.FOIL_FILE,),
        ),
        Benchmark(
            "foil-4ref",
            "FOIL-COCO: original caption vs. the same caption with one word foiled",
            partial(loaders.load_foil, n_refs=4),
            "accuracy",
            "the first 4 COCO captions of the image other than the original (captions_val2014.json)",
            finds=(loaders.FOIL_FILE,),
        ),
        Benchmark(
            "thumb",
            "THumB 1.0: precision/recall/total human scores of COCO system captions",
            loaders.load_thumb,
            "pearson",
            "the 4 references of mscoco_references.json, by seg_id",
            finds=(loaders.THUMB_FILE,),
        ),
        Benchmark(
            "polaris",
            "Polaris: human scores of candidate captions, test split",
            loaders.load_polaris,
            "tau_c",
            "the `refs` of each row",
            finds=("datasets--yuwd--Polaris", loaders.POLARIS_CSV, "Polaris"),
        ),
        Benchmark(
            "nebula",
            "Nebula: human scores of candidate captions, test split, labels corrected from Spica",
            loaders.load_nebula,
            "tau_c",
            "the `refs` of each row",
            finds=("datasets--Ka2ukiMatsuda--Nebula", "Nebula"),
        ),
        Benchmark(
            "nebula-raw",
            "Nebula: human scores of candidate captions, test split, labels as released",
            partial(loaders.load_nebula, corrected=False),
            "tau_c",
            "the `refs` of each row",
            finds=("datasets--Ka2ukiMatsuda--Nebula", "Nebula"),
        ),
        *(_longcap(test, p) for test in loaders.LONGCAP_SPLITS for p in loaders.LONGCAP_PERSPECTIVES),
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
