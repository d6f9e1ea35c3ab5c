"""The run's shared models, one per role, built on first use from its `RunConfig` through the
one model builder, so every metric that needs the judge (say) gets the same one."""

from __future__ import annotations

import copy
from functools import cached_property
from typing import Any

from caprecon.core.describe import describe_model
from caprecon.core.errors import ConfigError
from caprecon.models.build import build_model
from caprecon.run.config import RunConfig


class Roles:
    """The run's models, built on first use from the configuration and shared by metrics."""

    def __init__(self, config: RunConfig):
        self.config = config

    def _build(self, role: str, spec: Any, options: dict[str, Any], setting: str) -> Any:
        if spec is None:  # a run can also take its models from a preset
            raise ConfigError(f"this run needs a {role}: set --{setting} (see `caprecon models`) or a --preset")
        return build_model(role, spec, options, setting=setting)

    @cached_property
    def generator(self):
        """The generator (the first, when the run names several)."""
        return self.generators[0]

    @cached_property
    def generators(self) -> list[Any]:
        """Every generator the run names (`--generator A --generator B`: an ensemble), each with
        the run's generator options."""
        specs = self.config.generator if isinstance(self.config.generator, list) else [self.config.generator]
        return [self._build("generator", spec, self.config.generator_options, "generator") for spec in specs]

    def with_generator(self, generator: Any) -> "Roles":
        """These roles with another generator; the models built so far stay shared."""
        other = copy.copy(self)  # its own __dict__: the cached models are shared, the generator replaced
        other.generator = generator
        return other

    @cached_property
    def embedder(self):
        return self._build("embedder", self.config.embedder, self.config.embedder_options, "embedder")

    @cached_property
    def clip(self):
        return self._build("embedder", self.config.clip, {}, "clip")

    @cached_property
    def clip_matcher(self):
        from caprecon.models.embedder import HFVisionEmbedder
        from caprecon.models.matcher import ClipMatcher

        if isinstance(self.clip, HFVisionEmbedder):  # the same CLIP as clip-image: one load, shared cache
            return ClipMatcher(image_embedder=self.clip)
        return self._build("matcher", self.config.clip, {}, "clip")

    @cached_property
    def judge(self):
        return self._build("judge", self.config.judge, self.config.judge_options, "judge")

    @cached_property
    def judges_for(self) -> dict[str, Any]:
        """Judges of single question categories (`judge_for`), each built with its own options."""
        built = {}
        for category, spec in self.config.judge_for.items():
            options = self.config.judge_for_options.get(category, {})
            built[category] = self._build("judge", spec, options, f"judge-for {category}=MODEL")
        return built

    @cached_property
    def llm(self):
        return self._build("llm", self.config.llm, self.config.llm_options, "llm")

    @cached_property
    def qa_bank(self):
        from caprecon.data.qa import load_qa_bank

        if not self.config.qa_bank:
            raise ConfigError("this metric needs a QA bank: set --qa-bank FILE (JSONL)")
        bank = load_qa_bank(self.config.qa_bank)
        if not bank:  # else every row would fail alike, one "no questions" error each
            raise ConfigError(f"{self.config.qa_bank}: the QA bank holds no questions")
        return bank

    def describe(self) -> dict[str, Any]:
        built = {}
        for name in ("generator", "embedder", "clip", "clip_matcher", "judge", "llm"):
            if name in self.__dict__:
                built[name] = describe_model(self.__dict__[name])
        if len(self.__dict__.get("generators", [])) > 1:
            built["generators"] = [describe_model(g) for g in self.__dict__["generators"]]
        for category, judge in self.__dict__.get("judges_for", {}).items():
            built[f"judge_for/{category}"] = describe_model(judge)
        return built
