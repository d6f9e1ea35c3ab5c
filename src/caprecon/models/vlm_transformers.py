"""The transformers backend of the vision-language judge role (`vlm.py`): any
`AutoModelForImageTextToText` checkpoint, its processor loading, and the tokenizer helpers
its answer reading uses."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Sequence

from PIL import Image

from caprecon.data.qa import judge_box_coords
from caprecon.models.common import dtype_name, resolve_device, resolve_source
from caprecon.models.llm import (TransformersIdentity, answer_rows, ensure_pad_token, forward_accepts, greedy_config, probs_of, reply_token_ids_batch, right_pad, sequence_prob, special_tokens_flag)
from caprecon.models.vlm import VLMRequest, check_box_coords, group_by_image


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


# processors


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
_PREFIX_SAFE = frozenset({
    "llava", "llava_next", "llava_onevision", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe",
    "idefics2", "idefics3", "smolvlm", "gemma3", "mistral3", "aya_vision", "internvl",
})

# processor outputs with one entry per input token: cut and extended along with input_ids
_PER_TOKEN = ("attention_mask", "mm_token_type_ids", "token_type_ids")


@dataclass
class _Prefix:
    """The shared start of one image's prompts, run once."""

    inputs: dict[str, Any]  # processor output cut to the shared tokens (image included)
    suffixes: list[list[int]]  # the rest of each prompt


