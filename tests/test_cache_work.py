"""No work the cache already did: a cached run decodes no source image, and a run embeds
the reconstructions it generates from memory, with the same result as from the stored file."""

import hashlib
import json
import os

import numpy as np
from PIL import Image

import caprecon
import caprecon.data.images as images_module
from caprecon.metrics import Context
from caprecon.models.embedder import HFVisionEmbedder
from caprecon.models.generator import DiffusersGenerator
from caprecon.reconstruct.reconstructor import ReconstructionSpec
from caprecon.data.images import open_image
from caprecon.data.samples import Sample
from caprecon.store.images import read_verified
from caprecon.store.index import Store
from oracle import OracleGenerator, PixelEmbedder


def _samples(folder, n=5):
    rng = np.random.default_rng(1)
    rows = []
    for i in range(n):
        path = folder / f"img{i}.jpg"
        Image.fromarray(rng.integers(0, 255, (30 + 4 * i, 40, 3), dtype=np.uint8)).save(path)
        rows.append({"id": f"s{i}", "image": path.name, "caption": f"a red circle and a blue square, take {i}"})
    rows.append({"id": "broken", "image": "broken.jpg", "caption": "a green triangle"})
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg at all")
    path = folder / "samples.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def _score_into(samples, folder, out, batch_size=2):
    return caprecon.score(samples, ["recon"], generator=OracleGenerator(), embedder=PixelEmbedder(), max_side=32,
                          batch_size=batch_size, cache_dir=str(folder / "cache"), out=folder / out)


def _counting_decodes(monkeypatch):
    """What every image decode of this process was of (its `what`)."""
    decodes = []
    real = images_module.decode_bytes
    monkeypatch.setattr(images_module, "decode_bytes", lambda data, what: (decodes.append(what), real(data, what))[1])
    return decodes


def test_a_cached_run_decodes_no_source_image(tmp_path, monkeypatch):
    samples = _samples(tmp_path)
    decodes = _counting_decodes(monkeypatch)
    first = _score_into(samples, tmp_path, "first")
    assert len(decodes) == 6  # five photos and the broken file, each decoded once
    decodes.clear()
    again = _score_into(samples, tmp_path, "again")
    # the broken file never decoded, so it is tried again (and fails the same way); the rest are hashed only
    assert decodes == [f"image {tmp_path / 'broken.jpg'}"]
    assert again.manifest["cache"]["generated"] == 0 and again.manifest["cache"]["embedded"] == 0
    assert [r.get("recon") for r in again.records] == [r.get("recon") for r in first.records]
    assert [r.get("size") for r in again.records] == [r.get("size") for r in first.records]
    assert again.records[-1]["error_reasons"] == first.records[-1]["error_reasons"] == ["image not decodable"]


def test_a_cached_run_decodes_no_picture_that_several_rows_of_a_batch_share(tmp_path, monkeypatch):
    Image.fromarray(np.full((30, 40, 3), 200, dtype=np.uint8)).save(tmp_path / "shared.jpg")
    rows = [{"id": f"c{i}", "image": "shared.jpg", "caption": f"a grey wall, caption {i}"} for i in range(3)]
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(json.dumps(r) for r in rows))
    decodes = _counting_decodes(monkeypatch)
    first = _score_into(samples, tmp_path, "first", batch_size=3)
    decodes.clear()
    again = _score_into(samples, tmp_path, "again", batch_size=3)
    assert decodes == []  # the size recorded for the shared file serves each of its rows
    assert [r.get("recon") for r in again.records] == [r.get("recon") for r in first.records]
    assert [r.get("size") for r in again.records] == [r.get("size") for r in first.records]


