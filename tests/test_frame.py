"""`RunFrame`, what `refine` and `suite` open once their settings are checked: the store the cache
settings name (or the caller's), the folder's manifest (redacted, and none without a folder), the
clock the manifests read. Expected values follow the documented rules, written out here."""

from __future__ import annotations

import json
import time

from caprecon.run.config import RunConfig
from caprecon.run.frame import RunFrame
from caprecon.store.index import Store


def test_a_run_without_the_cache_keeps_its_results_in_its_folder(tmp_path):
    # the documented rule (`open_store`): with no_cache a fresh store in OUT/store, else the cache folder
    out = tmp_path / "run"
    frame = RunFrame.open(RunConfig.build(no_cache=True), out, started=time.time())
    assert frame.out_dir == out and frame.store.root == out / "store" and frame.ctx.store is frame.store
    cached = RunFrame.open(RunConfig.build(cache_dir=str(tmp_path / "cache")), str(out), started=time.time())
    assert cached.store.root == tmp_path / "cache" and cached.out_dir == out


def test_a_given_store_is_the_one_the_run_works_through(tmp_path):
    given = Store.fresh(tmp_path / "given")
    frame = RunFrame.open(RunConfig.build(cache_dir=str(tmp_path / "other")), None, started=time.time(), store=given)
    assert frame.store is given and frame.ctx.store is given and frame.out_dir is None
    assert not (tmp_path / "other").exists()


def test_the_manifest_is_written_redacted_and_only_with_a_folder(tmp_path):
    manifest = {"status": "running", "config": {"judge_options": {"api_key": "sk-frame-2222", "max_new_tokens": 8}}}
    unsaved = RunFrame.open(RunConfig.build(no_cache=True), None, started=time.time())
    assert unsaved.write_manifest(manifest) is None
    frame = RunFrame.open(RunConfig.build(no_cache=True), tmp_path / "run", started=time.time())
    path = frame.write_manifest(manifest)
    assert path == tmp_path / "run" / "manifest.json"
    assert json.loads(path.read_text()) == {"status": "running",
                                            "config": {"judge_options": {"api_key": "***", "max_new_tokens": 8}}}


def test_the_clock_counts_from_when_the_run_began(tmp_path):
    started = time.time() - 2.5
    frame = RunFrame.open(RunConfig.build(no_cache=True), None, started=started)
    assert frame.started_at == time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started))
    before = time.time()
    seconds = frame.seconds()
    assert round(before - started, 3) <= seconds <= round(time.time() - started, 3)
    assert seconds == round(seconds, 3)