class TransformersVLM(TransformersIdentity):
    """Any transformers `AutoModelForImageTextToText` checkpoint as the judge.

    Prompts go through the processor's chat template (image first, then the request's
    prompt; `system_prompt` as the system turn) where it has one; processors without
    one (InstructBLIP, PaliGemma) get the prompt as written, after the image
    placeholder where the processor has one. Decoding is greedy.

    All requests about one image are answered together. Where the architecture allows
    (`share_prefix`: None decides from the model type, see `_PREFIX_SAFE`), the shared
    start of the prompts — chat preamble and image — is run once and its key/value cache
    copied across a batch of the differing question suffixes, so the vision tower and
    the image tokens are computed once per image instead of once per question. Otherwise
    the questions are batched with the image repeated, right-padded for scoring and
    left-padded for generation; requests that do not share a prefix (one question per
    image, as VQAScore asks) go in batches across images, so a forward pass holds up to
    `batch_size` (image, prompt) pairs whatever the number of images. All give the same answers and probabilities as one
    call per request, within float tolerance.
    """

    backend = "transformers-vlm"

    def __init__(self, model, *, revision: str | None = None, device: str | None = "auto",
                 dtype: str | None = "auto", batch_size: int = 16, max_new_tokens: int = 64,
                 system_prompt: str | None = None, share_prefix: bool | None = None,
                 box_coords: str | None = None):
        self.source = resolve_source(model, revision, kind="vision-language model")
        self.box_coords_option = check_box_coords(box_coords)
        self.device = resolve_device(device)
        self.dtype_name = dtype_name(dtype, self.device)
        self.batch_size = max(1, int(batch_size))
        self.max_new_tokens = int(max_new_tokens)
        self.system_prompt = system_prompt
        self.share_prefix = share_prefix
        self._model = None
        self._processor = None
        self._frames: dict[tuple[int, int], tuple[int, int]] = {}
        self._frame: tuple[str, str] | tuple[()] | None = None  # the chat template around a prompt

    @cached_property
    def box_coords(self) -> str | None:
        """The convention of this judge's box answers: the `box_coords` option, else its model
        family's (Qwen3-VL/Qwen2-VL "1000", Qwen2.5-VL "pixel"); None when neither says."""
        if self.box_coords_option is not None:
            return self.box_coords_option
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(self.source.load_target, revision=self.source.revision)
        return judge_box_coords(config.model_type)

    def box_frame(self, size: tuple[int, int]) -> tuple[int, int]:
        """(width, height) of what the model sees for an image of `size` — what its pixel
        coordinates count — read from the processor's own output for a blank image of that
        size (Qwen2.5-VL: the smart-resized image, `image_grid_thw` × patch size)."""
        size = (int(size[0]), int(size[1]))
        if size not in self._frames:
            processor = self._processor or load_processor(self.source.load_target, self.source.revision)
            image_processor = processor.image_processor
            out = image_processor(images=[Image.new("RGB", size)], return_tensors="pt")
            if "image_grid_thw" in out:
                _, rows, cols = (int(v) for v in out["image_grid_thw"][0])
                patch = int(image_processor.patch_size)
                self._frames[size] = (cols * patch, rows * patch)
            else:
                height, width = out["pixel_values"].shape[-2:]
                self._frames[size] = (int(width), int(height))
        return self._frames[size]

    def described_settings(self) -> dict[str, Any]:
        return {"share_prefix": "auto" if self.share_prefix is None else self.share_prefix,
                "box_coords": self.box_coords}

    # -- loading -------------------------------------------------------------------------

    def _load(self):
        if self._model is None:
            from transformers import AutoConfig, AutoModelForImageTextToText

            target, revision = self.source.load_target, self.source.revision
            config = AutoConfig.from_pretrained(target, revision=revision)
            text = getattr(config, "text_config", None) or config
            self._encoder_decoder = bool(config.is_encoder_decoder or getattr(text, "is_encoder_decoder", False))
            if self.share_prefix and self._encoder_decoder:
                raise ValueError(f"share_prefix needs a decoder-only language model; {config.model_type} "
                                 f"generates with an encoder-decoder")
            sliding = "sliding_attention" in (getattr(text, "layer_types", None) or []) or \
                getattr(text, "sliding_window", None) is not None
            self._prefix_ok = self.share_prefix if self.share_prefix is not None else \
                config.model_type in _PREFIX_SAFE and not self._encoder_decoder and not sliding
            processor = load_processor(target, revision, config)
            ensure_pad_token(processor.tokenizer)
            model = AutoModelForImageTextToText.from_pretrained(target, revision=revision, dtype=self.dtype)
            self._cache_arg = "cache" if forward_accepts(model, "cache") else "past_key_values"
            self._keep_arg = forward_accepts(model, "logits_to_keep")
            self._processor = processor
            self._model = model.to(self.device).eval()
        return self._model, self._processor

    # -- prompts ---------------------------------------------------------------------------

    def render(self, prompt: str) -> str:
        """The text (before image-token expansion) the model reads for a user prompt."""
        _, processor = self._load()
        if getattr(processor, "chat_template", None):
            messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
            if self.system_prompt is not None:
                messages.insert(0, {"role": "system", "content": [{"type": "text", "text": self.system_prompt}]})
            return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # BLIP-2/InstructBLIP processors put the image's query tokens before the text themselves
        image_token = None if hasattr(processor, "num_query_tokens") else getattr(processor, "image_token", None)
        text = prompt if self.system_prompt is None else f"{self.system_prompt}\n\n{prompt}"
        return f"{image_token}\n{text}" if image_token else text

    def _render_all(self, prompts: list[str]) -> list[str]:
        """`render` of each prompt: the chat template is rendered once around a placeholder and
        each prompt set inside, where that gives what rendering it would (checked on a sample;
        a prompt with edge whitespace, which a template may trim, is rendered on its own)."""
        if self._frame is None:
            marker = "\x00caprecon-prompt\x00"
            head, found, tail = self.render(marker).partition(marker)
            self._frame = (head, tail) if found and marker not in tail and \
                self.render("a b") == f"{head}a b{tail}" else ()
        if not self._frame:
            return [self.render(p) for p in prompts]
        head, tail = self._frame
        return [f"{head}{p}{tail}" if p == p.strip() else self.render(p) for p in prompts]

    def _tokenize(self, text: str) -> list[int]:
        """The prompt's tokens before image expansion (the image placeholder is one token)."""
        return self._tokenize_all([text])[0]

    def _tokenize_all(self, texts: list[str]) -> list[list[int]]:
        """`_tokenize` of each text, in one tokenizer call per special-tokens setting."""
        tokenizer = self._processor.tokenizer
        return by_special_tokens(tokenizer, texts,
                                 lambda at, flag: tokenizer([texts[j] for j in at], add_special_tokens=flag)["input_ids"])

    def _process(self, texts: list[str], image: Image.Image | list[Image.Image],
                 padding_side: str = "right") -> dict[str, Any]:
        """Processor output for `texts`, each with its own copy of `image` (or its own entry of a
        list of images), on the device."""
        import torch

        tokenizer = self._processor.tokenizer
        images = image if isinstance(image, list) else [image] * len(texts)
        batch = self._processor(text=texts, images=images, return_tensors="pt", padding=True,
                                padding_side=padding_side, add_special_tokens=special_tokens_flag(tokenizer, texts[0]))
        return {k: (v.to(self.device, self.dtype) if torch.is_floating_point(v) else v.to(self.device))
                if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    # -- the shared prefix -------------------------------------------------------------------

    def _split_prefix(self, image: Image.Image, texts: list[str], raw: list[list[int]]) -> _Prefix | None:
        """Cut the prompts (`raw`: their `_tokenize`d ids) into a common start (processed once,
        with the image) and per-prompt suffixes; None where the image is not inside the common start."""
        common = min(len(r) for r in raw) - 1  # every suffix keeps at least the prompt's last token
        for r in raw[1:]:
            common = next((j for j in range(common) if r[j] != raw[0][j]), common)
        if common <= 0:
            return None
        inputs = self._process(texts[:1], image)
        ids = inputs["input_ids"][0].tolist()
        tail = len(raw[0]) - common
        image_ids = {getattr(self._processor, "image_token_id", None),
                     getattr(self._model.config, "image_token_id", None)}
        # the image must have been expanded inside the common start, and appear nowhere after it
        if ids[len(ids) - tail :] != raw[0][common:] or any(t in image_ids for r in raw for t in r[common:]):
            return None
        cut = len(ids) - tail
        for key in _PER_TOKEN:
            if key in inputs:
                inputs[key] = inputs[key][:, :cut]
        inputs["input_ids"] = inputs["input_ids"][:, :cut]
        return _Prefix(inputs, [r[common:] for r in raw])

    def _run_prefix(self, prefix: _Prefix):
        """Run the shared start: (its key/value cache, the position id of the first suffix
        token, its length in tokens)."""
        import torch

        model = self._model
        inner = getattr(model, "model", None)
        if hasattr(inner, "rope_deltas"):
            inner.rope_deltas = None  # M-RoPE models keep the last prompt's offset here: start clean
        kwargs = {"logits_to_keep": 1} if self._keep_arg else {}
        with torch.inference_mode():
            out = model(**prefix.inputs, use_cache=True, **kwargs)
        length = prefix.inputs["input_ids"].shape[1]
        # M-RoPE gives the image fewer positions than tokens: text after it continues from the
        # image's largest position, an offset the model records as rope_deltas
        deltas = getattr(inner, "rope_deltas", None)
        start = length + (int(deltas.reshape(-1)[0]) if deltas is not None else 0)
        return _output_cache(out), start, length

    def _suffix_batch(self, cache, start: int, length: int, rows: list[list[int]], keep: int):
        """Run left-padded suffixes on copies of the prefix cache. Returns the logits of the
        last `keep` positions, the cache, the attention mask and each row's last position."""
        import torch

        n, width = len(rows), max(len(r) for r in rows)
        pad = self._processor.tokenizer.pad_token_id
        ids = torch.full((n, width), pad, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
        positions = (start + mask.cumsum(-1) - 1).clamp(min=start)
        full_mask = torch.cat([torch.ones((n, length), dtype=torch.long), mask], dim=1)
        cache = copy.deepcopy(cache)
        cache.batch_repeat_interleave(n)
        kwargs = {"logits_to_keep": keep} if self._keep_arg else {}
        with torch.inference_mode():
            out = self._model(input_ids=ids.to(self.device), attention_mask=full_mask.to(self.device),
                              position_ids=positions.to(self.device), use_cache=True,
                              **{self._cache_arg: cache}, **kwargs)
        return out.logits[:, -keep:], _output_cache(out), full_mask, positions[:, -1]

    # -- scoring ------------------------------------------------------------------------------

    def _rows_on_prefix(self, prefix: _Prefix, targets: list[list[int]]):
        self.check_budget([prefix.inputs["input_ids"].shape[1] + len(s) + len(t)
                           for s, t in zip(prefix.suffixes, targets)])
        cache, start, length = self._run_prefix(prefix)
        rows = []
        for lo in range(0, len(targets), self.batch_size):
            chunk = targets[lo : lo + self.batch_size]
            seqs = [s + t for s, t in zip(prefix.suffixes[lo : lo + self.batch_size], chunk)]
            counts = [len(t) + 1 for t in chunk]
            logits, _, _, _ = self._suffix_batch(cache, start, length, seqs, max(counts))
            # left padding aligns the rows' ends: each needs its last len(target) + 1 positions
            rows += answer_rows(logits, [max(counts) - c for c in counts], counts)
        return rows

    def _rows_batched(self, images: list[Image.Image], texts: list[str], targets: list[list[int]]):
        """For each (image, prompt), full-vocabulary log-probabilities at its last token and at
        each target token (row j scores targets[j]), in right-padded batches."""
        import torch

        rows = []
        for lo in range(0, len(texts), self.batch_size):
            chunk = targets[lo : lo + self.batch_size]
            inputs = self._process(texts[lo : lo + self.batch_size], images[lo : lo + self.batch_size])
            lengths = inputs["attention_mask"].sum(-1).tolist()
            self.check_budget([n + len(t) for n, t in zip(lengths, chunk)])
            seqs = [inputs["input_ids"][i, :n].tolist() + t for i, (n, t) in enumerate(zip(lengths, chunk))]
            ids, mask = right_pad(seqs, self._processor.tokenizer.pad_token_id)
            inputs["input_ids"], inputs["attention_mask"] = ids.to(self.device), mask.to(self.device)
            for key in _PER_TOKEN[1:]:
                if key in inputs:  # the appended answer tokens are text: type 0
                    grown = torch.zeros_like(ids)
                    grown[:, : inputs[key].shape[1]] = inputs[key].cpu()
                    inputs[key] = grown.to(self.device)
            with torch.inference_mode():
                logits = self._model(**inputs).logits
            rows += answer_rows(logits, [n - 1 for n in lengths], [len(t) + 1 for t in chunk])
        return rows

    def _score(self, requests: Sequence[VLMRequest], make_targets) -> list:
        """Log-probability rows per request. `make_targets(indices, texts, ids)` gives the reply
        tokens to teacher-force after each of those requests' prompts. Several questions on one
        image run on the image's shared prefix where the model allows; every other request joins
        one padded batch across images, so one question per image (VQAScore) still fills a
        forward pass. The prompts are rendered, tokenised and given their targets all at once."""
        self._load()
        rows: list = [None] * len(requests)
        pooled: list[tuple[int, Image.Image, str, list[int]]] = []
        groups = group_by_image(requests)
        order = [i for _, indices in groups for i in indices]
        rendered = self._render_all([requests[i].prompt for i in order])
        tokens = self._tokenize_all(rendered)
        text_of, ids_of = dict(zip(order, rendered)), dict(zip(order, tokens))
        target_of = dict(zip(order, make_targets(order, rendered, tokens)))
        for image, indices in groups:
            image = image.convert("RGB")
            texts, targets = [text_of[i] for i in indices], [target_of[i] for i in indices]
            prefix = self._split_prefix(image, texts, [ids_of[i] for i in indices]) \
                if self._prefix_ok and len(texts) > 1 else None
            if prefix is not None:
                for i, r in zip(indices, self._rows_on_prefix(prefix, targets)):
                    rows[i] = r
            else:
                pooled += [(i, image, t, g) for i, t, g in zip(indices, texts, targets)]
        if pooled:
            score = self._decoder_rows if self._encoder_decoder else self._rows_batched
            indices, images, texts, targets = (list(c) for c in zip(*pooled))
            for i, r in zip(indices, score(images, texts, targets)):
                rows[i] = r
        return rows

    def _decoder_rows(self, images: list[Image.Image], texts: list[str], targets: list[list[int]]):
        """Encoder-decoder models (InstructBLIP-Flan-T5): the prompt and image go to the
        encoder, the reply is teacher-forced on the decoder after its start token, so row j
        is the decoder's distribution at step j (row 0: the first answer token)."""
        import torch

        start = self._decoder_start_id()
        rows = []
        for lo in range(0, len(texts), self.batch_size):
            chunk = targets[lo : lo + self.batch_size]
            inputs = self._process(texts[lo : lo + self.batch_size], images[lo : lo + self.batch_size])
            ids, mask = right_pad([[start, *t] for t in chunk], self._processor.tokenizer.pad_token_id)
            with torch.inference_mode():
                logits = self._model(**inputs, decoder_input_ids=ids.to(self.device),
                                     decoder_attention_mask=mask.to(self.device)).logits
            rows += answer_rows(logits, [0] * len(chunk), [len(t) + 1 for t in chunk])
        return rows

    def _decoder_start_id(self) -> int:
        config = self._model.config
        for source in (self._model.generation_config, getattr(config, "text_config", None), config):
            start = getattr(source, "decoder_start_token_id", None)
            if start is not None:
                return int(start)
        raise ValueError(f"{self.source.name}: an encoder-decoder model without a decoder_start_token_id")

    def _reply_ids(self, texts: list[str], ids: list[list[int]], answers: list[str]) -> list[list[int]]:
        """Each answer's tokens as the model's reply: after its prompt for a decoder-only model,
        on its own (the decoder's input) for an encoder-decoder one. One tokenizer call for all."""
        tokenizer = self._processor.tokenizer
        if self._encoder_decoder:
            replies = tokenizer(list(answers), add_special_tokens=False)["input_ids"] if answers else []
            for answer, reply in zip(answers, replies):
                if not reply:
                    raise ValueError(f"answer {answer!r} tokenises to nothing")
            return replies
        return by_special_tokens(tokenizer, texts, lambda at, flag: reply_token_ids_batch(
            tokenizer, [texts[j] for j in at], [ids[j] for j in at], [answers[j] for j in at], flag))

    def option_probs(self, requests: Sequence[VLMRequest], options: Sequence[Sequence[str]]) -> list[list[float]]:
        if len(requests) != len(options):
            raise ValueError(f"{len(requests)} requests but {len(options)} option lists")
        self._load()
        first: dict[int, list[int]] = {}

        def no_target(indices, texts, ids):
            if any(not options[i] for i in indices):
                raise ValueError("option_probs needs at least one option per prompt")
            asked = [(t, d, str(o)) for i, t, d in zip(indices, texts, ids) for o in options[i]]
            replies = iter(self._reply_ids(*(list(c) for c in zip(*asked))))
            for i in indices:
                first[i] = [next(replies)[0] for _ in options[i]]
            return [[] for _ in indices]

        rows = self._score(requests, no_target)
        return [probs_of(r, first[i]) for i, r in enumerate(rows)]

    def answer_prob(self, requests: Sequence[VLMRequest], answers: Sequence[str]) -> list[float]:
        if len(requests) != len(answers):
            raise ValueError(f"{len(requests)} requests but {len(answers)} answers")
        self._load()
        targets: dict[int, list[int]] = {}

        def answer_target(indices, texts, ids):
            for i in indices:
                if not answers[i]:
                    raise ValueError(f"request {i}: empty answer")
            for i, reply in zip(indices, self._reply_ids(texts, ids, [answers[i] for i in indices])):
                targets[i] = reply
            return [targets[i] for i in indices]

        rows = self._score(requests, answer_target)
        return [sequence_prob(r, targets[i]) for i, r in enumerate(rows)]

    # -- generation ----------------------------------------------------------------------------

    def generate(self, requests: Sequence[VLMRequest], max_new_tokens: int | None = None) -> list[str]:
        return [text for text, _, _ in self._greedy(requests, max_new_tokens, watch=None)]

    def generate_with_token_probs(self, requests: Sequence[VLMRequest], tokens: Sequence[str],
                                  max_new_tokens: int | None = None) -> list[dict[str, Any]]:
        """Greedy answer per request, with the full-vocabulary probability of each of `tokens`
        (single tokens of the vocabulary, e.g. the digits) at every generated position:
        {"text": the reply, "tokens": each generated token's text, "probs": per position,
        [P(t) for t in tokens]}."""
        tokenizer = self._load()[1].tokenizer
        watch = [single_token_id(tokenizer, t) for t in tokens]
        return [{"text": text, "tokens": steps, "probs": probs}
                for text, steps, probs in self._greedy(requests, max_new_tokens, watch)]

    def _greedy(self, requests: Sequence[VLMRequest], max_new_tokens: int | None, watch: list[int] | None):
        """(reply text, generated token texts, watched probabilities per position) per request."""
        import torch

        model, processor = self._load()
        tokenizer = processor.tokenizer
        limit = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        config = greedy_config(model, tokenizer, limit)
        eos = set(config.eos_token_id)
        out: list = [None] * len(requests)

        def finish(indices: list[int], replies: list[tuple[list[int], list[list[float]]]]) -> None:
            for i, (ids, probs) in zip(indices, replies):
                ids = ids[: next((k for k, t in enumerate(ids) if t in eos), len(ids))]  # cut at the first end
                out[i] = (tokenizer.decode(ids, skip_special_tokens=True).strip(),
                          [tokenizer.decode([t]) for t in ids], probs[: len(ids)] if watch is not None else [])

        pooled: list[tuple[int, Image.Image, str]] = []  # requests answered in left-padded batches across images
        for image, indices in group_by_image(requests):
            image = image.convert("RGB")
            texts = self._render_all([requests[i].prompt for i in indices])
            prefix = self._split_prefix(image, texts, self._tokenize_all(texts)) \
                if self._prefix_ok and len(texts) > 1 else None
            if prefix is None:
                pooled += [(i, image, t) for i, t in zip(indices, texts)]
                continue
            self.check_budget([prefix.inputs["input_ids"].shape[1] + len(s) for s in prefix.suffixes])
            state = self._run_prefix(prefix)
            replies: list[tuple[list[int], list[list[float]]]] = []
            for lo in range(0, len(texts), self.batch_size):
                replies += self._greedy_from_prefix(state, prefix.suffixes[lo : lo + self.batch_size], config, watch)
            finish(indices, replies)
        for lo in range(0, len(pooled), self.batch_size):
            indices, images, texts = (list(c) for c in zip(*pooled[lo : lo + self.batch_size]))
            inputs = self._process(texts, images, padding_side="left")
            self.check_budget(inputs["attention_mask"].sum(-1).tolist())
            steps = _StepProbs(watch)
            with torch.inference_mode():
                generated = model.generate(**inputs, generation_config=config, logits_processor=[steps])
            # the last len(steps) positions are the generated ones, whether the model returns the
            # prompt first (decoder-only) or a decoder start token (encoder-decoder)
            new = generated[:, generated.shape[1] - len(steps.rows) :].tolist()
            finish(indices, [(ids, [step[i] for step in steps.rows[: len(ids)]]) for i, ids in enumerate(new)])
        return out

    def _greedy_from_prefix(self, state, rows: list[list[int]], config, watch: list[int] | None):
        """Greedy decoding of one batch of suffixes on the prefix cache, step by step (the
        padding sits between prefix and suffix, which `generate` cannot express): each
        reply's token ids and, with `watch`, the watched tokens' probabilities per step."""
        import torch

        cache, start, length = state
        logits, cache, mask, last = self._suffix_batch(cache, start, length, rows, 1)
        eos = torch.tensor(config.eos_token_id)
        replies: list[list[int]] = [[] for _ in rows]
        steps = _StepProbs(watch)
        done = torch.zeros(len(rows), dtype=torch.bool)
        kwargs = {"logits_to_keep": 1} if self._keep_arg else {}
        for step in range(config.max_new_tokens):
            steps(None, logits[:, -1])
            nxt = logits[:, -1].argmax(-1).cpu()
            for i in torch.nonzero(~done).flatten().tolist():
                replies[i].append(int(nxt[i]))
            done |= torch.isin(nxt, eos)
            if bool(done.all()) or step + 1 == config.max_new_tokens:
                break
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.long)], dim=1)
            last = last + 1
            with torch.inference_mode():
                out = self._model(input_ids=nxt[:, None].to(self.device), attention_mask=mask.to(self.device),
                                  position_ids=last[:, None].to(self.device), use_cache=True,
                                  **{self._cache_arg: cache}, **kwargs)
            logits, cache = out.logits, _output_cache(out)
        return [(ids, [step[i] for step in steps.rows[: len(ids)]]) for i, ids in enumerate(replies)]


class _StepProbs:
    """A logits processor that changes nothing and keeps, at each generation step, each
    row's full-vocabulary probabilities of the watched token ids (only a count of the steps
    without them)."""

    def __init__(self, watch: list[int] | None):
        self.watch = watch
        self.rows: list[list[list[float]]] = []

    def __call__(self, input_ids, scores):
        import torch

        if self.watch is None:
            self.rows.append([[] for _ in range(scores.shape[0])])
        else:
            self.rows.append(torch.softmax(scores.float(), dim=-1)[:, self.watch].tolist())
        return scores


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


def _output_cache(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values
