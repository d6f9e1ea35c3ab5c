"""Text budgets: every role says how many caption tokens it reads, and no role cuts a long caption
silently (CLIP's and the generator's cuts are counted in test_clipscore and test_recon)."""

import json

import pytest

import caprecon
from caprecon.data.qa import load_qa_bank
from caprecon.data.samples import Sample
from caprecon.metrics.captionqa import CaptionQA
from caprecon.metrics.vqascore import VQAScore
from caprecon.models.generator import DiffusersGenerator
from caprecon.models.llm import TransformersLLM
from caprecon.models.registry import PRESETS, ROLES
from caprecon.models.vlm_transformers import TransformersVLM
from caprecon.run.config import RunConfig
from oracle import render
from tiny_vlm import build_qwen2_lm, build_qwen2_vl

CONTEXT = 256  # tokens: a short caption's prompt fits, a paragraph's does not
PARAGRAPH = "a red circle beside a blue square on a white table in the morning light " * 12


@pytest.fixture
def samples(tmp_path):
    source = tmp_path / "shapes.png"
    render("a red circle and a blue square", 64, 64).save(source)
    return [Sample(id="short", image=source, caption="a red circle and a blue square", image_id="shapes"),
            Sample(id="paragraph", image=source, caption=PARAGRAPH, image_id="shapes", candidate=1)]


def test_judge_reads_a_paragraph_whole_or_gives_the_row_an_error(tmp_path_factory, samples):
    judge = TransformersVLM(build_qwen2_vl(tmp_path_factory.mktemp("vl") / "short-context", context=CONTEXT))
    res = caprecon.score(samples, [VQAScore(judge)], no_cache=True)
    short, long = res.records
    assert 0 <= short["vqascore"] <= 1 and "error" not in short
    # read past its context the model would still answer: the row must fail instead, naming the budget
    assert "vqascore" not in long or long["vqascore"] is None
    assert f"text budget of {judge.source.name}: {CONTEXT} tokens" in long["error"]
    assert res.manifest["metrics"][0]["vlm"]["text_budget"] == CONTEXT


def test_text_llm_reads_a_paragraph_whole_or_gives_the_row_an_error(tmp_path_factory, tmp_path, samples):
    llm = TransformersLLM(build_qwen2_lm(tmp_path_factory.mktemp("lm") / "short-context", context=CONTEXT))
    (tmp_path / "bank.jsonl").write_text(json.dumps({"image_id": "shapes", "question": "Is there a square?",
                                                     "category": "perception", "type": "yesno", "answer": "yes"}))
    bank = load_qa_bank(tmp_path / "bank.jsonl")
    res = caprecon.score(samples, [CaptionQA(llm, bank, max_new_tokens=4)], no_cache=True)
    short, long = res.records
    assert "error" not in short and short["captionqa_n"] == 1
    assert f"{CONTEXT} tokens (max_position_embeddings)" in long["error"]
    assert llm.describe()["text_budget"] == CONTEXT


def test_budget_is_read_from_the_config_without_loading_weights(tmp_path_factory):
    judge = TransformersVLM(build_qwen2_vl(tmp_path_factory.mktemp("vl") / "default"))
    assert judge.describe()["text_budget"] == 4096 and judge._model is None


def test_generator_from_the_store_names_its_budget_from_the_files(tiny_sd, tiny_flux):
    sd = DiffusersGenerator(tiny_sd).describe()
    assert sd["text_budget"] == 77 and sd["text_budget_by_encoder"] == {"tokenizer": 77}
    flux = DiffusersGenerator(tiny_flux, max_sequence_length=512).describe()
    assert flux["text_budget_by_encoder"] == {"tokenizer": 77, "tokenizer_2": 512} and flux["text_budget"] == 77
    # T5's own length is set by the pipeline's default, which only the loaded pipeline says
    unknown = DiffusersGenerator(tiny_flux).describe()
    assert unknown["text_budget"] == "unknown until loaded"
    assert unknown["text_budget_by_encoder"]["tokenizer_2"] == "unknown until loaded"


def test_detailed_preset_holds_a_paragraph():
    preset = PRESETS["detailed"]
    for role in ("generator", "judge", "llm"):
        entry = ROLES[role][0][preset[role]]  # registry names, resolved without loading anything
        assert entry.text_budget is not None and entry.text_budget >= 300, role
    assert preset["generator_options"]["max_sequence_length"] == ROLES["generator"][0]["z-image-turbo"].text_budget
    assert preset["embedder"] in ROLES["embedder"][0]  # DINOv2: reads no text
    assert preset["clip"] is None  # no CLIP transformers loads here reads a paragraph
    config = RunConfig.build(preset="detailed")
    assert (config.generator, config.judge, config.llm) == ("z-image-turbo", "qwen3-vl-8b", "qwen3-8b")


def test_server_reports_its_served_context_or_none():
    from caprecon.models.openai_compat import OpenAICompatVLM

    assert OpenAICompatVLM("m", "http://127.0.0.1:9").describe()["text_budget"] is None  # nothing listens there
