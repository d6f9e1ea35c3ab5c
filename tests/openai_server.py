"""A small OpenAI-compatible chat server for the tests only; it is not part of caprecon.

`transformers serve` speaks the same API but ignores `logprobs`/`top_logprobs`, and a
text-only model there drops images, so the probability paths of the OpenAI-compatible
backend cannot be exercised against it. This module serves a real (tiny, random-weight)
transformers causal LM over `/v1/chat/completions` with greedy decoding and
`logprobs`/`top_logprobs` taken from the model's full-vocabulary next-token softmax,
in the response shape vLLM and SGLang use. At a temperature above 0 it samples `n`
choices (with `top_p` and vLLM's extra `top_k`) from the request's `seed`, as a captioner asks.

The model reads text only. An image sent as a data URL is decoded and replaced by a
textual digest of it (the nearest named colour of each quadrant), so that two different
images give two different prompts and therefore different answers and probabilities.

For the failure-path tests, `POST /_test/faults` makes the server answer the next N
chat requests with an HTTP error, sleep before answering, or leave out logprobs the
way a server without logprobs support does, or answer with a scripted reply (`script`: a
list of {"token", "top": {token: logprob}} entries, the generated tokens and their top-k,
so a test controls the distribution at every position); `GET /_test/stats` counts the requests it
received, the most it had in flight at once (`DELETE /_test/stats` restarts that peak) and the
sampling fields of the last chat request (`last_sampling`: temperature, top_p, top_k, n, seed as sent).

`python tests/openai_server.py --model DIR --served-name NAME --port-file FILE` binds
127.0.0.1 on a free port and writes the port number to FILE; the server is ready once
`GET /health` answers.
"""

from __future__ import annotations

import argparse
import base64
import io
import socket
import threading
import time
import uuid
from pathlib import Path

