"""The shared start of the prompts about one image in a transformers vision-language model: the
chat preamble and the image run once (`SharedPrefix`), and its key/value cache copied across
batches of the differing question suffixes, for scoring and for greedy decoding; and the logits
processor that reads the watched tokens' probabilities at each generated step (`StepProbs`)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from PIL import Image

from caprecon.models.llm import answer_rows


# processor outputs with one entry per input token: cut and extended along with input_ids
PER_TOKEN = ("attention_mask", "mm_token_type_ids", "token_type_ids")


@dataclass
class Prefix:
    """The shared start of one image's prompts, run once."""

    inputs: dict[str, Any]  # processor output cut to the shared tokens (image included)
    suffixes: list[list[int]]  # the rest of each prompt


class SharedPrefix:
    """The shared-prefix steps of `TransformersVLM` (a mixin): cutting an image's prompts into a
    common start and suffixes, running the start once, and running batches of suffixes on copies
    of its cache. The model class provides the loaded `_model` and `_processor`, `_process`,
    `device`, `batch_size`, `check_budget`, and what `_load` read of the model's forward
    (`_cache_arg`, `_keep_arg`)."""

    def _split_prefix(self, image: Image.Image, texts: list[str], raw: list[list[int]]) -> Prefix | None:
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
        for key in PER_TOKEN:
            if key in inputs:
                inputs[key] = inputs[key][:, :cut]
        inputs["input_ids"] = inputs["input_ids"][:, :cut]
        return Prefix(inputs, [r[common:] for r in raw])

    def _run_prefix(self, prefix: Prefix):
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
        return output_cache(out), start, length

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
        return out.logits[:, -keep:], output_cache(out), full_mask, positions[:, -1]

    def _rows_on_prefix(self, prefix: Prefix, targets: list[list[int]]):
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

    def _greedy_from_prefix(self, state, rows: list[list[int]], config, watch: list[int] | None):
        """Greedy decoding of one batch of suffixes on the prefix cache, step by step (the
        padding sits between prefix and suffix, which `generate` cannot express): each
        reply's token ids and, with `watch`, the watched tokens' probabilities per step."""
        import torch

        cache, start, length = state
        logits, cache, mask, last = self._suffix_batch(cache, start, length, rows, 1)
        eos = torch.tensor(config.eos_token_id)
        replies: list[list[int]] = [[] for _ in rows]
        steps = StepProbs(watch)
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
            logits, cache = out.logits, output_cache(out)
        return [(ids, [step[i] for step in steps.rows[: len(ids)]]) for i, ids in enumerate(replies)]


class StepProbs:
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


def output_cache(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values
