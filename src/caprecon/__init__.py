"""caprecon: caption evaluation by reconstruction.

    import caprecon
    results = caprecon.score("captions.jsonl", metrics=["recon"], preset="fast", out="runs/a")
    recon = caprecon.ReconScore(generator=..., embedder=...)
    recon(images, captions)
"""

import importlib
from typing import TYPE_CHECKING

# The public face (api.py) reaches every layer and loads numpy, PIL and the model libraries'
# glue; importing it on first use keeps `import caprecon` and `caprecon.core.errors` light.
if TYPE_CHECKING:
    from caprecon.api import *  # noqa: F403 -- seen by type checkers and the API reference

__version__ = "0.1.0"


def __getattr__(name: str):
    if name.startswith("__") and name != "__all__":
        raise AttributeError(f"module 'caprecon' has no attribute {name!r}")
    api = importlib.import_module("caprecon.api")
    if name == "__all__":
        return api.__all__
    if name not in api.__all__:
        raise AttributeError(f"module 'caprecon' has no attribute {name!r}")
    value = getattr(api, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *importlib.import_module("caprecon.api").__all__})