def test_a_cached_run_reads_no_source_file_it_hashed_before(tmp_path, monkeypatch):
    samples = _samples(tmp_path)
    reads, opened = [], []
    real, real_open = images_module._read_limited, images_module._open_checked
    monkeypatch.setattr(images_module, "_read_limited", lambda fh, path, *rest: (reads.append(str(path)),
                                                                                  real(fh, path, *rest))[1])
    monkeypatch.setattr(images_module, "_open_checked", lambda path, limit: (opened.append(str(path)),
                                                                            real_open(path, limit))[1])
    first = _score_into(samples, tmp_path, "first")
    assert {str(tmp_path / f"img{i}.jpg") for i in range(5)} <= set(reads)
    reads.clear(), opened.clear()
    again = _score_into(samples, tmp_path, "again")
    # only the broken file is read again: it never decoded, so it is decoded (and fails) once more;
    # the others are not even opened (a stat shows them unchanged), where each was opened once before
    assert set(reads) == {str(tmp_path / "broken.jpg")}
    assert set(opened) == {str(tmp_path / "broken.jpg")}  # to decode it (and for the report's thumbnail)
    assert [r.get("recon") for r in again.records] == [r.get("recon") for r in first.records]



def test_a_cached_run_answers_remembered_files_in_line_and_hands_the_pool_only_work(tmp_path, monkeypatch):
    """The reading pool gets a row only when its file must be read and hashed or its picture
    decoded: a remembered file needs a stat, which costs less than the hand-over (a cached
    512-row run took twice as long with every row sent to the pool)."""
    import threading

    import caprecon.run.local as local

    samples = _samples(tmp_path)
    on_pool = []
    finish = local._BatchReader._finish

    def finish_on_pool(rest):
        assert threading.current_thread().name.startswith("caprecon-read")
        item = finish(rest)
        on_pool.append(item.sample.id if isinstance(item, images_module.LoadedSample) else str(item))
        return item

    monkeypatch.setattr(local._BatchReader, "_finish", staticmethod(finish_on_pool))
    decode = local._BatchReader._decode_unseen
    monkeypatch.setattr(local._BatchReader, "_decode_unseen", classmethod(
        lambda cls, item: (on_pool.append(f"decode {item.sample.id}"), decode(item))[1]))
    first = _score_into(samples, tmp_path, "first")
    # the first run: every file read and hashed on the pool, every picture decoded there
    assert sorted(on_pool) == sorted([f"s{i}" for i in range(5)] + ["broken"] + [f"decode s{i}" for i in range(5)]
                                     + ["decode broken"])
    on_pool.clear()
    again = _score_into(samples, tmp_path, "again")
    # again: the keys come from stats in line, the sizes from the cache; only the file that never
    # decoded is decoded (and fails) once more
    assert on_pool == ["decode broken"]
    assert [r.get("recon") for r in again.records] == [r.get("recon") for r in first.records]

def test_a_remembered_source_key_follows_the_files_content_and_keeps_the_root_check(tmp_path):
    import hashlib
    import os

    from caprecon.data.images import image_file_key, read_image
    from caprecon.data.samples import SampleError

    path = tmp_path / "a.png"
    Image.new("RGB", (8, 8), "red").save(path)
    first = hashlib.sha256(path.read_bytes()).hexdigest()
    assert image_file_key(path, tmp_path)[0] == first
    key, data = image_file_key(path, tmp_path)
    assert (key, data) == (first, None)  # remembered: the file is not read
    item = read_image(Sample(id="a", image=str(path), caption="red"))
    assert item.image_key == first and not item.decoded and item.image.getpixel((0, 0)) == (255, 0, 0)
    Image.new("RGB", (8, 8), "blue").save(path)  # new content, new size or modification time
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert image_file_key(path, tmp_path)[0] == hashlib.sha256(path.read_bytes()).hexdigest() != first
    other = tmp_path / "inside"
    other.mkdir()
    try:
        image_file_key(path, other)
    except SampleError as exc:
        assert exc.reason == "image outside --image-root"
    else:
        raise AssertionError("a remembered file outside the root was let through")


