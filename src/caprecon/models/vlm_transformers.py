"""The transformers backend of the vision-language judge role (`vlm.py`): any
`AutoModelForImageTextToText` checkpoint (`TransformersVLM`): loading, prompts, scoring answers
and greedy generation. Its processor loading and tokenizer helpers are in `vlm_processors`, the
shared start of an image's prompts in `vlm_prefix`."""

from __future__ import annotations

from functools import cached_property
from typing import Any, Sequence

from PIL import Image

from caprecon.data.qa import judge_box_coords
from caprecon.models.common import dtype_name, resolve_device, resolve_source
from caprecon.models.llm import (TransformersIdentity, answer_rows, ensure_pad_token, forward_accepts, greedy_config,
                                 probs_of, reply_token_ids_batch, right_pad, sequence_prob, special_tokens_flag)
from caprecon.models.vlm import VLMRequest, check_box_coords, group_by_image
from caprecon.models.vlm_prefix import PER_TOKEN, SharedPrefix, StepProbs
from caprecon.models.vlm_processors import by_special_tokens, decoding_shape, load_processor, single_token_id


class TransformersVLM(SharedPrefix, TransformersIdentity):
    """Any transformers `AutoModelForImageTextToText` checkpoint as the judge.

    Prompts go through the processor's chat template (image first, then the request's
    prompt; `system_prompt` as the system turn) where it has one; processors without
    one (InstructBLIP, PaliGemma) get the prompt as written, after the image
    placeholder where the processor has one. Decoding is greedy.

    All requests about one image are answered together. Where the architecture allows
    (`share_prefix`: None decides from the model type, see `PREFIX_SAFE`), the shared
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
            self._encoder_decoder, self._prefix_ok = decoding_shape(config, self.share_prefix)
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

    # -- scoring ------------------------------------------------------------------------------

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
            for key in PER_TOKEN[1:]:
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
            steps = StepProbs(watch)
            with torch.inference_mode():
                generated = model.generate(**inputs, generation_config=config, logits_processor=[steps])
            # the last len(steps) positions are the generated ones, whether the model returns the
            # prompt first (decoder-only) or a decoder start token (encoder-decoder)
            new = generated[:, generated.shape[1] - len(steps.rows) :].tolist()
            finish(indices, [(ids, [step[i] for step in steps.rows[: len(ids)]]) for i, ids in enumerate(new)])
        return out

