"""A distilled reward as a metric (`-m distilled:FOLDER`): the head `caprecon distill` trained,
over its frozen encoders' features, predicting the metric it was trained on. It needs no
generator: the image features are cached by image, the text features by caption."""

from __future__ import annotations

from typing import Any, Sequence

from caprecon.data.images import LoadedSample
from caprecon.metrics.base import Column, Context, Metric
from caprecon.store.index import content_key


class DistilledMetric(Metric):
    """`model` is a `caprecon.models.distilled.DistilledReward` (or the folder it was saved to, whose
    `module:Class` encoders load only with `allow_plugins`: the run's `--allow-plugins`)."""

    name = "distilled"

    def __init__(self, model: Any, *, allow_plugins: bool = False):
        if not hasattr(model, "predict"):
            from caprecon.models.distilled import DistilledReward

            model = DistilledReward.from_pretrained(model, allow_plugins=allow_plugins)
        self.model = model
        # a prediction of the metric it was trained on (unbounded: a regression head)
        self.columns = (Column(self.name, needs_source_image=True),)
        model.encoders  # noqa: B018 -- a missing or refused encoder stops the run before any work

    def describe(self) -> dict[str, Any]:
        config = self.model.config
        return {"metric": self.name, "distilled_from": config.get("metric"), "image_encoder": config["image_encoder"],
                "text_encoder": config["text_encoder"], "objective": config.get("objective"),
                "weights_digest": config.get("weights_digest")}

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        image_encoder, text_encoder = self.model.encoders
        images = ctx.embed(image_encoder, [it.image_key for it in items], lambda i: items[i].image)
        keys = [content_key("text-embedding", encoder=text_encoder.fingerprint, text=it.caption) for it in items]

        def compute(order: list[int]):
            with ctx.model_call():
                return list(text_encoder.embed_texts([items[i].caption for i in order]))

        texts = ctx.cached_arrays("text-embedding", keys, compute, model=text_encoder)
        with ctx.model_call():
            values = self.model.predict(images, texts)
        return [{self.name: float(v)} for v in values]
