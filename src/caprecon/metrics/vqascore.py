"""VQAScore: a VLM's probability that the image shows the caption.

The judge is asked the template (default "Is the figure showing: {caption}?", the
Re-LAION-Caption 19M evaluation's query) and the score is read from its next-token
distribution at the start of the answer:

    vqascore        P(first answer token = "Yes"), full-vocabulary softmax, on the
                    original image: does the caption describe it faithfully?
    vqascore_recon  the same on the reconstruction Î: does the generator adhere to it?

Each answer's probability is that of ONE token, the one that starts the reply with the
answer as written (t2v_metrics' rule, in every backend: `caprecon.models.openai_compat`):
"Yes" is neither " Yes" nor "yes". With `normalise=True` the score is instead
P(yes) / (P(yes) + P(no)), each side summed over the variants "Yes"/"yes" and "No"/"no",
each asked as an option of its own, which removes the mass the model puts on other tokens. A probability that cannot be known (an answer outside the top-k a server
reports, no mass on either answer) is that row's error, never a default value. Only the first token is read: for tokenisers that split "Yes", that is the
probability of its first piece. For encoder-decoder judges (InstructBLIP-Flan-T5, VQAScore's
strongest family) it is the decoder's first-step distribution.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from caprecon.models.generator import TextToImage
from caprecon.models.vlm import VisionLanguageModel
from caprecon.reconstruct.reconstructor import ReconstructionSpec
from caprecon.core.describe import describe_model
from caprecon.data.images import LoadedSample
from caprecon.data.samples import SampleError
from caprecon.metrics.base import Column, Context, Metric
from caprecon.metrics.judging import Ask, LazyImages, option_probs, require_capability
from caprecon.models.build import model_of

DEFAULT_TEMPLATE = "Is the figure showing: {caption}?"
YES, NO = ("Yes", "yes"), ("No", "no")


def yes_probabilities(ctx: Context, vlm: VisionLanguageModel, asks: Sequence[Ask], images: LazyImages, *,
                      normalise: bool = False) -> list[float]:
    """The judge's P(yes) for each (image key, prompt) ask, in one cached batch: the first
    answer token's full-vocabulary probability of "Yes", or with `normalise` P(yes) / (P(yes)
    + P(no)) over Yes/yes and No/no.

    A probability the judge cannot give is never guessed (a guess of 0.5 would read as
    "supported" to the claims gate): the batch raises `SampleError`, so that the executor
    tries its rows alone and each unknown one becomes that row's error. Unknown means: "Yes"
    outside the top-k a server reported (NaN from `option_probs`), or, normalised, no variant
    of either answer in it, or no mass on any. A variant outside the top-k beside others
    inside it counts as 0 (it is below the k-th token's probability)."""
    if not normalise:
        out = [p[0] for p in option_probs(ctx, vlm, asks, images, ["Yes"])]
        if any(math.isnan(p) for p in out):
            raise SampleError("the judge's P('Yes') is unknown: 'Yes' is not among the top-k tokens its server "
                              "reported (raise top_logprobs, or use --vqa-normalise; a model whose chat template "
                              "ends its prompt on a word, as LLaVA-1.5's 'ASSISTANT:', replies ' Yes': "
                              "--judge-opt reply_space=true)", "answer outside the top-k")
        return out
    out = []
    for p in option_probs(ctx, vlm, asks, images, [*YES, *NO]):
        if all(math.isnan(v) for v in p):
            raise SampleError("the judge's P(yes) is unknown: none of Yes/yes/No/no is among the top-k tokens its "
                              "server reported", "answer outside the top-k")
        yes = sum(v for v in p[: len(YES)] if not math.isnan(v))
        no = sum(v for v in p[len(YES) :] if not math.isnan(v))
        if not yes + no > 0:
            raise SampleError("the judge put no probability on Yes/yes or No/no, so P(yes)/(P(yes)+P(no)) is "
                              "undefined", "no mass on yes or no")
        out.append(yes / (yes + no))
    return out


class VQAScore(Metric):

    def __init__(self, vlm: VisionLanguageModel, *, template: str = DEFAULT_TEMPLATE, on: str = "image",
                 generator: TextToImage | None = None, spec: ReconstructionSpec | None = None,
                 normalise: bool = False, column: str | None = None):
        """`column` names the score's field instead of vqascore / vqascore_recon, so that
        several judges can score in one run (`caprecon t2i`: vqa/<judge>)."""
        if on not in {"image", "reconstruction", "both"}:
            raise ValueError(f"`on` must be image, reconstruction or both, not {on!r}")
        if on != "image" and generator is None:
            raise ValueError("VQAScore on the reconstruction needs a generator")
        if "{caption}" not in template:
            raise ValueError(f"VQAScore template must contain {{caption}}: {template!r}")
        if column and on == "both":
            raise ValueError("VQAScore on both images has two fields; `column` names one")
        vlm, generator = model_of("judge", vlm), model_of("generator", generator)
        require_capability(vlm, "option_probs", self.name)
        self.vlm, self.template, self.on, self.generator = vlm, template, on, generator
        self.spec = spec or ReconstructionSpec()
        self.normalise = normalise
        self.column = column
        self.needs_source_image = on != "reconstruction"
        # on both images the source's is the headline, and the reconstruction's is summarised beside it
        self.companions = ("vqascore_recon",) if on == "both" else ()
        self.columns = tuple(Column(name, low=0.0, high=1.0, needs_judge=True, needs_source_image=name == "vqascore")
                             for name in [self.headline, *self.companions])

    @classmethod
    def from_roles(cls, roles: Any, config: Any) -> VQAScore:
        return cls(roles.judge, template=config.vqa_template, on=config.vqa_on,
                   generator=roles.generator if config.vqa_on != "image" else None, spec=config.spec,
                   normalise=config.vqa_normalise)

    @property
    def headline(self) -> str:
        return self.column or ("vqascore_recon" if self.on == "reconstruction" else "vqascore")

    def describe(self) -> dict[str, Any]:
        return {"metric": self.name, "column": self.headline, "vlm": describe_model(self.vlm), "template": self.template,
                "on": self.on,
                "probability": "P(yes)/(P(yes)+P(no)) over Yes/yes, No/no" if self.normalise
                else "P(first answer token = 'Yes'), full-vocabulary softmax",
                "generator": describe_model(self.generator) if self.generator else None}

    def _probability(self, ctx: Context, images: LazyImages, keys: list[str], captions: list[str]) -> list[float]:
        asks = [(k, self.template.replace("{caption}", c.strip())) for k, c in zip(keys, captions)]
        return yes_probabilities(ctx, self.vlm, asks, images, normalise=self.normalise)

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        captions = [it.caption for it in items]
        images = LazyImages()
        rows: list[dict[str, Any]] = [{} for _ in items]
        if self.on in {"image", "both"}:
            keys = [images.add(it.image_key, lambda it=it: it.image) for it in items]
            for row, p in zip(rows, self._probability(ctx, images, keys, captions)):
                row[self.column or "vqascore"] = p
        if self.on in {"reconstruction", "both"}:
            recons = ctx.reconstructor(self.generator, self.spec).reconstruct(items)
            probs = self._probability(ctx, images, [images.add(r.key, r.image) for r in recons], captions)
            for row, r, p in zip(rows, recons, probs):
                row.update(r.record())
                row[self.column or "vqascore_recon"] = p
        return rows
