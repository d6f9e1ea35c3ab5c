"""The text-only LLM role: CaptionQA answers, question generation, category naming.

The same operations as the vision-language role, without an image. The helpers below
the protocol (how an answer is tokenised as the start of a reply, greedy decoding
settings, reading log-probabilities out of a padded batch) are shared with the
vision-language backend (`vlm_transformers.py`, `vlm_processors.py`, `vlm_prefix.py`).
"""

from __future__ import annotations

import inspect
from functools import cached_property
from typing import Any, ClassVar, Protocol, Sequence, runtime_checkable

from caprecon.data.samples import SampleError
from caprecon.models.common import computation, dtype_name, resolve_device, resolve_source, torch_dtype


@runtime_checkable
class TextLLM(Protocol):
    @property
    def fingerprint(self) -> str: ...

    def generate(self, prompts: Sequence[str], max_new_tokens: int = 64) -> list[str]: ...

    def option_probs(self, prompts: Sequence[str], options: Sequence[Sequence[str]]) -> list[list[float]]: ...


# ---------------------------------------------------------------------------------------
# shared by the text and vision-language backends


def reply_text(prompt_text: str, answer: str) -> str:
    """`answer` as it starts the assistant's reply right after `prompt_text`.

    Chat templates that end their generation prompt with a newline ("<|im_start|>assistant\\n")
    are answered directly ("A"); prompts that end on a word or colon ("ASSISTANT:",
    "Answer:") are answered after a space (" A"), which most tokenisers fold into the
    first token ("ĠA", "▁A"). Scoring the wrong variant reads the probability of a token
    the model rarely starts a reply with.
    """
    if not prompt_text or prompt_text[-1].isspace() or answer[:1].isspace():
        return answer
    return " " + answer


def reply_token_ids(tokenizer, prompt_text: str, prompt_ids: list[int], answer: str,
                    add_special_tokens: bool) -> list[int]:
    """Token ids of `answer` as a continuation of the tokenised prompt (`reply_token_ids_batch`
    of one)."""
    return reply_token_ids_batch(tokenizer, [prompt_text], [prompt_ids], [answer], add_special_tokens)[0]


def reply_token_ids_batch(tokenizer, prompt_texts: Sequence[str], prompt_ids: Sequence[list[int]],
                          answers: Sequence[str], add_special_tokens: bool) -> list[list[int]]:
    """Token ids of each answer as a continuation of its tokenised prompt.

    The prompt and the prompt-plus-reply are tokenised as one text each and the reply's
    tokens are what the second adds, so merges and prefix-space conventions come out as
    the model saw them in training. If a merge crosses the boundary (the prompt's own
    tokens change) the reply is tokenised on its own instead. All the prompts-plus-replies
    go to the tokenizer in one call: one call per row cost more than the tokenising.
    """
    replies = [reply_text(text, answer) for text, answer in zip(prompt_texts, answers)]
    fulls = tokenizer([text + reply for text, reply in zip(prompt_texts, replies)],
                      add_special_tokens=add_special_tokens)["input_ids"] if replies else []
    out = []
    for full, ids, reply, answer in zip(fulls, prompt_ids, replies, answers):
        n = len(ids)
        if len(full) > n and full[:n] == ids:
            out.append(full[n:])
            continue
        alone = tokenizer(reply, add_special_tokens=False)["input_ids"]
        if not alone:
            raise ValueError(f"answer {answer!r} tokenises to nothing")
        out.append(alone)
    return out


def special_tokens_flag(tokenizer, text: str) -> bool:
    """Whether tokenising a rendered chat prompt should add special tokens: not when the
    template already wrote the BOS token (it would be doubled)."""
    bos = tokenizer.bos_token
    return not (bos is not None and text.startswith(bos))


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a reply: the generation config's (chat models often list the
    end-of-turn token there) and the tokenizer's."""
    ids: list[int] = []
    configured = getattr(model.generation_config, "eos_token_id", None)
    for value in ([configured] if isinstance(configured, int) else list(configured or [])) + [tokenizer.eos_token_id]:
        if value is not None and value not in ids:
            ids.append(int(value))
    if not ids:
        raise ValueError("the model has no end-of-sequence token: neither its generation config nor its "
                         "tokenizer names one")
    return ids


# `generate` fills the fields a GenerationConfig leaves unset from the checkpoint's own
# generation config (transformers 5), so penalties must be switched off explicitly
NO_PENALTIES = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0}


