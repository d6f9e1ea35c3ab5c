"""The public Python face of caprecon: what `import caprecon` offers.

    results = caprecon.score("captions.jsonl", metrics=["recon"], preset="fast", out="runs/a")
    recon = caprecon.ReconScore(generator=caprecon.DiffusersGenerator(...), embedder=caprecon.HFVisionEmbedder(...))
    recon(images, captions)

Everything here is defined in its own layer (docs/layout.md, "How the code is laid out");
this module chooses what is public, and holds the one call that chains two apps (`caption`: best-of-N
selection, then refinement), since apps do not import each other.
"""

from pathlib import Path
from typing import Any, Sequence

from caprecon.apps.cascade import CascadeResults, cascade
from caprecon.apps.cttd.importers import Imported, cttd_import
from caprecon.apps.cttd.pipeline import BuildResult, cttd_build
from caprecon.apps.demo import demo
from caprecon.apps.distill import Distilled, distill
from caprecon.apps.metabench.meta import MetaResults, meta
from caprecon.apps.refine import Refined, refine
from caprecon.apps.report import RunReport, report
from caprecon.apps.reward import AsyncReward, Guards, Reward
from caprecon.apps.reward.audit import Audit, reward_audit
from caprecon.apps.seeds import CompareResults, SeedsResults, compare, seeds
from caprecon.apps.selection import BestOfN, best_of_n, split_preset
from caprecon.apps.suites import SuiteResults, suite
from caprecon.apps.t2i import T2IResults, t2i
from caprecon.data.loaders import load_samples
from caprecon.data.samples import Sample
from caprecon.metrics import ClipImageScore, Context, Metric, ReconScore
from caprecon.metrics.captionqa import CaptionQA
from caprecon.metrics.clipscore import ClipS, ClipScore, RefClipScore
from caprecon.metrics.fleur import Fleur
from caprecon.metrics.claim_check import ClaimCheck
from caprecon.metrics.halluc import Hallucination
from caprecon.metrics.turing import CaptionTuringTest
from caprecon.metrics.vqascore import VQAScore
from caprecon.models.build import build
from caprecon.models.embedder import DreamSimEmbedder, HFVisionEmbedder
from caprecon.models.generator import DiffusersGenerator, GenerationRequest, RetrievalGenerator
from caprecon.reconstruct.reconstructor import ReconstructionSpec
from caprecon.run.folder import holds_run_folder
from caprecon.run.score import Results, score
from caprecon.run.shards import Merged, merge
from caprecon.run.stages import StageResults, stage
from caprecon.store.index import Store
from caprecon.store.maintenance import cache_info, cache_prune, cache_verify, merge_stores
from caprecon import rewards
from caprecon.apps.reward.remote import AsyncRemoteReward, RemoteReward, RemoteRewardError, verl_reward
from caprecon.apps.reward.serve import serve

__all__ = [
    "AsyncReward", "CaptionQA", "CaptionTuringTest", "ClaimCheck", "ClipImageScore", "ClipS", "ClipScore", "Context", "DiffusersGenerator", "DreamSimEmbedder", "Fleur", "GenerationRequest",
    "Guards", "HFVisionEmbedder", "Hallucination", "Metric", "RefClipScore", "VQAScore", "ReconScore", "ReconstructionSpec", "Results", "Reward", "RetrievalGenerator", "Sample", "Store", "build",
    "load_samples", "Refined", "refine", "score", "suite", "SuiteResults", "t2i", "T2IResults",
    "BestOfN", "caption", "compare", "CompareResults", "cttd_build", "BuildResult", "cttd_import", "Imported", "demo", "distill", "Distilled", "meta", "MetaResults", "report", "RunReport", "seeds", "SeedsResults", "stage", "StageResults", "merge", "Merged", "reward_audit", "Audit",
    "cascade", "CascadeResults",
    "cache_info", "cache_verify", "cache_prune", "merge_stores", "rewards",
    "RemoteReward", "AsyncRemoteReward", "RemoteRewardError", "verl_reward", "serve",
]


@holds_run_folder("out", inputs=("images",))
def caption(images: str | Path | Sequence[str | Path], *, captioner: Any = None,
            captioner_options: dict[str, Any] | None = None, select: Any = None, n: int | None = None,
            temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
            max_new_tokens: int | None = None, prompt: str | None = None, max_words: int | None = None,
            refine: int | None = None, margin: float = 0.0, feedback: str | Sequence[str] | None = None,
            holdout: float = 0.5, preset: str | None = None, config: str | Path | None = None,
            out: str | Path | None = None, progress: bool = False, **settings: Any) -> BestOfN:
    """`caprecon caption`: best-of-N selection (`best_of_n`, the same settings), then, with
    `refine=R` (1 to 100), each selected caption refined for up to R rounds by the captioner that wrote it,
    scored by the same selection, as `caprecon.refine` does (`margin`, `feedback`, `holdout` are
    its settings; written to OUT/refine). The refinement is in `BestOfN.refined`.

        run = caprecon.caption("photos/", captioner="qwen3-vl-8b", n=10, refine=2, out="runs/described")
    """
    from caprecon.apps.refine import check_settings, refine as refine_captions

    if refine is not None:  # before any caption is sampled
        check_settings(refine, margin, holdout)
    run = best_of_n(images, captioner=captioner, captioner_options=captioner_options, select=select, n=n,
                    temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens,
                    prompt=prompt, max_words=max_words, preset=preset, config=config, out=out, progress=progress,
                    **settings)
    if refine and run.selected:
        caption_preset, run_preset = split_preset(preset)
        rows = [{"id": r["image_id"], "image": r["image"], "image_id": r["image_id"], "caption": r["caption"]}
                for r in run.selected]
        run.refined = refine_captions(
            rows, captioner=captioner or caption_preset.get("captioner"), captioner_options=captioner_options,
            select=run.selection.weights, rounds=refine, margin=margin, feedback=feedback, holdout=holdout,
            out=run.out / "refine" if run.out else None, image_root=images if isinstance(images, (str, Path)) else None,
            preset=run_preset, config=config, progress=progress, **settings)
    return run
