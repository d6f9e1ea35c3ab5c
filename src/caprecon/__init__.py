"""caprecon: caption evaluation by reconstruction.

    import caprecon
    results = caprecon.score("captions.jsonl", metrics=["recon"], preset="fast", out="runs/a")
    recon = caprecon.ReconScore(generator=..., embedder=...)
    recon(images, captions)
"""

from caprecon.api import *  # noqa: F403 -- the public face is chosen in api.py
from caprecon.api import __all__  # noqa: F401

__version__ = "0.1.0"
