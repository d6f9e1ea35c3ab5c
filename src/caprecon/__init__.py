"""caprecon: caption evaluation by reconstruction.

    import caprecon
    results = caprecon.score("captions.jsonl", metrics=["recon"], preset="fast", out="runs/a")
    recon = caprecon.ReconScore(generator=..., embedder=...)
    recon(images, captions)
"""

import importlib
import logging
from typing import TYPE_CHECKING

# The public face (api.py) reaches every layer and loads numpy, PIL and the model libraries'
# glue; importing it on first use keeps `import caprecon` and `caprecon.core.errors` light.
if TYPE_CHECKING:
    from caprecon.api import *  # noqa: F403 -- seen by type checkers and the API reference

__version__ = "0.1.0"


def _mask_log_records() -> None:
    """Every record a caprecon logger makes goes through the one redactor (`core.redaction`) as it
    is made, whatever the entry point (command line, Python, a trainer's reward, a service) and
    whichever handler shows it: the application's, the root's, a test's. Installed around the
    record factory in place, so another library's factory keeps working under it; the redactor
    loads with the first record of caprecon's, so `import caprecon` stays light."""
    make = logging.getLogRecordFactory()
    if getattr(make, "masks_caprecon", False):
        return

    def record(name, *args, **kwargs):
        made = make(name, *args, **kwargs)
        if name == "caprecon" or name.startswith("caprecon."):
            from caprecon.core.redaction import redact_record

            redact_record(made)
        return made

    record.masks_caprecon = True
    logging.setLogRecordFactory(record)


_mask_log_records()


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
