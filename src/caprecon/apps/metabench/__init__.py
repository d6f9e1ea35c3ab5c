"""Meta-evaluation benchmarks with their protocols pinned, one small entry each.

An entry names how its files are read, which statistic the literature reports on it
(Kendall τ_c or τ_b, pairwise accuracy per category, Pearson), how references are
handled, and the values published for the reference metrics, each with its source.
`caprecon meta --benchmark NAME --data PATH` runs an entry's protocol;
`caprecon meta verify` puts our numbers beside the published ones.

Published values are ×100 (as papers print them); our statistics are fractions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from caprecon.data.judgments import FLICKR8K_CROWDFLOWER, FLICKR8K_EXPERT, Judgments
from caprecon.data.loaders import benchmarks as loaders

CLIPSCORE = "CLIPScore paper (Hessel et al. 2021), Tables 1-3"

PASCAL_KEYS = ("HC", "HI", "HM", "MM", "mean")


@dataclass(frozen=True)
class Benchmark:
    name: str
    about: str
    load: Callable[[str], Judgments]
    statistic: str  # tau_c, tau_b, accuracy or pearson
    references: str  # how references are chosen, in words
    published: dict[str, dict[str, float]] = field(default_factory=dict)  # metric -> key -> value ×100
    source: str = ""  # where `published` comes from
    reference_draws: int = 0  # > 0: sample 5 references per pair this many times and average (Pascal-50S 48 refs)


def _pascal(values: tuple[float, ...]) -> dict[str, float]:
    return dict(zip(PASCAL_KEYS, values))


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            "flickr8k-expert",
            "Flickr8k-Expert: 3 expert ratings (1-4) per caption, each its own judgment (5,664 in all)",
            partial(loaders.load_flickr8k, format=FLICKR8K_EXPERT),
            "tau_c",
            "the image's 5 references; a candidate that is one of them is skipped",
            {
                "bleu-1": {"value": 32.3}, "bleu-4": {"value": 30.8}, "rouge": {"value": 32.3},
                "meteor": {"value": 41.8}, "cider": {"value": 43.9}, "spice": {"value": 44.9},
                "clipscore": {"value": 51.2}, "refclipscore": {"value": 53.0},
            },  # fmt: skip
            CLIPSCORE,
        ),
        Benchmark(
            "flickr8k-crowdflower",
            "Flickr8k-CrowdFlower: fraction of crowd workers saying the caption fits the image",
            partial(loaders.load_flickr8k, format=FLICKR8K_CROWDFLOWER),
            "tau_b",
            "the image's references less the candidate itself when it is one of them",
            {
                "bleu-1": {"value": 17.9}, "bleu-4": {"value": 16.9}, "rouge": {"value": 19.9},
                "meteor": {"value": 22.2}, "cider": {"value": 24.6}, "spice": {"value": 24.4},
                "clipscore": {"value": 34.4}, "refclipscore": {"value": 36.4},
            },  # fmt: skip
            CLIPSCORE,
        ),
        Benchmark(
            "composite",
            "Composite: 1-5 correctness ratings on Flickr8k, Flickr30k and COCO captions",
            loaders.load_composite,
            "tau_c",
            "the references given with each row",
            {
                "bleu-1": {"value": 31.3}, "bleu-4": {"value": 30.6}, "rouge": {"value": 32.4},
                "meteor": {"value": 38.9}, "cider": {"value": 37.7}, "spice": {"value": 40.3},
                "clipscore": {"value": 53.8}, "refclipscore": {"value": 55.4},
            },  # fmt: skip
            CLIPSCORE,
        ),
        Benchmark(
            "pascal50s",
            "Pascal-50S: which of two captions people prefer, in categories HC, HI, HM, MM",
            loaders.load_pascal50s,
            "accuracy",
            "the 5 references stored with each pair",
            {
                "bleu-1": _pascal((51.1, 95.2, 91.2, 58.2, 73.9)),
                "bleu-4": _pascal((52.5, 90.4, 84.9, 55.3, 70.8)),
                "rouge": _pascal((55.6, 95.1, 93.3, 57.7, 75.4)),
                "meteor": _pascal((58.9, 97.7, 94.2, 66.4, 79.3)),
                "cider": _pascal((53.0, 98.0, 91.5, 64.5, 76.8)),
                "clipscore": _pascal((56.5, 99.3, 96.4, 70.4, 80.7)),
                "refclipscore": _pascal((64.5, 99.6, 95.4, 72.8, 83.1)),
            },
            CLIPSCORE,
        ),
        Benchmark(
            "pascal50s-48",
            "Pascal-50S from the original 48-reference files, 5 references sampled per pair",
            loaders.load_pascal50s,
            "accuracy",
            "5 of the pair's 48 references, sampled under --seed, 5 draws, accuracy averaged",
            {},
            "published numbers are for the 5-reference copies (see pascal50s)",
            reference_draws=5,
        ),
        Benchmark(
            "foil-1ref",
            "FOIL-COCO: correct caption vs. the same caption with one word foiled",
            partial(loaders.load_foil, n_refs=1),
            "accuracy",
            "1 other correct caption of the image",
        ),
        Benchmark(
            "foil-4ref",
            "FOIL-COCO: correct caption vs. the same caption with one word foiled",
            partial(loaders.load_foil, n_refs=4),
            "accuracy",
            "4 other correct captions of the image",
        ),
        Benchmark(
            "thumb",
            "THumB 1.0: precision/recall/total human scores of COCO system captions",
            loaders.load_thumb,
            "pearson",
            "the references given with each row",
        ),
        Benchmark(
            "polaris",
            "Polaris: human scores of candidate captions (local datasets folder, test split)",
            loaders.load_hf_judgments,
            "tau_c",
            "the `refs` of each row",
        ),
        Benchmark(
            "nebula",
            "Nebula: human scores of candidate captions (local datasets folder, test split)",
            loaders.load_hf_judgments,
            "tau_c",
            "the `refs` of each row",
        ),
    )
}


def get_benchmark(name: str) -> Benchmark:
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise KeyError(f"unknown benchmark {name!r} (known: {', '.join(BENCHMARKS)})") from None
