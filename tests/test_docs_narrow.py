"""The API reference on a phone-sized screen (390 px): signatures and code blocks stay inside
their box, scrolling sideways there, and never widen the page.

Builds the site with mkdocs and drives Debian's `chromium` with playwright, as the report's
browser test does; skips where either is missing (`.ci/run` installs both).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 390

# Everything in the article that reaches past the screen's right edge without a box of its own
# that scrolls sideways (pre > code, a table's scroll wrapper) to hold it.
OVERFLOWING = """() => {
  const width = document.documentElement.clientWidth;
  const scrolls = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  const held = el => { for (let p = el.parentElement; p; p = p.parentElement) if (scrolls(p)) return true; return false; };
  return [...document.querySelectorAll('article *')]
    .filter(el => el.getBoundingClientRect().width && el.getBoundingClientRect().right > width + 1 && !scrolls(el) && !held(el))
    .map(el => `${el.tagName}: ${(el.textContent || '').trim().slice(0, 60)}`);
}"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)], cwd=ROOT, env=env,
                   check=True, timeout=300)  # fmt: skip
    return out


# the `browser` fixture is in conftest.py


def _narrow(browser, page_file: Path):
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    page.goto(page_file.as_uri())
    page.wait_for_load_state("load")
    return page


def test_api_reference_fits_a_390px_screen(site, browser):
    page = _narrow(browser, site / "reference" / "api" / "index.html")
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH
    assert page.evaluate(OVERFLOWING) == []
    # the long signatures are there, and scroll inside their own box rather than being cut
    wide = page.evaluate("""() => [...document.querySelectorAll('pre > code')]
        .filter(c => c.scrollWidth > c.clientWidth).map(c => getComputedStyle(c).overflowX)""")
    assert wide and set(wide) <= {"auto", "scroll"}


def test_the_check_sees_a_code_block_that_widens_the_page(site, browser):
    page = _narrow(browser, site / "reference" / "api" / "index.html")
    page.add_style_tag(content=".md-typeset pre > code { overflow: visible !important; }")
    assert page.evaluate(OVERFLOWING) != []
