"""Image-folder staging: digits bootstrap end to end, tar shards, labels, bad files."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from trainyard import volumes
from trainyard.config import PipelineConfig, load_pipeline
from trainyard.errors import StagingError
from trainyard.staging import files, sources, stage
from trainyard.staging.bootstrap import sklearn_digits
from trainyard.staging.files import tar_header
from trainyard.staging.sources import open_source

CONTRACT = """\
dataset: pics
version: 3.0.0
owner: tests@example.com
source: {format: image_folder, extension: png}
image: {column: image, height: 8, width: 8, channels: 1}
roles: {key: key, label: label, features: [image], num_classes: 2}
split: {holdout_fraction: 0.2, by: key}
columns:
  - {name: key, type: string}
  - {name: label, type: int64}
"""


@pytest.fixture
def contracts(contracts_dir: Path) -> Path:
    folder = contracts_dir
    (folder / "pics.yaml").write_text(CONTRACT)
    return folder


@pytest.fixture(scope="module")
def digits_raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sklearn_digits(tmp_path_factory.mktemp("lake") / "digits")


def pics_pipeline(url: Path, shard_target_mb: int = 64) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": "pics",
            "dataset": "pics",
            "start_date": "2026-11-01",
            "source": {"url": str(url), "format": "image_folder"},
            "staging": {"shard_target_mb": shard_target_mb},
            "training": {"model": "cnn"},
            "serving": {"model_name": "pics"},
        }
    )


def png(path: Path, value: int = 7, size: tuple[int, int] = (4, 3)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("L", size, value).save(path)


def test_sklearn_digits_bootstrap_layout(digits_raw: Path):
    from sklearn.datasets import load_digits

    files = sorted(digits_raw.rglob("*.png"))
    assert len(files) == 1797
    assert sorted(p.name for p in digits_raw.iterdir()) == [str(d) for d in range(10)]
    digits = load_digits()
    img = Image.open(digits_raw / str(digits.target[42]) / "img_0042.png")
    assert img.mode == "L" and img.size == (8, 8)
    expected = np.rint(digits.images[42] * 255 / 16).astype(np.uint8)
    assert np.array_equal(np.asarray(img), expected)


def test_digits_pipeline_end_to_end(
    volume_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, digits_raw: Path
):
    project = tmp_path / "project"
    shutil.copytree(Path(__file__).resolve().parents[2] / "dags", project / "dags")
    shutil.copytree(
        Path(__file__).resolve().parents[2] / "data_contracts", project / "data_contracts"
    )
    monkeypatch.setenv("TRAINYARD_PROJECT_DIR", str(project))
    monkeypatch.delenv("TRAINYARD_CONTRACTS_DIR", raising=False)
    cfg = load_pipeline("digits")
    raw = project / cfg.source.url
    assert not raw.exists()
    first = stage(cfg, "2026-11-01T02:00:00+00:00", "2026-11-02T02:00:00+00:00", quiet=True)
    assert raw.is_dir() and len(list(raw.rglob("*.png"))) == 1797
    assert not first.reused and first.rows == 1797
    second = stage(cfg, quiet=True)
    assert second.snapshot_id == first.snapshot_id and second.reused
    manifest = volumes.read_manifest(first.path)
    assert manifest.kind == "files" and manifest.contract_version == "1.0.0"
    assert [s.role for s in manifest.shards] == ["data", "index"]
    shard = first.path / "shard-00000.tar"
    listing = subprocess.run(
        ["tar", "-tf", str(shard)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(listing) == 2 * 1797
    assert "3/img_0003.png" in listing and "3/img_0003.cls" in listing

    import webdataset as wds

    samples = list(wds.WebDataset(str(shard), shardshuffle=False))
    assert len(samples) == 1797
    one = next(s for s in samples if s["__key__"] == "3/img_0003")
    assert one["cls"] == b"3" and Image.open(io.BytesIO(one["png"])).size == (8, 8)

    (index,) = volumes.table_files(first.path)
    assert index.name == "index.parquet"
    table = pq.read_table(index)
    assert table.schema.names == ["key", "label", "shard", "bytes", "width", "height"]
    rows = table.to_pylist()
    assert set(r["width"] for r in rows) == {8} and set(r["shard"] for r in rows) == {
        "shard-00000.tar"
    }
    assert all(r["key"].split("/")[0] == str(r["label"]) for r in rows)
    assert [s["name"] for s in manifest.schema] == table.schema.names


def test_many_shards_and_class_names(volume_root: Path, contracts: Path, tmp_path: Path):
    raw = tmp_path / "raw"
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        for i in range(40):
            path = raw / cls / f"pic.{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 255, (128, 128), dtype=np.uint8), "L").save(path)
    result = stage(pics_pipeline(raw, shard_target_mb=1), quiet=True)
    manifest = volumes.read_manifest(result.path)
    assert len(manifest.data_shards) >= 2 and manifest.extra["classes"] == ["cat", "dog"]
    index = pq.read_table(volumes.table_files(result.path)).to_pylist()
    assert index[0]["key"] == "cat/pic_0" and index[0]["label"] == 0 and index[-1]["label"] == 1
    total = 0
    for shard in manifest.data_shards:
        with tarfile.open(result.path / shard.path) as tar:
            names = tar.getnames()
        assert len(names) == 2 * shard.rows
        total += shard.rows
    assert total == 80 == result.rows


def test_labels_file(volume_root: Path, contracts: Path, tmp_path: Path):
    raw = tmp_path / "raw"
    png(raw / "a.png")
    png(raw / "sub" / "b.png", size=(5, 6))
    (raw / "labels.csv").write_text("file,label\na.png,4\nsub/b.png,2\n")
    result = stage(pics_pipeline(raw), quiet=True)
    index = {r["key"]: r for r in pq.read_table(volumes.table_files(result.path)).to_pylist()}
    assert index["a"]["label"] == 4 and index["sub/b"]["label"] == 2
    assert (index["sub/b"]["width"], index["sub/b"]["height"]) == (5, 6)


BAD_SOURCES = [
    (
        "zero-byte-image",
        lambda r: (png(r / "1" / "ok.png"), (r / "1" / "bad.png").write_bytes(b"")),
        "1/bad.png: image file is empty",
    ),
    (
        "corrupt-image",
        lambda r: (png(r / "1" / "ok.png"), (r / "1" / "bad.png").write_bytes(b"garbage!" * 10)),
        "1/bad.png: not a readable image",
    ),
    (
        "labels-traversal",
        lambda r: (
            png(r / "a.png"),
            (r / "labels.csv").write_text("file,label\na.png,1\n../../etc/x.png,2\n"),
        ),
        "row 3: file name '../../etc/x.png' tries to leave",
    ),
    (
        "labels-missing-file",
        lambda r: (
            png(r / "a.png"),
            (r / "labels.csv").write_text("file,label\na.png,1\nb.png,2\n"),
        ),
        "lists 'b.png', which does not exist",
    ),
    (
        "labels-bad-int",
        lambda r: (png(r / "a.png"), (r / "labels.csv").write_text("file,label\na.png,one\n")),
        "row 2 column 'label'",
    ),
    ("unlabelled-file", lambda r: png(r / "loose.png"), "loose.png: no label"),
    (
        "symlink-outside",
        lambda r: (
            png(r.parent / "secret" / "s.png"),
            (r / "1").mkdir(parents=True),
            (r / "1" / "s.png").symlink_to(r.parent / "secret" / "s.png"),
        ),
        "points outside the source folder",
    ),
    (
        "key-collision",
        lambda r: (png(r / "1" / "a.b.png"), png(r / "1" / "a_b.png")),
        "same sample key '1/a_b'",
    ),
    ("empty-folder", lambda r: (r / "1").mkdir(parents=True), "source is empty"),
]


@pytest.mark.parametrize(("case", "make", "fragment"), BAD_SOURCES, ids=[c[0] for c in BAD_SOURCES])
def test_bad_image_sources(
    volume_root: Path, contracts: Path, tmp_path: Path, case: str, make, fragment: str
):
    raw = tmp_path / "raw"
    raw.mkdir()
    make(raw)
    with pytest.raises(StagingError) as err:
        stage(pics_pipeline(raw), quiet=True)
    assert fragment in str(err.value)
    assert not (volume_root / "pics" / "snapshots").exists()
    tmp = volume_root / "pics" / ".tmp"
    assert not tmp.exists() or list(tmp.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("a/b.png", 0),
        ("3/img_0001.cls", 1),
        ("x" * 99 + ".png", 1234),
        ("deep/" * 30 + "long.png", 77),
    ],
    ids=["empty", "one-byte", "99-char-stem", "pax-long-name"],
)
def test_tar_header_is_read_back_by_tarfile(name: str, size: int):
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    blob = tar_header(name, size) + data + b"\0" * (-size % 512) + b"\0" * 1024
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        (member,) = tar.getmembers()
        assert (member.name, member.size, member.mode, member.mtime) == (name, size, 0o644, 0)
        assert tar.extractfile(member).read() == data


@pytest.mark.parametrize(
    ("keys", "suffix", "sizes"),
    [
        (["0/img_0000", "9/x"], b".png", [0, 1]),
        (["cat/a-b_c", "k" * 96], b".cls", [1, 3]),
        (["n/" + "y" * 93, "z"], b".jpeg", [8**11 - 1, 123456789]),
    ],
    ids=["png-small-sizes", "cls-longest-name", "max-size-and-names"],
)
def test_bulk_headers_equal_tar_header(keys: list[str], suffix: bytes, sizes: list[int]):
    rows = files._headers(keys, suffix, np.array(sizes, np.int64))
    for key, size, row in zip(keys, sizes, rows, strict=True):
        assert row.tobytes() == tar_header(key + suffix.decode(), size)


@pytest.fixture(params=["native", "python"])
def stager(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with the C packer (plain names) and with the pure-Python path."""
    if request.param == "python":
        monkeypatch.setattr(sources, "_native", None)
    return request.param


