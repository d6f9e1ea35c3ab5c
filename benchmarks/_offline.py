"""Not a benchmark: what a benchmark sets before it imports anything. The offline environment
(no hub call, no download bar, transformers' warnings quiet) and `tests/` on the import path,
where the tiny models and stand-ins the benchmarks share live (`tiny_models`, `bench_common`,
`oracle`, ...).

    import _offline  # noqa: E402, F401  (first, before torch, transformers or caprecon)
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
TESTS = str(Path(__file__).resolve().parents[1] / "tests")
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