def test_sizes_known_without_decoding_follow_the_exif_orientation(tmp_path):
    """A rotated JPEG's recorded size is the upright one, as decoding it would give."""
    path = tmp_path / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees: 40x20 stored, 20x40 shown
    Image.new("RGB", (40, 20), (200, 10, 10)).save(path, exif=exif)
    rows = [Sample(id="r", image=path, caption="a red square")]
    store = Store(tmp_path / "cache")
    spec = {"max_side": 32}
    first = caprecon.score(rows, ["recon"], generator=OracleGenerator(), embedder=PixelEmbedder(),
                           cache_dir=str(store.root), **spec)
    again = caprecon.score(rows, ["recon"], generator=OracleGenerator(), embedder=PixelEmbedder(),
                           cache_dir=str(store.root), **spec)
    assert first.records[0]["size"] == again.records[0]["size"] == [16, 32]


def test_reconstructions_are_embedded_from_memory_as_from_the_stored_file(tmp_path, tiny_sd, tiny_dinov2):
    source = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(2).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(source)
    items = [open_image(Sample(id=str(i), image=source, caption=f"a house by a lake {i}")) for i in range(3)]
    ctx = Context(Store(tmp_path / "cache"))
    generator = DiffusersGenerator(tiny_sd, steps=2)
    embedder = HFVisionEmbedder(tiny_dinov2)
    recons = ctx.reconstructor(generator, ReconstructionSpec(max_side=32)).reconstruct(items)
    assert all(r.pixels is not None for r in recons)  # just generated: kept in memory
    from_memory = embedder.embed([r.image() for r in recons])
    from_files = embedder.embed([read_verified(r.path, r.checksum) for r in recons])
    np.testing.assert_array_equal(from_memory, from_files)
    for r in recons:
        assert r.image().tobytes() == read_verified(r.path, r.checksum).tobytes()
    cached = ctx.reconstructor(generator, ReconstructionSpec(max_side=32)).reconstruct(items)
    assert all(r.pixels is None for r in cached)  # found in the store: read from the file when needed


def _counting_encodes(monkeypatch):
    """Every thumbnail this process encodes, as (thread name, source)."""
    import threading

    from caprecon.store import thumbs as thumbs_module

    encodes = []
    real = thumbs_module._encode

    def counting(source, target, side, *rest):
        encodes.append((threading.current_thread().name, source))
        return real(source, target, side, *rest)

    monkeypatch.setattr(thumbs_module, "_encode", counting)
    return encodes


def test_report_thumbnails_are_made_beside_the_run_and_never_again(tmp_path, monkeypatch):
    """The first run's thumbnails are made from the pixels in memory while it works (no file
    is read for them: only the broken file is tried); a cached run into a new folder makes
    none — its thumbnails are links to the cache's; pruning the cache drops them."""
    samples = _samples(tmp_path)
    encodes = _counting_encodes(monkeypatch)
    _score_into(samples, tmp_path, "first")
    broken = str(tmp_path / "broken.jpg")
    assert {source for _, source in encodes} == {broken}  # only the unreadable file was read for a thumbnail
    first = sorted(p.name for p in (tmp_path / "first" / "report_files" / "thumbs").iterdir())
    assert len(first) == 10  # five photos and five reconstructions
    cached = {p.name: p for p in (tmp_path / "cache" / "thumbs").rglob("*.jpg")}
    assert sorted(cached) == first
    # every picture here is its own thumbnail (JPEGs and PNGs under 384 px and 64 KiB): the cache links
    # them all in one folder, not one folder per name's first two hex digits
    assert [p.name for p in (tmp_path / "cache" / "thumbs").iterdir()] == ["as-is"]
    assert all(path.parent.name == "as-is" for path in cached.values())
    stamps = {name: path.stat().st_mtime_ns for name, path in cached.items()}

    encodes.clear()
    _score_into(samples, tmp_path, "again")
    again = tmp_path / "again" / "report_files" / "thumbs"
    assert sorted(p.name for p in again.iterdir()) == first and {s for _, s in encodes} == {broken}
    for name in first:  # the cache's own files, linked, none made again
        assert (again / name).stat().st_ino == cached[name].stat().st_ino
        assert cached[name].stat().st_mtime_ns == stamps[name]
    assert caprecon.cache_info(tmp_path / "cache")["thumbnails"]["files"] == 10

    report = caprecon.cache_prune(tmp_path / "cache", max_size=0)
    assert report["thumbnails_removed"] == 10 and not list((tmp_path / "cache" / "thumbs").rglob("*.jpg"))
    _score_into(samples, tmp_path, "third")  # everything regenerated (pruned), thumbnails made again
    assert len(list((tmp_path / "third" / "report_files" / "thumbs").iterdir())) == 10


