"""caprecon: caption evaluation by reconstruction.

    import caprecon
    results = caprecon.score("captions.jsonl", metrics=["recon"], preset="fast", out="runs/a")
    recon = caprecon.ReconScore(generator=..., embedder=...)
    recon(images, captions)
"""

from caprecon.api import Results, score
from caprecon.metrics import ClipImageScore, Context, Metric, ReconScore
from caprecon.models.embedder import DreamSimEmbedder, HFVisionEmbedder
from caprecon.models.generator import DiffusersGenerator, GenerationRequest, RetrievalGenerator
from caprecon.models.registry import build
from caprecon.reconstruct.reconstructor import ReconstructionSpec
from caprecon.data.samples import Sample, load_samples
from caprecon.store.index import Store

__version__ = "0.1.0"

__all__ = [
    "ClipImageScore", "Context", "DiffusersGenerator", "DreamSimEmbedder", "GenerationRequest", "HFVisionEmbedder",
    "Metric", "ReconScore", "ReconstructionSpec", "Results", "RetrievalGenerator", "Sample", "Store", "build",
    "load_samples", "score",
]