# Option letters and yes/no get a boosted output row (see `build_tiny_lm`), so they sit
# in the top-k of every next-token distribution the way they do for a real judge model.
MAX_MODEL_LEN = 2048  # what the fake server's /models listing reports, as vLLM's does
ANSWER_TOKENS = ["A", "B", "C", "D", "Yes", "No", "yes", "no"]
COLOURS = {
    "black": (0, 0, 0), "white": (255, 255, 255), "red": (255, 0, 0), "green": (0, 255, 0),
    "blue": (0, 0, 255), "yellow": (255, 255, 0), "cyan": (0, 255, 255), "magenta": (255, 0, 255),
}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def build_tiny_lm(folder: str | Path, seed: int = 0) -> Path:
    """Save a tiny random-weight LLaMA with a locally trained byte-level BPE tokenizer."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = Path(folder)
    words = ANSWER_TOKENS + list(COLOURS) + (
        "the a an image picture photo of is in on with and or Answer Question Caption Options "
        "letter only single word what colour shows dog cat person sky tree car left right top bottom"
    ).split()
    # Each word both line-initial and after a space, so "Yes" and " Yes" both become tokens.
    corpus = [f"{w} {v}" for w in words for v in words[:12]] * 3
    specials = ["<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|end|>")
    tokenizer.chat_template = CHAT_TEMPLATE

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=False, initializer_range=0.2,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        # A constant feature in every input embedding that only the answer tokens' output
        # rows read: answers get a large shared logit, while the rest of each row (random)
        # still makes their relative order depend on the prompt.
        model.model.embed_tokens.weight[:, 0] = 3.0
        model.lm_head.weight[:, 0] = 0.0
        boosted = {tok.token_to_id(t) for w in ANSWER_TOKENS for t in (w, "\u0120" + w)} - {None}
        model.lm_head.weight[sorted(boosted), 0] = 4.0
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def image_digest(data_url: str) -> str:
    """A few words that depend on the picture: the nearest named colour per quadrant."""
    from PIL import Image

    header, _, payload = data_url.partition(",")
    if not header.startswith("data:image/") or ";base64" not in header:
        raise ValueError("only base64 data:image/... URLs are accepted")
    image = Image.open(io.BytesIO(base64.b64decode(payload, validate=True))).convert("RGB").resize((2, 2), Image.BOX)
    names = []
    for pixel in image.getdata():
        names.append(min(COLOURS, key=lambda n: sum((a - b) ** 2 for a, b in zip(pixel, COLOURS[n]))))
    return "image " + " ".join(names)


def create_app(model_dir: str, served_name: str):
    import torch
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    # One request at a time through the model: no cross-request batching, so an answer
    # never depends on what else was in flight.
    model_lock = threading.Lock()
    faults = {"fail_next": 0, "status": 503, "delay": 0.0, "logprobs": True, "script": None}
    stats = {"chat_requests": 0, "in_flight": 0, "max_in_flight": 0, "last_sampling": None}
    stats_lock = threading.Lock()
    app = FastAPI()

    def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

    def token_entry(token_id: int, logprob: float) -> dict:
        text = tokenizer.decode([token_id])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    def flatten(content) -> str:
        if isinstance(content, str):
            return content
        parts = []
        for part in content:
            if part.get("type") == "text":
                parts.append(part["text"])
            elif part.get("type") == "image_url":
                url = part["image_url"]["url"] if isinstance(part["image_url"], dict) else part["image_url"]
                parts.append(image_digest(url))
            else:
                raise ValueError(f"unsupported content part type {part.get('type')!r}")
        return "\n".join(parts)

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    def list_models():
        return {"object": "list", "data": [{"id": served_name, "object": "model", "owned_by": "caprecon-tests",
                                                    "max_model_len": MAX_MODEL_LEN}]}

    @app.post("/_test/faults")
    def set_faults(body: dict):
        faults.update(body)
        return faults

    @app.get("/_test/stats")
    def get_stats():
        return stats

    @app.delete("/_test/stats")
    def reset_stats():
        with stats_lock:
            stats["max_in_flight"] = stats["in_flight"]
        return stats

    @app.post("/v1/chat/completions")
    def chat(body: dict):
        with stats_lock:
            stats["chat_requests"] += 1
            stats["in_flight"] += 1
            stats["max_in_flight"] = max(stats["max_in_flight"], stats["in_flight"])
            stats["last_sampling"] = {k: body[k] for k in ("temperature", "top_p", "top_k", "n", "seed") if k in body}
            fail = faults["fail_next"] > 0
            if fail:
                faults["fail_next"] -= 1
        try:
            if fail:
                return error(faults["status"], "injected failure", "server_error")
            return answer(body)
        finally:
            with stats_lock:
                stats["in_flight"] -= 1

    def answer(body: dict):
        if faults["delay"]:
            time.sleep(faults["delay"])
        if body.get("model") != served_name:
            return error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        n = int(body.get("n") or 1)
        if n < 1:
            return error(400, "n must be at least 1")
        temperature = float(body.get("temperature") or 0.0)
        top_k = int(body.get("top_logprobs") or 0)
        if not 0 <= top_k <= 20:
            return error(400, "top_logprobs must be between 0 and 20")
        max_new = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        try:
            messages = [{"role": m["role"], "content": flatten(m["content"])} for m in body["messages"]]
        except (KeyError, ValueError) as exc:
            return error(400, f"bad messages: {exc}")

        # temperature > 0 samples, like vLLM: `n` choices from the request's `seed`. One request at a
        # time holds the model, so seeding the process-wide generator here seeds this request alone.
        sampling = {"do_sample": True, "temperature": temperature, "top_p": float(body.get("top_p") or 1.0),
                    "top_k": int(body.get("top_k") or 0)} if temperature > 0 else {"do_sample": False}
        if faults["script"]:
            return scripted(faults["script"], top_k, bool(body.get("logprobs")))
        with model_lock, torch.no_grad():
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                return_dict=True)["input_ids"]
            if temperature > 0:
                torch.manual_seed(int(body["seed"]) if body.get("seed") is not None else time.time_ns())
            # greedy choices are all the same: generate one and repeat it
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                 num_return_sequences=n if temperature > 0 else 1, output_logits=True,
                                 return_dict_in_generate=True, **sampling)
        choices, generated = [], 0
        for index in range(n):
            row = index if temperature > 0 else 0
            new_ids = out.sequences[row, ids.shape[1]:].tolist()
            if tokenizer.eos_token_id in new_ids:  # rows that stopped early are padded after their stop token
                new_ids = new_ids[: new_ids.index(tokenizer.eos_token_id) + 1]
            generated += len(new_ids)
            finished = bool(new_ids) and new_ids[-1] == tokenizer.eos_token_id
            text_ids = new_ids[:-1] if finished else new_ids
            choice = {"index": index, "message": {"role": "assistant", "content": tokenizer.decode(text_ids)},
                      "finish_reason": "stop" if finished else "length", "logprobs": None}
            if body.get("logprobs") and faults["logprobs"]:
                content = []
                for step, token_id in enumerate(new_ids):  # the stop token too, as vLLM reports it
                    logprobs = torch.log_softmax(out.logits[step][row].float(), dim=-1)
                    top = torch.topk(logprobs, top_k) if top_k else None
                    entry = token_entry(token_id, float(logprobs[token_id]))
                    entry["top_logprobs"] = ([token_entry(int(i), float(v)) for v, i in zip(top.values, top.indices)]
                                             if top is not None else [])
                    content.append(entry)
                choice["logprobs"] = {"content": content}
            choices.append(choice)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": served_name, "choices": choices,
            "usage": {"prompt_tokens": ids.shape[1], "completion_tokens": generated,
                      "total_tokens": ids.shape[1] + generated},
        }

    def scripted(script: list[dict], top_k: int, logprobs: bool) -> dict:
        content = []
        for step in script:
            top = sorted(step["top"].items(), key=lambda kv: -kv[1])[:top_k]
            content.append({"token": step["token"], "logprob": step["top"].get(step["token"], -50.0),
                            "bytes": list(step["token"].encode()),
                            "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top]})
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": served_name,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "logprobs": {"content": content} if logprobs else None,
                             "message": {"role": "assistant", "content": "".join(s["token"] for s in script)}}]}

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-name", default="tiny")
    parser.add_argument("--port-file", required=True)
    args = parser.parse_args()

    app = create_app(args.model, args.served_name)
    # Bind before announcing the port, so the parent never races another process for it.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    Path(args.port_file).write_text(str(sock.getsockname()[1]))
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    main()