def test_a_cached_run_finds_the_links_a_cache_kept_by_their_names_folders_without_opening_a_source(
        tmp_path, monkeypatch):
    """Caches written before `as-is/` kept the links to pictures that are their own thumbnails in
    folders by their names' first two characters: a cached run into a new folder links those, opens
    no picture for them (neither a source nor a reconstruction) and adds nothing to the cache."""
    from caprecon.store import thumbs as thumbs_module

    samples = _samples(tmp_path)
    _score_into(samples, tmp_path, "first")
    thumbs = tmp_path / "cache" / "thumbs"
    for link in list((thumbs / "as-is").iterdir()):  # the layout of an older cache
        (thumbs / link.name[:2]).mkdir(exist_ok=True)
        link.rename(thumbs / link.name[:2] / link.name)
    (thumbs / "as-is").rmdir()
    before = {p.name: p.stat().st_ino for p in thumbs.rglob("*.jpg")}
    assert len(before) == 10
    reads = []
    real = thumbs_module.read_image_file
    monkeypatch.setattr(thumbs_module, "read_image_file", lambda path, *a, **k: (reads.append(str(path)),
                                                                                 real(path, *a, **k))[1])
    _score_into(samples, tmp_path, "again")
    assert set(reads) == {str(tmp_path / "broken.jpg")}  # only the file that has no thumbnail is tried
    again = tmp_path / "again" / "report_files" / "thumbs"
    assert {p.name: p.stat().st_ino for p in again.iterdir()} == before  # the older cache's links
    assert {p.name: p.stat().st_ino for p in thumbs.rglob("*.jpg")} == before and not (thumbs / "as-is").exists()


def test_thumbnails_come_from_the_pixels_in_memory_off_the_run_thread(tmp_path, monkeypatch):
    import threading

    from caprecon.store import thumbs as thumbs_module

    made = []
    real = thumbs_module.thumbnail_of

    def counting(image, source, cache, *rest, **options):
        made.append((threading.current_thread().name, source))
        return real(image, source, cache, *rest, **options)

    monkeypatch.setattr(thumbs_module, "thumbnail_of", counting)
    samples = _samples(tmp_path)
    encodes = _counting_encodes(monkeypatch)
    _score_into(samples, tmp_path, "first")
    assert {source for _, source in encodes} == {str(tmp_path / "broken.jpg")}
    assert len(made) == 10 and {name for name, _ in made} == {"caprecon-thumbs-feed"}
    folder = tmp_path / "first" / "report_files" / "thumbs"
    assert len(list(folder.iterdir())) == 10
    # the same picture as the file-based path makes from the source (JPEG-close)
    source = str(tmp_path / "img0.jpg")
    from_file = tmp_path / "from-file.jpg"
    assert thumbs_module._encode(source, from_file, thumbs_module.THUMB_SIDE)
    shown = Image.open(folder / thumbs_module._name(source))
    expected = Image.open(from_file)
    assert shown.size == expected.size
    assert np.abs(np.asarray(shown, float) - np.asarray(expected, float)).mean() < 3


