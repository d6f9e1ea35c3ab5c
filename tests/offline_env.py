"""What a benchmark sets before it imports anything: the offline environment (no hub call, no
download bar, transformers' warnings quiet). Benchmarks put `tests/` on the import path first
(the tiny models and stand-ins they share live here: `tiny_models`, `bench_common`, `oracle`, ...):

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import offline_env  # noqa: E402, F401  (first, before torch, transformers or caprecon)
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