def varied_tree(raw: Path, pax: bool = True) -> list[Path]:
    """80 PNGs of varied sizes in 3 class folders; with ``pax``, one name needs PAX headers.

    Plain names (``pax=False``) are what the C scanner takes; a PAX name sends the whole
    source down the Python path.
    """
    rng = np.random.default_rng(1)
    paths = []
    for i in range(80):
        side = int(rng.integers(60, 200))
        stem = f"im_{i:03d}" if i != 5 or not pax else "long_" + "n" * 110
        path = raw / str(i % 3) / f"{stem}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (side, side), dtype=np.uint8), "L").save(path)
        paths.append(path)
    return paths


def expected_shards(src, shard_target: int) -> list[bytes]:
    """The shards a plain sequential tar writer produces for the same samples."""
    plan, _ = files.plan_samples(src)
    shards, current = [], b""
    for f, key, ext, label in plan:
        data = Path(f.path).read_bytes()
        cls = b"%d" % label
        current += tar_header(f"{key}.{ext}", len(data)) + data + b"\0" * (-len(data) % 512)
        current += tar_header(f"{key}.cls", len(cls)) + cls.ljust(512, b"\0")
        if len(current) >= shard_target:
            shards.append(current + b"\0" * 1024)
            current = b""
    if current:
        shards.append(current + b"\0" * 1024)
    return shards