def test_a_picture_thumbnailed_from_memory_is_named_once_and_only_linked_after(tmp_path, monkeypatch):
    """The thumbnail thread names each picture (a stat and a hash) once: the rows that show a
    picture made from memory link the known name into the run folder."""
    from caprecon.store import thumbs as thumbs_module

    import threading

    named = []
    real = thumbs_module._named
    monkeypatch.setattr(thumbs_module, "_named",
                        lambda source: (named.append((threading.current_thread().name, source)), real(source))[1])
    samples = _samples(tmp_path)
    _score_into(samples, tmp_path, "first")
    pictures = [p for thread, p in named if thread == "caprecon-thumbs-feed" and not p.endswith("broken.jpg")]
    assert len(pictures) == 10 and len(set(pictures)) == 10  # 5 originals, 5 reconstructions, each named once
    folder = tmp_path / "first" / "report_files" / "thumbs"
    assert len(list(folder.iterdir())) == 10
    # the report takes the names the run made: it names only the picture that has no thumbnail
    assert [p for thread, p in named if thread != "caprecon-thumbs-feed"] == [str(tmp_path / "broken.jpg")]
    html = (tmp_path / "first" / "report.html").read_text()
    gallery = json.loads(html.split('<script type="application/json" id="gallery-data">')[1].split("</script>")[0])
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "first" / "scores.jsonl").read_text().splitlines())}
    for item in gallery["items"]:
        if item["i"] == "broken":
            assert item["o"] is None and item["r"] == []
            continue
        record = records[item["i"]]  # each card shows its own row's pictures, their bytes as linked
        assert (folder / item["o"]).read_bytes() == (tmp_path / record["image"]).read_bytes()
        assert [(folder / name).read_bytes() for name in item["r"]] == [
            open(record["reconstruction"], "rb").read()]


def test_a_picture_whose_bytes_were_seen_is_not_read_again_for_its_thumbnail(tmp_path, monkeypatch):
    """A run hands the thumbnail thread each file's length and first bytes (as read for scoring,
    as written to the cache): a small JPEG or PNG is then linked without opening it. A file whose
    length no longer matches is read as before, and a BMP is never its own thumbnail."""
    from caprecon.store import thumbs as thumbs_module

    reads = []
    real = thumbs_module.read_image_file
    monkeypatch.setattr(thumbs_module, "read_image_file", lambda path, *a, **k: (reads.append(str(path)),
                                                                                 real(path, *a, **k))[1])
    small, bmp, cache = tmp_path / "small.png", tmp_path / "small.bmp", tmp_path / "cache"
    Image.new("RGB", (40, 30), (1, 2, 3)).save(small)
    Image.new("RGB", (40, 30), (4, 5, 6)).save(bmp)
    data = small.read_bytes()
    cached = thumbs_module.thumbnail_of(Image.open(small).convert("RGB"), str(small), cache, head=(len(data), data[:8]))
    name = thumbs_module._name(str(small))
    assert reads == [] and cached == str(cache / "as-is" / name)  # its own thumbnail: in the cache's one folder
    assert (cache / "as-is" / name).stat().st_ino == small.stat().st_ino  # linked, not read
    bmp_data = bmp.read_bytes()
    cached = thumbs_module.thumbnail_of(Image.open(bmp).convert("RGB"), str(bmp), cache,
                                        head=(len(bmp_data), bmp_data[:8]))
    name = thumbs_module._name(str(bmp))
    assert reads == [] and cached == str(cache / name[:2] / name)  # made: in its name's folder
    assert Image.open(cached).format == "JPEG"  # made from the pixels
    stale = tmp_path / "stale.png"  # the run saw other bytes than the file now holds: read it
    Image.new("RGB", (40, 30), (7, 8, 9)).save(stale)
    cached = thumbs_module.thumbnail_of(Image.open(stale).convert("RGB"), str(stale), cache, head=(10, data[:8]))
    name = thumbs_module._name(str(stale))
    assert reads == [str(stale)] and cached == str(cache / "as-is" / name)
    assert (cache / "as-is" / name).read_bytes() == stale.read_bytes()
    assert sorted(p.name for p in cache.iterdir()) == sorted(["as-is", thumbs_module._name(str(bmp))[:2]])
    reads.clear()  # asked again without what the run saw: found in either folder, not read
    for picture in (small, bmp):
        cached = thumbs_module.thumbnail_of(Image.open(picture).convert("RGB"), str(picture), cache)
        assert cached and os.path.basename(cached) == thumbs_module._name(str(picture))
    assert reads == []