def greedy_config(model, tokenizer, max_new_tokens: int):
    """Plain greedy decoding: a checkpoint's sampling settings or repetition penalty
    cannot change the answers."""
    from transformers import GenerationConfig

    return GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=int(max_new_tokens), **NO_PENALTIES,
                            eos_token_id=eos_token_ids(model, tokenizer), pad_token_id=tokenizer.pad_token_id)


def ensure_pad_token(tokenizer) -> None:
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a padding nor an end-of-sequence token to pad batches with")
        tokenizer.pad_token = tokenizer.eos_token


def forward_accepts(model, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


def right_pad(rows: Sequence[Sequence[int]], pad_id: int):
    """(input_ids, attention_mask) with each row's tokens first: unpadded tokens keep the
    positions they would have alone, so no position ids are needed for any architecture."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def answer_rows(logits, starts: Sequence[int], counts: Sequence[int]):
    """Full-vocabulary log-probabilities at positions starts[i] .. starts[i]+counts[i]-1 of
    row i (float32: the softmax of a bf16 model is taken in full precision)."""
    import torch

    return [torch.log_softmax(logits[i, s : s + c].float(), dim=-1) for i, (s, c) in enumerate(zip(starts, counts))]


def option_first_ids(tokenizer, prompt_text: str, prompt_ids: list[int], options: Sequence[str],
                     add_special_tokens: bool) -> list[int]:
    if not options:
        raise ValueError("option_probs needs at least one option per prompt")
    return [reply_token_ids(tokenizer, prompt_text, prompt_ids, str(o), add_special_tokens)[0] for o in options]


def probs_of(logprob_rows, ids: Sequence[int]) -> list[float]:
    return [float(p) for p in logprob_rows[0].exp()[list(ids)]]


def sequence_prob(logprob_rows, target: Sequence[int]) -> float:
    import math

    return math.exp(sum(float(logprob_rows[j, t]) for j, t in enumerate(target)))


# ---------------------------------------------------------------------------------------


class TransformersIdentity:
    """What identifies a local transformers model that answers prompts (the text LLM and the
    VLM judge): its weights, dtype, system prompt and answer length make the fingerprint
    every cached answer is keyed by; `describe` adds where it runs. Subclasses name their
    `backend` and may add settings of their own to the description (`described_settings`)."""

    backend: str
    # bump in a subclass when a change to its prompting, decoding or scoring changes the answers
    code_revision: ClassVar[int] = 1
    numeric_libraries: ClassVar[tuple[str, ...]] = ("torch", "transformers")

    @property
    def fingerprint(self) -> str:
        return self.source.fingerprint(backend=self.backend, dtype=self.dtype_name,
                                       system_prompt=self.system_prompt, max_new_tokens=self.max_new_tokens,
                                       **computation(self))

    @property
    def dtype(self):
        return torch_dtype(self.dtype_name, self.device)

    def described_settings(self) -> dict[str, Any]:
        return {}

    @cached_property
    def text_budget(self) -> int | None:
        """The tokens the model reads at once: its language model's `max_position_embeddings`, read
        from the config file without loading weights; None where the config gives no such bound
        (T5's relative positions)."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(self.source.load_target, revision=self.source.revision)
        budget = getattr(config.get_text_config(), "max_position_embeddings", None)
        return int(budget) if budget else None

    def check_budget(self, lengths: Sequence[int]) -> None:
        """Refuse a batch holding an input longer than `text_budget`: nothing here truncates a
        prompt, and a rotary model past its context reads it without complaint, so an over-long
        caption would be read at positions the model never saw. The executor then tries the rows
        alone, and the long one becomes its row's error."""
        budget = self.text_budget
        longest = max(lengths, default=0)
        if budget is not None and longest > budget:
            raise SampleError(f"the model's input is {longest} tokens, over the text budget of "
                              f"{self.source.name}: {budget} tokens (max_position_embeddings); shorten the caption "
                              f"or use a model with a longer context (--preset detailed)", "prompt over the budget")

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend, "model": self.source.name, "revision": self.source.revision,
                "device": self.device, "dtype": self.dtype_name, "batch_size": self.batch_size,
                "max_new_tokens": self.max_new_tokens, "system_prompt": self.system_prompt,
                "text_budget": self.text_budget, **self.described_settings(), "fingerprint": self.fingerprint}


class TransformersLLM(TransformersIdentity):
    """A transformers causal LM (`AutoModelForCausalLM`): Qwen, Llama, Gemma, Mistral, ...

    Prompts go through the tokenizer's chat template when it has one (with
    `system_prompt` as the system turn), else they are used as written. Decoding is
    greedy; `option_probs` is the full-vocabulary next-token probability of each option's
    first token, as it would start the reply (see `reply_text`); `answer_prob` is the
    teacher-forced probability of the whole answer. Scoring batches are right-padded (no
    position ids to correct) and generation batches left-padded.
    """

    backend = "transformers-llm"

    def __init__(self, model, *, revision: str | None = None, device: str | None = "auto",
                 dtype: str | None = "auto", batch_size: int = 16, max_new_tokens: int = 64,
                 system_prompt: str | None = None):
        self.source = resolve_source(model, revision, kind="LLM")
        self.device = resolve_device(device)
        self.dtype_name = dtype_name(dtype, self.device)
        self.batch_size = max(1, int(batch_size))
        self.max_new_tokens = int(max_new_tokens)
        self.system_prompt = system_prompt
        self._model = None
        self._tokenizer = None


    def _load(self):
        if self._model is None:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            target, revision = self.source.load_target, self.source.revision
            self._tokenizer = AutoTokenizer.from_pretrained(target, revision=revision)
            ensure_pad_token(self._tokenizer)
            self._model = AutoModelForCausalLM.from_pretrained(target, revision=revision,
                                                               dtype=self.dtype).to(self.device).eval()
        return self._model, self._tokenizer

    def render(self, prompt: str) -> str:
        """The text the model reads for a user prompt."""
        _, tokenizer = self._load()
        if not tokenizer.chat_template:
            return prompt if self.system_prompt is None else f"{self.system_prompt}\n\n{prompt}"
        messages = [{"role": "user", "content": prompt}]
        if self.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _encode(self, prompts: Sequence[str]):
        _, tokenizer = self._load()
        out = []
        for p in prompts:
            text = self.render(p)
            flag = special_tokens_flag(tokenizer, text)
            out.append((text, tokenizer(text, add_special_tokens=flag)["input_ids"], flag))
        return out

    def _logprob_rows(self, sequences: list[list[int]], starts: list[int], counts: list[int]):
        import torch

        model, tokenizer = self._load()
        self.check_budget([len(s) for s in sequences])
        rows = []
        for lo in range(0, len(sequences), self.batch_size):
            ids, mask = right_pad(sequences[lo : lo + self.batch_size], tokenizer.pad_token_id)
            with torch.inference_mode():
                logits = model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
            rows += answer_rows(logits, starts[lo : lo + self.batch_size], counts[lo : lo + self.batch_size])
        return rows

    def option_probs(self, prompts: Sequence[str], options: Sequence[Sequence[str]]) -> list[list[float]]:
        if len(prompts) != len(options):
            raise ValueError(f"{len(prompts)} prompts but {len(options)} option lists")
        _, tokenizer = self._load()
        encoded = self._encode(prompts)
        first = [option_first_ids(tokenizer, text, ids, opts, flag)
                 for (text, ids, flag), opts in zip(encoded, options)]
        rows = self._logprob_rows([ids for _, ids, _ in encoded], [len(ids) - 1 for _, ids, _ in encoded],
                                  [1] * len(encoded))
        return [probs_of(r, f) for r, f in zip(rows, first)]

    def answer_prob(self, prompts: Sequence[str], answers: Sequence[str]) -> list[float]:
        if len(prompts) != len(answers):
            raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
        _, tokenizer = self._load()
        encoded = self._encode(prompts)
        targets = [reply_token_ids(tokenizer, text, ids, a, flag) for (text, ids, flag), a in zip(encoded, answers)]
        rows = self._logprob_rows([ids + t for (_, ids, _), t in zip(encoded, targets)],
                                  [len(ids) - 1 for _, ids, _ in encoded], [len(t) for t in targets])
        return [sequence_prob(r, t) for r, t in zip(rows, targets)]

    def generate(self, prompts: Sequence[str], max_new_tokens: int | None = None) -> list[str]:
        import torch

        model, tokenizer = self._load()
        config = greedy_config(model, tokenizer, self.max_new_tokens if max_new_tokens is None else max_new_tokens)
        texts = [self.render(p) for p in prompts]
        out: list[str] = []
        for lo in range(0, len(texts), self.batch_size):
            chunk = texts[lo : lo + self.batch_size]
            batch = tokenizer(chunk, return_tensors="pt", padding=True, padding_side="left",
                              add_special_tokens=special_tokens_flag(tokenizer, chunk[0])).to(self.device)
            self.check_budget(batch["attention_mask"].sum(-1).tolist())
            with torch.inference_mode():
                generated = model.generate(**batch, generation_config=config)
            new = generated[:, batch["input_ids"].shape[1] :]
            out += [t.strip() for t in tokenizer.batch_decode(new, skip_special_tokens=True)]
        return out