def open_varied(raw: Path, stager: str) -> tuple[Any, list[Path]]:
    """The varied tree as a source, listed by the stager under test."""
    paths = varied_tree(raw, pax=stager == "python")
    src = open_source(str(raw), "image_folder", "png")
    assert (src.native is not None) == (stager == "native")
    return src, paths


def test_shards_identical_for_any_worker_count(tmp_path: Path, stager: str):
    raw = tmp_path / "raw"
    src, _paths = open_varied(raw, stager)
    expected = expected_shards(src, 1 << 20)
    assert len(expected) >= 2
    results = {}
    for workers in (1, 2, 3):
        out = tmp_path / f"out{workers}"
        out.mkdir()
        shards, _schema, _extra = files.stage_files(
            src, out, shard_target_mb=1, advance=lambda n, files: None, workers=workers
        )
        data = [s for s in shards if s.role == "data"]
        assert [(out / s.path).read_bytes() for s in data] == expected
        assert [s.bytes for s in data] == [len(b) for b in expected]
        assert all(s.hash == volumes.hash_file(out / s.path) for s in data)
        results[workers] = ([s.hash for s in shards], pq.read_table(out / "index.parquet"))
    assert results[1][0] == results[2][0] == results[3][0]
    assert results[1][1].equals(results[2][1]) and results[1][1].equals(results[3][1])
    index = results[2][1].to_pylist()
    five = next(r for r in index if r["key"].startswith(("2/long_", "2/im_005")))
    with tarfile.open(tmp_path / "out2" / five["shard"]) as tar:
        member = tar.getmember(five["key"] + ".png")
        assert Image.open(tar.extractfile(member)).size == (five["width"], five["height"])
        assert tar.extractfile(five["key"] + ".cls").read() == b"2"


