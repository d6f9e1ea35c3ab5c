"""The public Python face of caprecon: what `import caprecon` offers.

    results = caprecon.score("captions.jsonl", metrics=["recon"], preset="fast", out="runs/a")
    recon = caprecon.ReconScore(generator=caprecon.DiffusersGenerator(...), embedder=caprecon.HFVisionEmbedder(...))
    recon(images, captions)

Everything here is defined in its own layer (docs/layout.md, "How the code is laid out");
this module only chooses what is public.
"""

from caprecon.apps.cascade import CascadeResults, cascade
from caprecon.apps.cttd.importers import Imported, cttd_import
from caprecon.apps.cttd.pipeline import BuildResult, cttd_build
from caprecon.apps.demo import demo
from caprecon.apps.distill import Distilled, distill
from caprecon.apps.metabench.meta import MetaResults, meta
from caprecon.apps.refine import Refined, refine
from caprecon.apps.report import RunReport, report
from caprecon.apps.reward import AsyncReward, Audit, Guards, Reward, reward_audit
from caprecon.apps.seeds import CompareResults, SeedsResults, compare, seeds
from caprecon.apps.selection import BestOfN, caption
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
from caprecon.run.score import Results, score
from caprecon.run.shards import Merged, merge
from caprecon.run.stages import StageResults, stage
from caprecon.store.index import Store
from caprecon.store.maintenance import cache_info, cache_prune, cache_verify, merge_stores
from caprecon import rewards
from caprecon.apps.remote import AsyncRemoteReward, RemoteReward, RemoteRewardError, verl_reward
from caprecon.apps.serve import serve

__all__ = [
    "AsyncReward", "CaptionQA", "CaptionTuringTest", "ClaimCheck", "ClipImageScore", "ClipS", "ClipScore", "Context", "DiffusersGenerator", "DreamSimEmbedder", "Fleur", "GenerationRequest",
    "Guards", "HFVisionEmbedder", "Hallucination", "Metric", "RefClipScore", "VQAScore", "ReconScore", "ReconstructionSpec", "Results", "Reward", "RetrievalGenerator", "Sample", "Store", "build",
    "load_samples", "Refined", "refine", "score", "suite", "SuiteResults", "t2i", "T2IResults",
    "BestOfN", "caption", "compare", "CompareResults", "cttd_build", "BuildResult", "cttd_import", "Imported", "demo", "distill", "Distilled", "meta", "MetaResults", "report", "RunReport", "seeds", "SeedsResults", "stage", "StageResults", "merge", "Merged", "reward_audit", "Audit",
    "cascade", "CascadeResults",
    "cache_info", "cache_verify", "cache_prune", "merge_stores", "rewards",
    "RemoteReward", "AsyncRemoteReward", "RemoteRewardError", "verl_reward", "serve",
]
