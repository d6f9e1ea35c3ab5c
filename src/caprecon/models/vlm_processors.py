"""What a transformers vision-language model is read with beside its weights: its processor
(`load_processor`, with the image-only variant where torchvision is missing), the tokenizer
helpers answer reading uses (`by_special_tokens`, `single_token_id`), and what its configuration
says about how it decodes (`decoding_shape`: encoder-decoder or not, whether prompts about one
image may share their start)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from caprecon.models.llm import special_tokens_flag


def by_special_tokens(tokenizer, texts: Sequence[str],
                      run: Callable[[list[int], bool], list[list[int]]]) -> list[list[int]]:
    """`run(indices, flag)` once per special-tokens setting (`special_tokens_flag`) on the
    indices of the texts that take it, so each setting is one tokenizer call; the rows it
    returns come back in the order of `texts`."""
    flags = [special_tokens_flag(tokenizer, t) for t in texts]
    out: list[list[int]] = [[] for _ in texts]
    for flag in (True, False):
        at = [j for j, f in enumerate(flags) if f == flag]
        if at:
            for j, row in zip(at, run(at, flag)):
                out[j] = row
    return out


def single_token_id(tokenizer, token: str) -> int:
    """The id of a vocabulary entry that is exactly `token` (a digit, a letter)."""
    found = tokenizer.convert_tokens_to_ids(token)
    if found is None or found == tokenizer.unk_token_id:
        ids = tokenizer(token, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ValueError(f"{token!r} is not one token of this tokenizer ({ids}); its probability per "
                             f"position cannot be read")
        found = ids[0]
    return int(found)


class ImageOnlyProcessor:
    """Mixin that removes the video processor from a multimodal processor class.

    Qwen-VL processors (and a few others) hold a video processor that imports
    torchvision, so `AutoProcessor` fails without it even for image-only use. The class
    made by `ImageOnlyProcessor.of(Qwen2VLProcessor)` loads only the checkpoint's image
    processor and tokenizer and otherwise behaves as the original: same chat template,
    same image-token expansion.
    """

    @classmethod
    def get_attributes(cls):
        return [a for a in super().get_attributes() if a != "video_processor"]

    @classmethod
    def of(cls, processor_class: type) -> type:
        return type(f"ImageOnly{processor_class.__name__}", (cls, processor_class), {})


def load_processor(target: str, revision: str | None = None, config=None):
    """`AutoProcessor.from_pretrained`, or its image-only variant where the processor
    wants a video processor that cannot be imported (torchvision missing)."""
    from transformers import AutoConfig, AutoProcessor
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING
    from transformers.utils import is_torchvision_available

    if not is_torchvision_available():
        config = config or AutoConfig.from_pretrained(target, revision=revision)
        processor_class = PROCESSOR_MAPPING.get(type(config), None)
        if processor_class is not None and "video_processor" in processor_class.get_attributes():
            return ImageOnlyProcessor.of(processor_class).from_pretrained(target, revision=revision)
    return AutoProcessor.from_pretrained(target, revision=revision)


# Architectures whose image reaches the language model only as tokens of a causal
# decoder's input, so the key/value states of the prompt up to and including the image
# do not depend on the question that follows. Excluded on purpose: InstructBLIP (its
# Q-Former reads the question), PaliGemma (bidirectional attention over the whole
# prompt), Idefics 1 and Mllama (gated cross-attention). Models with sliding-window
# layers are excluded at load time whatever their type.
PREFIX_SAFE = frozenset({
    "llava", "llava_next", "llava_onevision", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe",
    "idefics2", "idefics3", "smolvlm", "gemma3", "mistral3", "aya_vision", "internvl",
})


def decoding_shape(config: Any, share_prefix: bool | None) -> tuple[bool, bool]:
    """(encoder_decoder, prefix_ok) of a model's configuration: whether its language model is an
    encoder-decoder, and whether its prompts about one image may share their start
    (`share_prefix`: None decides from the model type, `PREFIX_SAFE`, and refuses sliding-window
    layers; True is refused for an encoder-decoder)."""
    text = getattr(config, "text_config", None) or config
    encoder_decoder = bool(config.is_encoder_decoder or getattr(text, "is_encoder_decoder", False))
    if share_prefix and encoder_decoder:
        raise ValueError(f"share_prefix needs a decoder-only language model; {config.model_type} "
                         f"generates with an encoder-decoder")
    sliding = "sliding_attention" in (getattr(text, "layer_types", None) or []) or \
        getattr(text, "sliding_window", None) is not None
    prefix_ok = share_prefix if share_prefix is not None else \
        config.model_type in PREFIX_SAFE and not encoder_decoder and not sliding
    return encoder_decoder, prefix_ok
