"""Best-of-N caption selection (RemoteDescriber, the ReconScore paper) and its selection curve.

A captioner samples N candidate captions per image; every candidate is scored by one
metric or a weighted sum of several, through the ordinary scoring machinery (so the
store serves reconstructions, embeddings and judge answers already known); the best
candidate of each image is kept:

    run = best_of_n("photos/", captioner="qwen3-vl-8b", select="recon", n=10, temperature=0.8,
                    generator="z-image", embedder="dreamsim", out="runs/described")
    run.selected[0]["caption"]

All candidates of one image are reconstructed from the same noise (seed policy
`per-image`, or `fixed`), so their reconstructions differ only because their texts do.
Candidates are cached in the store under (captioner fingerprint, prompt, image content,
seed, n, sampling settings): a killed run starts again where it stopped.

The selection curve is what the candidate-count ablation measures, computed from one pool
without any new model call: the expected score of the caption selected from a uniformly
random n-subset of the N candidates, for n = 1..N. With the pool's scores in ascending
order s_(1) <= ... <= s_(N), the k-th is the best of a random n-subset with probability
C(k-1, n-1) / C(N, n), so E[best of n] = sum_k s_(k) C(k-1, n-1) / C(N, n) exactly.
"""

from __future__ import annotations

import csv
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence


from caprecon.run.config import RunConfig
from caprecon.run.roles import Roles
from caprecon.core.digests import keep_memo_in, memo_scoped
from caprecon.core.errors import ConfigError
from caprecon.metrics import build_metric
from caprecon.models import registry
from caprecon.models.common import release_memory
from caprecon.models.build import build_model
from caprecon.models.captioner import Sampling, complete_sampling, resolve_prompt
from caprecon.core.describe import describe_model
from caprecon.data.samples import IMAGE_SUFFIXES
from caprecon.core.records import write_jsonl_atomically
from caprecon.core.tables import number
from caprecon.run.folder import holds_run_folder, open_store, write_manifest
from caprecon.run.captioning import (
    Pool,
    Selection,
    export_parquet,
    generate_candidates,
    one_noise_per_image,
    select_best,
)

# what `best_of_n` does when neither the caller nor a captioning preset says otherwise; the
# temperature only where the captioner's checkpoint names none either, and top_p/top_k are the
# checkpoint's (off where it has none)
DEFAULTS: dict[str, Any] = {"prompt": "detailed", "n": 10, "temperature": 0.8, "max_new_tokens": 512,
                            "select": "recon"}


# ---------------------------------------------------------------------------------------
# the selection curve


def expected_best(scores: Sequence[float], n: int, values: Sequence[float] | None = None) -> float:
    """Expected `values` entry (default: the score) of the best-scoring candidate in a
    uniformly random n-subset of the pool. Ties go to the earlier candidate, as in
    `select_best`."""
    size = len(scores)
    if not 1 <= n <= size:
        raise ValueError(f"n must be between 1 and the pool size {size}, not {n}")
    values = scores if values is None else values
    # ascending by score; among equal scores the earlier candidate ranks higher, since it wins the tie
    order = sorted(range(size), key=lambda i: (scores[i], -i))
    subsets = math.comb(size, n)
    return math.fsum(values[i] * (math.comb(rank, n - 1) / subsets) for rank, i in enumerate(order))


def selection_curve(pools: Sequence[Sequence[float]], extra: Mapping[str, Sequence[Sequence[float]]] | None = None,
                    ) -> list[dict[str, Any]]:
    """One row per n = 1..max pool size: the mean over images (those with at least n scored
    candidates) of the expected selection score, and of each `extra` value of the selected
    candidate (e.g. each metric of a weighted selection). Pure arithmetic: no model calls."""
    extra = extra or {}
    rows = []
    for n in range(1, max((len(p) for p in pools), default=0) + 1):
        used = [i for i, p in enumerate(pools) if len(p) >= n]
        row: dict[str, Any] = {"n": n, "images": len(used),
                               "score": sum(expected_best(pools[i], n) for i in used) / len(used)}
        for name, values in extra.items():
            row[name] = sum(expected_best(pools[i], n, values[i]) for i in used) / len(used)
        rows.append(row)
    return rows


