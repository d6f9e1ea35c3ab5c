import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402

import tiny_models  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared"
FLICKR = SHARED / "data" / "flickr8k-dev"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def tiny_sd(tiny_dir):
    return tiny_models.build_tiny_sd(tiny_dir / "sd")


@pytest.fixture(scope="session")
def tiny_flux(tiny_dir):
    return tiny_models.build_tiny_flux(tiny_dir / "flux")


@pytest.fixture(scope="session")
def tiny_clip(tiny_dir):
    return tiny_models.build_tiny_clip(tiny_dir / "clip")


@pytest.fixture(scope="session")
def tiny_dinov2(tiny_dir):
    return tiny_models.build_tiny_dinov2(tiny_dir / "dinov2")


@pytest.fixture(scope="session")
def flickr_dir():
    if not FLICKR.exists():
        pytest.skip(f"{FLICKR} not present")
    return FLICKR