CHANGES = [
    ("grew", lambda p: p.write_bytes(p.read_bytes() + b"x"), "source changed while being staged"),
    ("shrank", lambda p: p.write_bytes(p.read_bytes()[:-1]), "source changed while being staged"),
    ("vanished", lambda p: p.unlink(), "cannot read source file"),
    ("emptied", lambda p: p.write_bytes(b""), "source changed while being staged (size"),
]


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-processes"])
@pytest.mark.parametrize(("case", "change", "fragment"), CHANGES, ids=[c[0] for c in CHANGES])
def test_file_changed_after_listing(
    tmp_path: Path, stager: str, workers: int, case: str, change, fragment: str
):
    raw = tmp_path / "raw"
    src, paths = open_varied(raw, stager)
    # two changed files: the one earlier in key order is named, whoever reads it
    change(paths[60])
    change(paths[9])
    (paths[70]).write_bytes(b"not a png")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(StagingError) as err:
        files.stage_files(
            src, out, shard_target_mb=1, advance=lambda n, files: None, workers=workers
        )
    assert str(paths[9]) in str(err.value) and fragment in str(err.value)


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-processes"])
def test_corrupt_image_found_in_any_worker(tmp_path: Path, stager: str, workers: int):
    raw = tmp_path / "raw"
    paths = varied_tree(raw, pax=stager == "python")
    paths[70].write_bytes(b"GIF89a but not really")
    paths[40].write_bytes(b"")
    src = open_source(str(raw), "image_folder", "png")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(StagingError) as err:
        files.stage_files(
            src, out, shard_target_mb=1, advance=lambda n, files: None, workers=workers
        )
    # 1/im_040.png sorts before 1/im_070.png
    assert f"{paths[40]}: image file is empty" in str(err.value)


def test_remote_source_and_non_png_images(tmp_path: Path):
    import fsspec

    fs = fsspec.filesystem("memory")
    root = f"/pics-{tmp_path.name}"
    for rel, fmt, size in [("0/b.png", "PNG", (3, 9)), ("1/a.jpg", "JPEG", (7, 5))]:
        blob = io.BytesIO()
        Image.new("RGB", size, (10, 20, 30)).save(blob, fmt)
        fs.pipe(f"{root}/{rel}", blob.getvalue())
    src = open_source(f"memory://{root}", "image_folder", None)
    assert not src.is_local
    out = tmp_path / "out"
    out.mkdir()
    try:
        shards, _schema, _extra = files.stage_files(
            src, out, shard_target_mb=1, advance=lambda n, files: None
        )
    finally:
        fs.rm(root, recursive=True)
    index = pq.read_table(out / "index.parquet").to_pylist()
    assert [(r["key"], r["width"], r["height"]) for r in index] == [("0/b", 3, 9), ("1/a", 7, 5)]
    with tarfile.open(out / shards[0].path) as tar:
        assert tar.getnames() == ["0/b.png", "0/b.cls", "1/a.jpg", "1/a.cls"]


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-processes"])
def test_same_size_rewrite_after_listing_is_refused(tmp_path: Path, stager: str, workers: int):
    raw = tmp_path / "raw"
    src, paths = open_varied(raw, stager)
    data = bytearray(paths[30].read_bytes())
    data[-20] ^= 0xFF
    paths[30].write_bytes(bytes(data))  # same size, new content, later mtime
    st = paths[30].stat()
    os.utime(paths[30], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(StagingError, match=r"source changed while being staged \(mtime") as err:
        files.stage_files(
            src, out, shard_target_mb=1, advance=lambda n, files: None, workers=workers
        )
    assert str(paths[30]) in str(err.value)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda raw: png(raw / "1" / "late.png"), "file '1/late.png' appeared"),
        (lambda raw: (raw / "2" / "im_002.png").unlink(), "im_002.png: source file vanished"),
    ],
    ids=["appeared", "vanished"],
)
def test_folder_change_after_reading_is_refused(tmp_path: Path, stager: str, change, fragment: str):
    raw = tmp_path / "raw"
    open_varied(raw, stager)
    src = open_source(str(raw), "image_folder", "png")
    src.check_unchanged(files_verified=True)  # nothing changed: the folders' times agree
    time.sleep(0.02)  # past the file system's timestamp granularity
    change(raw)
    with pytest.raises(StagingError, match=fragment):
        src.check_unchanged(files_verified=True)


