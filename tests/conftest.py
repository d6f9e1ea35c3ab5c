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


@pytest.fixture
def opened(monkeypatch):
    """Every file path opened in this process from here on (os.open and open), resolved: a test of
    --image-root shows by it that a file outside was never read."""
    import builtins
    import io

    seen: list[Path] = []
    real_os_open, real_open = os.open, builtins.open

    def note(path):
        if isinstance(path, (str, bytes, os.PathLike)):
            seen.append(Path(os.fsdecode(path)).resolve())

    def os_open(path, *args, **kwargs):
        note(path)
        return real_os_open(path, *args, **kwargs)

    def spy_open(file, *args, **kwargs):
        note(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(io, "open", spy_open)
    return seen



CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium, headless, driven by Playwright (the report's and the docs' browser tests)."""
    import shutil

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("no Chromium installed (apt-get install chromium): the browser tests need one")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