def test_the_report_links_what_either_folder_of_the_thumbnail_cache_holds(tmp_path, monkeypatch):
    """The report's thumbnails (`make_thumbnails` with the cache) link what the cache holds, a picture
    that is its own thumbnail (`as-is/`) or one made (its name's folder), and make neither again."""
    from caprecon.store import thumbs as thumbs_module

    small, large, cache = tmp_path / "small.png", tmp_path / "large.png", tmp_path / "cache"
    Image.new("RGB", (40, 30), (1, 2, 3)).save(small)
    Image.new("RGB", (500, 400), (4, 5, 6)).save(large)  # over 384 px: its thumbnail is made
    data = small.read_bytes()
    own = thumbs_module.thumbnail_of(Image.open(small).convert("RGB"), str(small), cache, head=(len(data), data[:8]))
    made = thumbs_module.thumbnail_of(Image.open(large).convert("RGB"), str(large), cache)
    assert os.path.basename(os.path.dirname(own)) == "as-is" and os.path.basename(os.path.dirname(made)) != "as-is"
    encodes = _counting_encodes(monkeypatch)
    folder = tmp_path / "report"
    names = thumbs_module.make_thumbnails([str(small), str(large)], folder, cache=cache)
    assert encodes == []
    assert (folder / names[str(small)]).stat().st_ino == small.stat().st_ino
    assert (folder / names[str(large)]).stat().st_ino == os.stat(made).st_ino


