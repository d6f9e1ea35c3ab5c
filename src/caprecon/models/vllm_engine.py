"""Judges, LLMs and captioners on vLLM's offline `LLM` engine, in this process (GPU only).

The OpenAI-compatible backends speak chat completions over HTTP to a `vllm serve` server;
these classes send the same requests to an in-process `vllm.LLM` instead, one batched
`LLM.chat` call per model batch, and read its answers back in the chat-completions shape,
so prompts, option matching and probability reading are the HTTP backends' own. Under
`--executor ray` each actor of a stage builds its own engine on its GPU share:

    caprecon score ... -m turing --executor ray --stage turing:workers=4,gpus=1 \\
        --judge caprecon.models.vllm_engine:VLLMEngineVLM --judge-opt model=Qwen/Qwen2.5-VL-7B-Instruct

Engine settings go in `engine` (a dict given in a --config file: tensor_parallel_size,
gpu_memory_utilization, max_model_len, ...). vLLM is not a dependency of caprecon: install
it on the GPU machines (`pip install vllm`); importing this module works without it, the
first model call needs it.
"""

from __future__ import annotations

from typing import Any

from caprecon.models.captioner import OpenAICompatCaptioner
from caprecon.models.openai_compat import OpenAICompatLLM, OpenAICompatVLM

_NO_SERVER = "http://in-process.vllm/v1"  # the HTTP backends want a base URL; nothing is ever sent there


class _Engine:
    """Replaces the HTTP transport of a chat backend with an in-process vLLM engine."""

    _backend = "vllm-engine"
    numeric_libraries = ("torch", "transformers", "vllm")  # in this process: their versions decide the answers

    def _setup_engine(self, engine: dict[str, Any] | None) -> None:
        self.engine_options = dict(engine or {})
        self._llm = None

    def _output_settings(self) -> dict[str, Any]:
        settings = {**super()._output_settings(), "engine": self.engine_options}  # type: ignore[misc]
        settings.pop("base_url", None)
        return settings

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_http": None, "_llm": None}  # each process builds its own engine

    def _engine(self):
        if self._llm is None:
            try:
                from vllm import LLM
            except ImportError:
                raise ImportError("the vllm-engine backend needs vLLM on a GPU machine: pip install vllm") from None
            self._llm = LLM(model=self.model, **self.engine_options)
        return self._llm

    @property
    def text_budget(self) -> int | None:
        """The engine's `max_model_len` where the options set it (vLLM refuses a longer prompt,
        which becomes its row's error, and never cuts one); None, the checkpoint's own, otherwise."""
        budget = self.engine_options.get("max_model_len")
        return int(budget) if budget else None

    def check(self) -> None:
        self._engine()

    def _chat_all(self, bodies: list[dict]) -> list[dict]:
        from vllm import SamplingParams

        bodies = [{**body, **self.extra_body} for body in bodies]
        params = [SamplingParams(max_tokens=b.get("max_tokens"), temperature=b.get("temperature", 0.0),
                                 top_p=b.get("top_p", 1.0), n=b.get("n", 1), seed=b.get("seed"),
                                 **({"top_k": b["top_k"]} if b.get("top_k") is not None else {}),
                                 logprobs=b.get("top_logprobs") if b.get("logprobs") else None) for b in bodies]
        template = bodies[0].get("chat_template_kwargs") if bodies else None
        outputs = self._engine().chat([b["messages"] for b in bodies], params, use_tqdm=False,
                                      **({"chat_template_kwargs": template} if template else {}))
        return [_as_chat_completion(output) for output in outputs]


def _as_chat_completion(output: Any) -> dict:
    """A vLLM `RequestOutput` in the shape of an OpenAI chat-completions response."""
    choices = []
    for index, completion in enumerate(output.outputs):
        choice: dict[str, Any] = {"index": index, "finish_reason": completion.finish_reason,
                                  "message": {"role": "assistant", "content": completion.text}}
        if completion.logprobs is not None:
            steps = []
            for token_id, step in zip(completion.token_ids, completion.logprobs):
                chosen = step.get(token_id)
                ranked = sorted(step.values(), key=lambda lp: -lp.logprob)
                steps.append({"token": chosen.decoded_token if chosen else "",
                              "logprob": chosen.logprob if chosen else None,
                              "top_logprobs": [{"token": lp.decoded_token, "logprob": lp.logprob} for lp in ranked]})
            choice["logprobs"] = {"content": steps}
        choices.append(choice)
    return {"choices": choices}


class VLLMEngineVLM(_Engine, OpenAICompatVLM):
    """A vision-language judge on an in-process vLLM engine."""

    def __init__(self, model: str, *, engine: dict[str, Any] | None = None, **options: Any):
        super().__init__(model, _NO_SERVER, max_concurrency=1, **options)
        self._setup_engine(engine)


class VLLMEngineLLM(_Engine, OpenAICompatLLM):
    """A text LLM (captionqa, probes) on an in-process vLLM engine."""

    def __init__(self, model: str, *, engine: dict[str, Any] | None = None, **options: Any):
        super().__init__(model, _NO_SERVER, max_concurrency=1, **options)
        self._setup_engine(engine)


class VLLMEngineCaptioner(_Engine, OpenAICompatCaptioner):
    """A captioner (`caprecon caption`) on an in-process vLLM engine."""

    def __init__(self, model: str, *, engine: dict[str, Any] | None = None, **options: Any):
        super().__init__(model, _NO_SERVER, max_concurrency=1, **options)
        self._setup_engine(engine)