def test_parallel_listing_equals_serial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    raw = tmp_path / "raw"
    varied_tree(raw)
    serial = open_source(str(raw), "image_folder", "png")
    monkeypatch.setattr(sources, "_PARALLEL_STAT_MIN", 1)
    monkeypatch.setattr(sources, "usable_cpus", lambda: 3)
    parallel = open_source(str(raw), "image_folder", "png")
    assert parallel.files == serial.files
    assert [f.size for f in serial.files] == [Path(f.path).stat().st_size for f in serial.files]
    assert all(f.stamp == Path(f.path).stat().st_mtime_ns for f in serial.files)


def test_native_packer_is_built():
    # `make` builds it (pip install -e ., setup.py); without it every test above would only
    # exercise the Python path
    assert sources._native is not None, "run: make native"


def mixed_tree(raw: Path) -> None:
    """Named classes, an empty class folder, PNG and JPEG samples, upper-case extensions."""
    rng = np.random.default_rng(2)
    for i in range(30):
        cls = ("cat", "dog", "emu")[i % 3]
        img = Image.fromarray(rng.integers(0, 255, (20 + i, 10 + i), dtype=np.uint8), "L")
        ext = ("png", "jpg", "PNG")[i % 3 if i % 5 else 0]
        img.save(raw / cls / f"s-{i:02d}.{ext}", "PNG" if ext.lower() == "png" else "JPEG")
    (raw / "zzz").mkdir()
    (raw / "notes.txt").write_text("not a sample")


def test_native_and_python_paths_write_the_same_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    raw = tmp_path / "raw"
    for cls in ("cat", "dog", "emu"):
        (raw / cls).mkdir(parents=True)
    mixed_tree(raw)
    got = {}
    for stager in ("native", "python"):
        if stager == "python":
            monkeypatch.setattr(sources, "_native", None)
        src = open_source(str(raw), "image_folder", None)
        assert (src.native is not None) == (stager == "native")
        out = tmp_path / stager
        out.mkdir()
        consumed: list[tuple[int, int]] = []

        def advance(n: int, k: int, consumed: list[tuple[int, int]] = consumed) -> None:
            consumed.append((n, k))

        shards, schema, extra = files.stage_files(
            src, out, shard_target_mb=1, advance=advance, workers=2
        )
        assert sum(n for n, _ in consumed) == src.total_bytes
        assert sum(k for _, k in consumed) == src.count  # every file counted once
        got[stager] = (
            [(s.path, s.bytes, s.rows, s.hash) for s in shards],
            pq.read_table(out / "index.parquet"),
            schema,
            extra,
            src.describe(),
            src.files,
        )
    native, python = got["native"], got["python"]
    assert native[0] == python[0]
    assert native[1].equals(python[1])
    assert native[2:] == python[2:]
    index = native[1].to_pylist()
    assert native[3] == {"classes": ["cat", "dog", "emu"]}
    assert [r["key"] for r in index] == sorted(r["key"] for r in index)
    jpeg = next(r for r in index if r["key"] == "dog/s-01")
    assert (jpeg["width"], jpeg["height"]) == (11, 21) and jpeg["label"] == 1