def test_thumbnails_are_copied_where_the_file_system_refuses_a_link(tmp_path, monkeypatch):
    """Across file systems (EXDEV) a thumbnail is copied into a folder that does not exist yet."""
    import errno

    from caprecon.store import thumbs as thumbs_module

    def no_links(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(thumbs_module.os, "link", no_links)
    source = tmp_path / "small.png"
    Image.new("RGB", (40, 30), (1, 2, 3)).save(source)
    cache, folder = tmp_path / "cache", tmp_path / "run" / "thumbs"
    name = thumbs_module._name(str(source))
    assert thumbs_module.thumbnail_of(Image.open(source).convert("RGB"), str(source), cache) == str(cache / "as-is" / name)
    assert (cache / "as-is" / name).read_bytes() == source.read_bytes()
    folder.parent.mkdir()
    assert thumbs_module._link(cache / "as-is" / name, folder / name)
    assert (folder / name).read_bytes() == source.read_bytes()
    assert (folder / name).stat().st_ino != (cache / "as-is" / name).stat().st_ino


def test_every_number_of_reading_threads_scores_the_same_rows(tmp_path):
    """`workers` 0 (in line), 1, 2 and 4 read the same files into the same scores; one worker
    once waited for ever (the batch ahead held the only thread its files needed)."""
    import threading

    samples = _samples(tmp_path)
    results = {}

    def score(workers):
        results[workers] = caprecon.score(samples, ["recon"], generator=OracleGenerator(), embedder=PixelEmbedder(),
                                          max_side=32, batch_size=2, no_cache=True, workers=workers,
                                          out=tmp_path / f"w{workers}")

    for workers in (0, 1, 2, 4):
        worker = threading.Thread(target=score, args=(workers,), daemon=True)
        worker.start()
        worker.join(60)
        assert not worker.is_alive(), f"workers={workers}: the run did not finish"
    expected = results[0].scores("recon")
    assert sum(s is not None for s in expected) == 5  # the broken file is its row's error
    for workers in (1, 2, 4):
        assert results[workers].scores("recon") == expected


def test_the_digest_memo_answers_a_later_process(tmp_path):
    """A file's content hash, remembered by (path, size, mtime) in the cache folder's memo, is
    known to the next process without reading the file; the memo keeps a write-ahead log. Where no
    run named a folder, nothing is written, not even in the default cache folder."""
    import subprocess
    import sys

    env = {**os.environ, "CAPRECON_CACHE": str(tmp_path / "default")}
    ident = (str(tmp_path / "a.jpg"), 123, 456)
    remember = f"from caprecon.core.digests import remember_digest; remember_digest({ident!r}, 'f' * 64)"
    subprocess.run([sys.executable, "-c", remember], env=env, check=True)
    assert not (tmp_path / "default").exists()  # no run named a memo: remembered in that process alone
    use = f"from caprecon.core.digests import keep_memo_in; keep_memo_in({str(tmp_path / 'cache')!r}); "
    recall = use + f"from caprecon.core.digests import known_digest; print(known_digest({ident!r}))"
    remember = use + remember
    subprocess.run([sys.executable, "-c", remember], env=env, check=True)
    out = subprocess.run([sys.executable, "-c", recall], env=env, check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "f" * 64
    other = subprocess.run([sys.executable, "-c", recall.replace("123", "124")], env=env, check=True,
                           capture_output=True, text=True)
    assert other.stdout.strip() == "None"  # another size: another file, hashed again
    import sqlite3

    assert sqlite3.connect(tmp_path / "cache" / "digests.sqlite").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_batchs_digests_go_into_the_memo_in_one_write_once_the_batch_is_read(tmp_path, monkeypatch):
    """The reading threads remember each file's digest in the process at once and the batch's reader
    writes the batch's digests into the memo file (the run's cache folder's) together: one write of
    two for each batch of two new files, and a later process knows each file's digest without
    reading it."""
    import subprocess
    import sys

    from caprecon.core import digests

    monkeypatch.setattr(digests, "_known", {})
    writes = []
    real = digests._write
    monkeypatch.setattr(digests, "_write",
                        lambda folder, rows: (writes.append(sorted(i[0] for i, _ in rows)), real(folder, rows))[1])
    samples = _samples(tmp_path)
    _score_into(samples, tmp_path, "first")  # its cache folder, tmp_path / "cache", holds the memo
    names = [os.path.basename(p) for batch in writes for p in batch]
    assert [len(batch) for batch in writes if batch] == [2, 2, 2]
    assert sorted(names) == sorted([f"img{i}.jpg" for i in range(5)] + ["broken.jpg"])
    path = os.path.realpath(tmp_path / "img3.jpg")
    info = os.stat(path)
    recall = (f"from caprecon.core.digests import keep_memo_in, known_digest; "
              f"keep_memo_in({str(tmp_path / 'cache')!r}); "
              f"print(known_digest(({path!r}, {info.st_size}, {info.st_mtime_ns})))")
    out = subprocess.run([sys.executable, "-c", recall], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == hashlib.sha256((tmp_path / "img3.jpg").read_bytes()).hexdigest()


def test_a_batchs_files_resolve_as_path_resolve_does_with_each_folder_looked_up_once(tmp_path, monkeypatch):
    """`Folders.real_file` gives what `Path.resolve` and `os.stat` give (the digest memo's key is
    the real path), for links to files and folders, `..` and relative paths, with one `lstat` for
    each further file of a folder seen before, where resolving each path walked every component."""
    from pathlib import Path

    from caprecon.data.images import Folders

    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    for i in range(6):
        (deep / f"p{i}.png").write_bytes(b"x" * (i + 1))
    (tmp_path / "via").symlink_to(deep, target_is_directory=True)
    (deep / "link.png").symlink_to(deep / "p1.png")
    monkeypatch.chdir(tmp_path / "a")
    paths = [deep / "p0.png", tmp_path / "via" / "p2.png", deep / "link.png", Path("b/c/p3.png"),
             tmp_path / "a" / "b" / ".." / "b" / "c" / "p4.png", deep / "missing.png", Path("b/c/..")]
    folders = Folders()
    for path in paths:
        real, info = folders.real_file(path)
        assert real == str(path.resolve()), path
        if path.exists():
            assert (info.st_ino, info.st_size) == (os.stat(path).st_ino, os.stat(path).st_size), path
        else:
            assert info is None, path

    calls = []
    real_lstat = os.lstat
    monkeypatch.setattr(os, "lstat", lambda p, *a, **k: (calls.append(p), real_lstat(p, *a, **k))[1])
    folders = Folders()
    for i in range(6):
        folders.real_file(deep / f"p{i}.png")
    depth = len(deep.parts)
    assert len(calls) <= 6 + depth, calls  # resolving each of the six walked 6 x depth components


def test_a_thumbnail_makes_its_folder_when_missing_and_leaves_no_part_file_when_it_fails(tmp_path):
    import caprecon.store.thumbs as thumbs_module

    target = tmp_path / "new" / "ab" / "t.jpg"
    assert thumbs_module._save(Image.new("RGB", (4, 4), "red"), target)
    assert Image.open(target).size == (4, 4)
    assert thumbs_module._save(b"\xff\xd8\xffbytes", tmp_path / "new" / "ab" / "u.jpg")
    assert (tmp_path / "new" / "ab" / "u.jpg").read_bytes() == b"\xff\xd8\xffbytes"

    class Broken:
        def save(self, fh, *args, **kwargs):
            fh.write(b"half")
            raise OSError("encoder failed")

    assert not thumbs_module._save(Broken(), tmp_path / "new" / "ab" / "v.jpg")
    assert sorted(p.name for p in (tmp_path / "new" / "ab").iterdir()) == ["t.jpg", "u.jpg"]  # no .part left


def test_a_path_that_is_not_text_is_remembered_in_the_process_alone(tmp_path, monkeypatch):
    """A file name decoded with surrogateescape (bytes that are not UTF-8) cannot be SQLite text: its
    digest is known in the process, and the digests written with it in one transaction still reach
    the memo file."""
    import contextvars
    import sqlite3

    from caprecon.core import digests

    monkeypatch.setattr(digests, "_known", {})
    good, bad = (str(tmp_path / "good.png"), 1, 2), (str(tmp_path / "bad\udcff.png"), 3, 4)

    def remember():
        digests.keep_memo_in(tmp_path / "cache")
        digests.remember_digest(bad, "b" * 64, later=True)
        digests.remember_digest(good, "a" * 64, later=True)
        digests.write_remembered()

    contextvars.copy_context().run(remember)
    db = sqlite3.connect(tmp_path / "cache" / "digests.sqlite")
    assert db.execute("SELECT path, size, mtime_ns, digest FROM digests").fetchall() == [(*good, "a" * 64)]
    db.close()
    assert digests.known_digest(bad) == "b" * 64


def test_digests_remembered_later_by_two_runs_go_each_into_its_own_memo(tmp_path, monkeypatch):
    """Two runs' reading threads remember digests later; one `write_remembered` (either run's batch
    reader) writes each into the memo of the run that remembered it."""
    import contextvars
    import sqlite3

    from caprecon.core import digests

    monkeypatch.setattr(digests, "_known", {})
    monkeypatch.setattr(digests, "_unwritten", [])

    def remember(folder, ident, digest):
        digests.keep_memo_in(folder)
        digests.remember_digest(ident, digest, later=True)

    first, second = ("/photos/one.png", 1, 2), ("/photos/two.png", 3, 4)
    contextvars.copy_context().run(remember, tmp_path / "a", first, "1" * 64)
    contextvars.copy_context().run(remember, tmp_path / "b", second, "2" * 64)
    digests.write_remembered()
    for folder, row in (("a", (*first, "1" * 64)), ("b", (*second, "2" * 64))):
        db = sqlite3.connect(tmp_path / folder / "digests.sqlite")
        assert db.execute("SELECT path, size, mtime_ns, digest FROM digests").fetchall() == [row], folder
        db.close()