def curve_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    columns = list(rows[0]) if rows else ["n", "images", "score"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---:" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(number(row[c]) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def write_curve(rows: Sequence[Mapping[str, Any]], out_dir: str | Path, label: str = "score") -> dict[str, Path]:
    """`curve.csv`, `curve.md` and `curve.png` (the expected selected score against n)."""
    out_dir = Path(out_dir)
    paths = {"csv": out_dir / "curve.csv", "markdown": out_dir / "curve.md", "plot": out_dir / "curve.png"}
    columns = list(rows[0]) if rows else ["n", "images", "score"]
    with paths["csv"].open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    paths["markdown"].write_text(curve_markdown(rows), encoding="utf-8")
    plot_curve(rows, paths["plot"], label)
    return paths


def plot_curve(rows: Sequence[Mapping[str, Any]], path: str | Path, label: str = "score") -> Path:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # matplotlib is the optional `report` extra
        raise ImportError("the selection-curve plot needs matplotlib: pip install 'caprecon[report]'") from exc
    # a Figure without pyplot renders through Agg and leaves the process's backend alone
    fig = Figure(figsize=(5.5, 3.8), dpi=150)
    ax = fig.add_subplot()
    ns = [r["n"] for r in rows]
    ax.plot(ns, [r["score"] for r in rows], marker="o", color="tab:blue")
    ax.set_xticks(ns)
    ax.set_xlabel("candidates n")
    ax.set_ylabel(f"expected {label} of the selected caption")
    ax.grid(color="0.88", linewidth=0.7)
    ax.set_title("best-of-n selection curve", fontsize=11)
    fig.savefig(path, bbox_inches="tight", facecolor="white")
    return Path(path)


# ---------------------------------------------------------------------------------------
# candidates


def list_images(source: str | Path | Sequence[str | Path]) -> list[Path]:
    """The images of a folder (sorted by name), or the paths given."""
    if isinstance(source, (str, Path)):
        folder = Path(source)
        if not folder.is_dir():
            raise ConfigError(f"--images must be a folder of images: {folder} is not a folder")
        paths = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not paths:
            raise ConfigError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in {folder}")
        return paths
    return [Path(p) for p in source]


# ---------------------------------------------------------------------------------------
# the whole run


@dataclass
class BestOfN:
    """What `best_of_n` (and `caprecon.caption`) returns: every candidate, the caption selected per image,
    the selection curve, and with `caprecon.caption(refine=R)` the selected captions refined
    (`caprecon.apps.refine.Refined`, OUT/refine; this app does not import the refine app, so the field is untyped)."""

    candidates: list[dict[str, Any]]  # one per candidate, and one per image that could not be captioned
    selected: list[dict[str, Any]]  # one per image with a selected caption: the training set
    curve: list[dict[str, Any]]
    selection: Selection
    manifest: dict[str, Any]
    out: Path | None = None
    refined: Any = None


@holds_run_folder("out", inputs=("images",))
@memo_scoped
def best_of_n(images: str | Path | Sequence[str | Path], *, captioner: Any = None,
              captioner_options: dict[str, Any] | None = None, select: Any = None, n: int | None = None,
              temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
              max_new_tokens: int | None = None,
              prompt: str | None = None, max_words: int | None = None, preset: str | None = None,
              config: str | Path | None = None, out: str | Path | None = None, progress: bool = False,
              **settings: Any) -> BestOfN:
    """Caption every image N times, score every candidate, keep the best (see the module doc).

    `preset` is a captioning preset (`remote-describer`: the captioner, its sampling and
    the run preset that scores) or a run preset; `settings` are `RunConfig` fields for the
    scoring (generator, embedder, judge, template, seed, seed_policy, batch_size,
    cache_dir, no_cache, ...). `seed` seeds both the captions and the reconstructions.
    Sampling settings nobody set (neither the call nor the preset) are the captioner's own,
    from its checkpoint's generation config; the manifest records what was used and whence.
    """
    from caprecon.run.score import score

    started = time.time()
    caption_preset, run_preset = split_preset(preset)
    given = {"captioner": captioner, "prompt": prompt, "n": n, "temperature": temperature, "top_p": top_p,
             "top_k": top_k, "max_new_tokens": max_new_tokens, "select": select}
    chosen = {k: v if v is not None else caption_preset.get(k, DEFAULTS.get(k)) for k, v in given.items()}
    sampling_from = {k: "call" if given[k] is not None else "preset" if caption_preset.get(k) is not None else None
                     for k in ("temperature", "top_p", "top_k")}

    # everything that can be wrong with the configuration fails here, before any model runs
    selection = Selection.parse(chosen["select"])
    try:
        sampling = Sampling(float(chosen["temperature"]),
                            None if chosen["top_p"] is None else float(chosen["top_p"]),
                            int(chosen["max_new_tokens"]), None if chosen["top_k"] is None else int(chosen["top_k"]))
        prompt_text = resolve_prompt(chosen["prompt"], max_words)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    count = int(chosen["n"])
    if count < 1:
        raise ConfigError(f"--n must be at least 1, not {count}")
    if chosen["captioner"] is None:
        raise ConfigError("this run needs a captioner: set --captioner (see `caprecon models`) or "
                          "--preset remote-describer")
    cfg = RunConfig.build(preset=run_preset, file=config, metrics=selection.metrics, **settings)
    keep_memo_in(cfg.memo_folder)  # this run's memo of file digests, for this call alone (`memo_scoped`)
    one_noise_per_image(cfg, settings, "best-of-N")
    paths = list_images(images)
    # a folder confines every read to it, so a symbolic link out of it is that image's error; paths given
    # one by one are the caller's own choice
    root = Path(images) if isinstance(images, (str, Path)) else None
    model = build_model("captioner", chosen["captioner"], captioner_options)
    sampling, sampling_from = _captioners_sampling(model, sampling, sampling_from)
    # building the scoring models resolves their sources (weights load on first use), so a wrong
    # generator or judge stops the run here rather than after every image has been captioned
    roles = Roles(cfg)
    metrics = [build_metric(name, roles, cfg) for name in selection.metrics]
    out_dir = Path(out) if out else None
    store = open_store(cfg, out_dir)  # the same store the scoring below opens (a read-only cache: its overlay)
    captioner_info = describe_model(model)

    pools, caption_stats = generate_candidates(model, paths, prompt=prompt_text, n=count, sampling=sampling,
                                               seed=cfg.seed, store=store, images_per_call=cfg.batch_size,
                                               progress=progress, image_root=root)
    if isinstance(chosen["captioner"], str):
        del model  # built here: free its memory before the scoring models load
        release_memory()

    # under a root, a relative image path resolves against it: the root's own images, named relative to it
    samples = [{"id": f"{p.image_id}#{j}", "image": str(p.image.relative_to(root) if root else p.image),
                "caption": c, "image_id": p.image_id,
                "candidate_index": j, "caption_seed": p.seed}
               for p in pools if not p.error for j, c in enumerate(p.captions)]
    scoring = {**settings, "seed": cfg.seed, "seed_policy": cfg.seed_policy}
    results = score(samples, metrics=metrics, preset=run_preset, config=config, progress=progress, store=store,
                    images_root=root, **scoring) if samples else None
    headlines = dict(zip(selection.metrics, results.metric_names)) if results else {}
    candidates, selected, curve = _select(pools, results.records if results else [], selection, headlines)

    chosen_images = {s["image_id"] for s in selected}
    manifest = {
        **(results.manifest if results else {}),
        "config": cfg.to_dict(),
        "models": roles.describe(),
        "seconds": round(time.time() - started, 3),
        "captioner": captioner_info,
        "captioning": {"prompt": prompt_text, "n": count, "sampling": sampling.to_dict(),
                       "sampling_from": sampling_from, "seed": cfg.seed, "preset": preset,
                       "candidates": caption_stats},
        "selection": {"weights": selection.weights, "headlines": headlines, "images": len(pools),
                      "selected": len(selected), "unselected": [p.image_id for p in pools
                                                                if p.image_id not in chosen_images]},
        "noise": f"one reconstruction seed per image ({cfg.seed_policy}): candidates differ only by their text",
    }
    run = BestOfN(candidates, selected, curve, selection, manifest, out_dir)
    if out_dir:
        write_best_of_n(run, out_dir)
        from caprecon.reports.html import write_html_report

        write_html_report(out_dir)
    return run


def split_preset(preset: str | None) -> tuple[dict[str, Any], str | None]:
    """`--preset` as (captioning preset, run preset that scores): a captioning preset names its
    run preset; any other name is a run preset itself. `caption --refine` scores under the same one."""
    caption_preset = registry.CAPTION_PRESETS.get(preset or "", {})
    return caption_preset, caption_preset.get("run_preset", preset if not caption_preset else None)


def _captioners_sampling(model: Any, sampling: Sampling,
                         sampling_from: dict[str, str | None]) -> tuple[Sampling, dict[str, str]]:
    """The sampling the captioner will use: what the call or preset set, the rest from the
    checkpoint's generation config (`generation_defaults`, where the backend can read it), and
    where that has no temperature either, ours. `sampling_from` says whence each setting came:
    call, preset, captioner, default (ours), or server (left to an OpenAI-compatible server)."""
    read = getattr(model, "generation_defaults", None)
    try:
        own = read() if callable(read) else {}
    except ValueError as exc:
        raise ConfigError(f"captioner: {exc}") from None
    if sampling_from["temperature"] is None and own.get("temperature") is not None:
        sampling = replace(sampling, temperature=float(own["temperature"]))
    try:
        completed = complete_sampling(sampling, own)
    except ValueError as exc:
        raise ConfigError(f"captioner's generation config: {exc}") from None
    unknown = "server" if hasattr(model, "base_url") else "default"
    whence = {key: given or ("captioner" if key in own else "default" if key == "temperature" else unknown)
              for key, given in sampling_from.items()}
    return completed, whence


def _select(pools: Sequence[Pool], records: Sequence[dict[str, Any]], selection: Selection,
            headlines: Mapping[str, str]) -> tuple[list[dict], list[dict], list[dict]]:
    by_image: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_image.setdefault(record["image_id"], []).append(record)
    candidates, selected, curve_pools = [], [], []
    extra: dict[str, list[list[float]]] = {name: [] for name in selection.metrics} if not selection.is_single else {}
    for pool in pools:
        if pool.error:
            candidates.append({"image_id": pool.image_id, "image": str(pool.image), "error": pool.error})
            continue
        rows = [dict(r) for r in by_image.get(pool.image_id, [])]
        values = [selection.value(r, headlines) for r in rows]
        best = select_best(values)
        for j, (row, value) in enumerate(zip(rows, values)):
            row["score"] = value
            row["selected"] = j == best
            candidates.append(row)
        scored = [(row, value) for row, value in zip(rows, values) if value is not None]
        if best is None:
            continue
        curve_pools.append([value for _, value in scored])
        for name in extra:
            extra[name].append([row[headlines[name]] for row, _ in scored])
        chosen = rows[best]
        selected.append({
            "image": str(Path(pool.image).resolve()), "image_id": pool.image_id, "caption": chosen["caption"],
            "score": chosen["score"], "candidate": best,
            "scores": {name: chosen[headlines[name]] for name in selection.metrics},
            "candidates": [{"candidate": j, "caption": row["caption"], "score": row["score"]}
                           for j, row in enumerate(rows)],
        })
    return candidates, selected, selection_curve(curve_pools, extra)


def write_best_of_n(run: BestOfN, out_dir: str | Path) -> dict[str, Path]:
    """candidates.jsonl, selected.jsonl (+ .parquet with pyarrow), curve.csv/.md/.png, manifest.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"candidates": out_dir / "candidates.jsonl", "selected": out_dir / "selected.jsonl"}
    write_jsonl_atomically(paths["candidates"], run.candidates, allow_nan=True)
    write_jsonl_atomically(paths["selected"], run.selected, allow_nan=True)
    parquet = export_parquet(run.selected, out_dir / "selected.parquet")
    if parquet:
        paths["parquet"] = parquet
    if run.curve:
        label = next(iter(run.selection.weights)) if run.selection.is_single else "selection score"
        paths.update(write_curve(run.curve, out_dir, label))
    paths["manifest"] = write_manifest(out_dir, run.manifest)
    return paths