LONG_EXT = "png" * 6
FALLBACKS = [
    (
        "labels-file",
        lambda r: (png(r / "a.png"), (r / "labels.csv").write_text("file,label\na.png,1\n")),
    ),
    ("nested-folder", lambda r: (png(r / "1" / "a.png"), png(r / "1" / "deep" / "b.png"))),
    (
        "symlink",
        lambda r: (png(r / "1" / "a.png"), (r / "1" / "b.png").symlink_to(r / "1" / "a.png")),
    ),
    ("dotted-name", lambda r: png(r / "1" / "a.b.png")),
    ("unsafe-folder", lambda r: png(r / "my class" / "a.png")),
    ("long-name", lambda r: png(r / "1" / ("x" * 97 + ".png"))),
    ("loose-sample", lambda r: (png(r / "1" / "a.png"), png(r / "b.png"))),
    ("same-key", lambda r: (png(r / "1" / "a.png"), png(r / "1" / "a.PNG"))),
    (
        "long-extension",
        lambda r: (r / "1").mkdir() or (r / "1" / f"a.{LONG_EXT}").write_bytes(b"x"),
    ),
]


@pytest.mark.parametrize(("case", "make"), FALLBACKS, ids=[c[0] for c in FALLBACKS])
def test_unusual_folders_are_listed_by_the_python_path(tmp_path: Path, case: str, make):
    raw = tmp_path / "raw"
    raw.mkdir()
    make(raw)
    assert sources._native is not None
    extension = LONG_EXT if case == "long-extension" else "png"
    assert isinstance(sources._native.scan(str(raw), (f".{extension}",), 2), str)
    try:
        src = open_source(str(raw), "image_folder", extension)
    except StagingError:
        assert case == "loose-sample"
        return
    assert src.native is None and src.files


def test_native_disk_full_fails_cleanly(tmp_path: Path):
    raw = tmp_path / "raw"
    varied_tree(raw, pax=False)
    out = tmp_path / "out"
    out.mkdir()
    plugins = Path(__file__).resolve().parents[2] / "plugins"
    code = f"""
import resource, signal, sys
sys.path.insert(0, {str(plugins)!r})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))
from pathlib import Path
from trainyard.errors import StagingError
from trainyard.staging import files
from trainyard.staging.sources import open_source
src = open_source({str(raw)!r}, "image_folder", "png")
assert src.native is not None
try:
    files.stage_files(
        src, Path({str(out)!r}), shard_target_mb=4, advance=lambda n, k: None, workers=2
    )
except StagingError as e:
    print("STAGING_ERROR", e)
    sys.exit(3)
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 3, proc.stderr
    assert "shard-00000.tar: cannot write shard: [Errno 27] File too large" in proc.stdout


def test_a_corrected_image_keeping_size_and_modification_time_is_read(
    volume_root: Path, contracts: Path, tmp_path: Path, stager: str
):
    """Found by a cold user (on a CSV day): a file rewritten with the same size and its old
    modification time put back (``cp -p``, ``rsync -t``) was taken for the listed one, and
    the old snapshot reused. The C scanner and the Python listing both stamp each file
    with its status-change time too, which no user can set back."""
    raw = tmp_path / "raw"
    DAY = ("2026-11-01T02:00:00+00:00", "2026-11-02T02:00:00+00:00")
    png(raw / "0" / "a.png", value=7, size=(8, 8))
    png(raw / "1" / "b.png", value=9, size=(8, 8))
    first = stage(pics_pipeline(raw), *DAY, quiet=True)
    assert stage(pics_pipeline(raw), *DAY, quiet=True).checked.startswith("source unchanged")
    path = raw / "0" / "a.png"
    st = path.stat()
    fixed = io.BytesIO()
    Image.new("L", (8, 8), 8).save(fixed, format="PNG")
    assert len(fixed.getvalue()) == st.st_size  # a corrected pixel value, the same size
    path.write_bytes(fixed.getvalue())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = stage(pics_pipeline(raw), *DAY, quiet=True)
    assert again.snapshot_id != first.snapshot_id and not again.reused, again.checked
    assert "source changed" in again.checked
