"""The vLLM offline-engine backends: chat-completion requests go to an in-process `LLM.chat`
and its outputs are read back as the HTTP backends read a server's. A stand-in `vllm` module
checks the translation on any machine (vLLM itself is GPU-only and not installed here)."""

import math
import sys
import types
from types import SimpleNamespace

import pytest

from caprecon.models.vllm_engine import VLLMEngineLLM, VLLMEngineVLM


class FakeLLM:
    """Answers every conversation with the token "B" and a known top-3 distribution."""

    def __init__(self, model, **options):
        self.model, self.options, self.calls = model, options, []

    def chat(self, conversations, params, use_tqdm=False, **kw):
        self.calls.append((conversations, params, kw))
        top = {1: ("A", math.log(0.2)), 2: ("B", math.log(0.7)), 3: (" No", math.log(0.05))}
        logprobs = {tid: SimpleNamespace(logprob=lp, decoded_token=tok) for tid, (tok, lp) in top.items()}
        return [SimpleNamespace(outputs=[SimpleNamespace(text="B", token_ids=[2], finish_reason="stop",
                                                         logprobs=[logprobs] if p["logprobs"] else None)])
                for p in params]


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM
    module.SamplingParams = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


def test_engine_requests_and_answers_read_like_a_server(fake_vllm):
    llm = VLLMEngineLLM("some/model", engine={"max_model_len": 4096}, top_logprobs=3)
    probs = llm.option_probs(["Which? A or B", "Again?"], [["A", "B", "C"], ["B"]])
    # "C" is not among the top 3: unknown (NaN), read by the same rule as over a server
    assert probs[0][:2] == pytest.approx([0.2, 0.7]) and math.isnan(probs[0][2]) and probs[1] == pytest.approx([0.7])
    engine = llm._llm
    assert engine.model == "some/model" and engine.options == {"max_model_len": 4096}
    conversations, params, _ = engine.calls[0]
    assert len(conversations) == 2  # one batched call for the whole batch
    assert params[0]["logprobs"] == 3 and params[0]["max_tokens"] == 1 and params[0]["temperature"] == 0
    assert llm.generate(["Say B"]) == ["B"]
    assert engine.calls[1][1][0]["logprobs"] is None  # no probabilities asked for a free answer


def test_engine_fingerprint_and_pickling(fake_vllm):
    import pickle

    a = VLLMEngineVLM("some/model", engine={"max_model_len": 4096})
    b = VLLMEngineVLM("some/model", engine={"max_model_len": 8192})
    assert a.fingerprint != b.fingerprint  # engine settings can change answers
    assert "base_url" not in a.describe() and a.describe()["backend"] == "vllm-engine"
    a.check()  # builds the engine
    copy = pickle.loads(pickle.dumps(a))  # what a Ray actor receives: settings, never the engine
    assert copy._llm is None and copy.fingerprint == a.fingerprint

