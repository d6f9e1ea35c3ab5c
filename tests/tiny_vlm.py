"""Tiny random-weight checkpoints built entirely on this machine, for tests and benchmarks.

Nothing comes from a hub: the tokenizer is a byte-level BPE trained here on a few
sentences, the image processors are built from their classes with small sizes, and
the models are instantiated from configs small enough to run a forward pass in
milliseconds. Each builder writes a folder that the code under test loads through the
ordinary `from_pretrained(path)`.
"""

from __future__ import annotations

from pathlib import Path

# Enough text for the BPE merges to cover the words the tests use, so prompts stay short.
_CORPUS = [
    "You are a helpful assistant.",
    "Answer with the option's letter from the given choices directly.",
    "Answer the question using a single word or phrase.",
    "Answer yes or no. Is there a dog in the image? Is there a cat on the table?",
    "What colour is the car? How many people are there? Where is the bird?",
    "A. red B. blue C. green D. yellow A B C D Yes No yes no",
    "Give the bounding box as [x1, y1, x2, y2] of the red ball.",
    "USER: ASSISTANT: system user assistant 0 1 2 3 4 5 6 7 8 9 10 100",
    "The quick brown fox jumps over the lazy dog near a small house by the river.",
]

# A chat template in the ChatML style the Qwen family uses: images become a
# vision_start / image_pad / vision_end run that the processor expands.
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# LLaVA-1.5 style: "USER: <image>\n... ASSISTANT:"; the reply starts after a space.
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %} "
    "{% elif message['role'] == 'user' %}USER: "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>\n{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %} "
    "{% else %}ASSISTANT: "
    "{{ message['content'] if message['content'] is string else message['content'][0]['text'] }}</s>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)

QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                "<|image_pad|>", "<|video_pad|>"]
LLAVA_SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<image>"]
CHATML_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tokenizer(special_tokens: list[str], vocab_size: int = 400, **named):
    """A byte-level BPE tokenizer trained on `_CORPUS`, wrapped for transformers.

    `named` maps the tokenizer's roles (bos_token, eos_token, pad_token, ...) to entries
    of `special_tokens`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(_CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, **named)


def build_qwen2_vl(folder: str | Path, *, hidden: int = 64, layers: int = 2, vision_depth: int = 1,
                   image_side: int = 56, seed: int = 0, context: int = 4096) -> Path:
    """A Qwen2-VL checkpoint: ChatML template, M-RoPE, a `vision_depth`-layer vision tower.

    Images are resized to about `image_side`² pixels (sides multiples of 28, aspect
    kept), one image token per 28x28 pixels: a square image gets (image_side / 28)².
    """
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    folder = Path(folder)
    tok = build_tokenizer(QWEN_SPECIAL, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_SPECIAL}
    heads = 4
    config = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=2,
                         max_position_embeddings=context,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "mrope_section": _mrope_section(hidden // heads)},
                         bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|endoftext|>"]),
        vision_config=dict(depth=vision_depth, embed_dim=32, num_heads=2, hidden_size=hidden, mlp_ratio=2,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.save_pretrained(folder)
    pixels = image_side * image_side
    image_processor = Qwen2VLImageProcessorPil(min_pixels=pixels, max_pixels=pixels, patch_size=14,
                                               merge_size=2, temporal_patch_size=2)
    _save_qwen_processor(folder, image_processor, tok)
    return folder


def _mrope_section(head_dim: int) -> list[int]:
    """Split head_dim/2 rotary frequencies over (temporal, height, width) as Qwen does (1:1.5:1.5)."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def _save_qwen_processor(folder: Path, image_processor, tokenizer) -> None:
    """Write what `AutoProcessor.from_pretrained` reads for a Qwen2-VL processor.

    The processor class itself cannot be built here (its video processor needs
    torchvision), so its parts are saved one by one with the class name recorded.
    """
    import json

    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    image_processor.save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(QWEN_CHAT_TEMPLATE)
    (folder / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2VLProcessor"}))


def build_llava(folder: str | Path, *, hidden: int = 64, layers: int = 2, image_side: int = 28,
                patch: int = 7, seed: int = 0) -> Path:
    """A LLaVA-1.5 checkpoint: a tiny CLIP vision tower, "USER: <image>\\n... ASSISTANT:" prompts."""
    import torch
    from transformers import LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    folder = Path(folder)
    tok = build_tokenizer(LLAVA_SPECIAL, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    num_patches = (image_side // patch) ** 2
    config = LlavaConfig(
        text_config=dict(model_type="llama", vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=2, image_size=image_side, patch_size=patch,
                           projection_dim=32),
        image_token_id=tok.convert_tokens_to_ids("<image>"), vision_feature_layer=-2,
        vision_feature_select_strategy="default", image_seq_length=num_patches,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(folder)
    image_processor = LlavaImageProcessorPil(size={"shortest_edge": image_side},
                                             crop_size={"height": image_side, "width": image_side})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=patch,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=LLAVA_CHAT_TEMPLATE)
    processor.save_pretrained(folder)
    return folder


def build_qwen2_lm(folder: str | Path, *, hidden: int = 64, layers: int = 2, seed: int = 0,
                   context: int = 4096) -> Path:
    """A text-only Qwen2 causal LM with a ChatML chat template."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder = Path(folder)
    tok = build_tokenizer(CHATML_SPECIAL, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = QWEN_CHAT_TEMPLATE
    config = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=context, bos_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def build_instructblip_t5(folder: str | Path, *, hidden: int = 32, seed: int = 0) -> Path:
    """An InstructBLIP checkpoint with a Flan-T5-style encoder-decoder language model: a tiny
    ViT, a one-layer Q-Former reading the question, and a one-layer T5 (VQAScore's judge shape)."""
    import torch
    from transformers import InstructBlipConfig, InstructBlipForConditionalGeneration, InstructBlipProcessor
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil

    folder = Path(folder)
    queries, side = 4, 28
    # a large enough vocabulary for whole-word tokens ("Yes", "red"), as T5's has
    tok = build_tokenizer(["<pad>", "</s>", "<unk>"], vocab_size=1000, pad_token="<pad>", eos_token="</s>",
                          unk_token="<unk>")
    qformer_tok = build_tokenizer(["[PAD]", "[CLS]", "[SEP]", "[UNK]"], pad_token="[PAD]", cls_token="[CLS]",
                                  sep_token="[SEP]", unk_token="[UNK]")
    image_processor = BlipImageProcessorPil(size={"height": side, "width": side})
    processor = InstructBlipProcessor(image_processor=image_processor, tokenizer=tok, qformer_tokenizer=qformer_tok,
                                      num_query_tokens=queries)  # adds the <image> token to `tok`
    pad, eos = tok.pad_token_id, tok.eos_token_id
    config = InstructBlipConfig(
        vision_config=dict(hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=1,
                           num_attention_heads=2, image_size=side, patch_size=14),
        qformer_config=dict(vocab_size=len(qformer_tok), hidden_size=hidden, num_hidden_layers=1,
                            num_attention_heads=2, intermediate_size=hidden * 2, encoder_hidden_size=hidden,
                            pad_token_id=qformer_tok.pad_token_id),
        text_config=dict(model_type="t5", vocab_size=len(tok), d_model=hidden, d_kv=8, d_ff=hidden * 2,
                         num_layers=1, num_decoder_layers=1, num_heads=4, pad_token_id=pad, eos_token_id=eos,
                         decoder_start_token_id=pad, tie_word_embeddings=False, initializer_factor=0.5),
        num_query_tokens=queries, image_token_index=tok.convert_tokens_to_ids("<image>"),
    )
    torch.manual_seed(seed)
    model = InstructBlipForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.generation_config.decoder_start_token_id = pad
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
