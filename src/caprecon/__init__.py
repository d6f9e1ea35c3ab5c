"""caprecon: caption evaluation by reconstruction.

    import caprecon
    results = caprecon.score("captions.jsonl", metrics=["recon"], preset="fast", out="runs/a")
    recon = caprecon.ReconScore(generator=..., embedder=...)
    recon(images, captions)
"""

from .api import Results, score
from .metrics import ClipImageScore, Context, Metric, ReconScore
from .models.embedder import DreamSimEmbedder, HFVisionEmbedder
from .models.generator import DiffusersGenerator, GenerationRequest, RetrievalGenerator
from .models.registry import build
from .reconstruct import ReconstructionSpec
from .samples import Sample, load_samples
from .store import Store

__version__ = "0.1.0"

__all__ = [
    "ClipImageScore", "Context", "DiffusersGenerator", "DreamSimEmbedder", "GenerationRequest", "HFVisionEmbedder",
    "Metric", "ReconScore", "ReconstructionSpec", "Results", "RetrievalGenerator", "Sample", "Store", "build",
    "load_samples", "score",
]
