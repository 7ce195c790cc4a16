"""Hostile sources: each is one clear StagingError naming the thing, no hang, nothing published.

FIFOs, files swapped after listing, symbolic link loops, over-long paths, oversized rows,
labels and image headers, more class folders than open files allowed, undeclared columns
and non-string keys. Both fillers (the C packer and the Python path) are exercised where
they differ.
"""

from __future__ import annotations

import io
import os
import signal
import struct
import subprocess
import sys
import textwrap
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from trainyard import volumes
from trainyard.config import PipelineConfig
from trainyard.errors import ContractError, StagingError
from trainyard.staging import files, sources, stage
from trainyard.staging.sources import open_source

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"

IMAGE_CONTRACT = """\
dataset: pics
version: 1.0.0
owner: tests@example.com
source: {format: image_folder, extension: png}
roles: {key: key, label: label, features: [width], num_classes: 2}
split: {holdout_fraction: 0.2, by: key}
columns:
  - {name: key, type: string}
  - {name: label, type: int64}
  - {name: width, type: int64}
"""

TABLE_CONTRACT = """\
dataset: tx
version: 1.0.0
owner: tests@example.com
source: {format: %(fmt)s}
roles: {key: id, label: y, features: [x], num_classes: 2}
split: {holdout_fraction: 0.2, by: id}
columns:
  - {name: id, type: %(key_type)s}
  - {name: x, type: float64}
  - {name: y, type: int64}
"""


@pytest.fixture
def contracts(contracts_dir: Path) -> Path:
    folder = contracts_dir
    (folder / "pics.yaml").write_text(IMAGE_CONTRACT)
    return folder


@pytest.fixture(params=["native", "python"])
def stager(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with the C packer (plain names) and with the pure-Python path."""
    if request.param == "python":
        monkeypatch.setattr(sources, "_native", None)
    elif sources._native is None:
        pytest.skip("the C staging module is not built")
    return request.param


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    """A hang fails the test after 60 s instead of stalling the suite."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError("staging hung")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(60)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def pipeline(dataset: str, url: Path | str, fmt: str = "image_folder") -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": dataset,
            "dataset": dataset,
            "start_date": "2026-11-01",
            "source": {"url": str(url), "format": fmt},
            "staging": {"shard_target_mb": 1},
            "training": {"model": "mlp"},
            "serving": {"model_name": dataset},
        }
    )


def png(side: int = 8, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (side, side), dtype=np.uint8), "L").save(out, "PNG")
    return out.getvalue()


def tree(raw: Path, classes: int = 2, per_class: int = 3) -> list[Path]:
    paths = []
    for c in range(classes):
        for i in range(per_class):
            path = raw / str(c) / f"img_{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(png(seed=c * 100 + i))
            paths.append(path)
    return paths


def published(volume_root: Path, dataset: str) -> list[str]:
    folder = volume_root / dataset / "snapshots"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def refused(volume_root: Path, dataset: str, url: Path | str, fragment: str, **kw: str) -> str:
    with pytest.raises(StagingError) as info:
        stage(pipeline(dataset, url, **kw), quiet=True)
    message = str(info.value)
    assert fragment in message, message
    assert published(volume_root, dataset) == []
    return message


def test_fifo_in_an_image_folder_is_refused(volume_root: Path, contracts: Path, tmp_path: Path):
    raw = tmp_path / "raw"
    tree(raw)
    os.mkfifo(raw / "1" / "img_9.png")
    message = refused(volume_root, "pics", raw, "not a regular file (a FIFO)")
    assert "1/img_9.png" in message


def _swap_after_listing(
    raw: Path, tmp_path: Path, replace: str
) -> tuple[sources.Source, Path, Path]:
    tree(raw)
    victim = raw / "1" / "img_1.png"
    src = open_source(str(raw), "image_folder", "png")
    size, mtime = victim.stat().st_size, victim.stat().st_mtime_ns
    victim.unlink()
    if replace == "fifo":
        os.mkfifo(victim)
    else:
        outside = tmp_path / "secret.png"
        outside.write_bytes(b"S" * size)
        os.utime(outside, ns=(mtime, mtime))
        victim.symlink_to(outside)
    out = tmp_path / "out"
    out.mkdir()
    return src, victim, out


@pytest.mark.parametrize(
    ("replace", "fragment"),
    [
        ("fifo", "not a regular file any more"),
        ("outside-link", "symbolic link now"),
    ],
)
def test_file_swapped_after_listing_fails_without_hanging(
    tmp_path: Path, stager: str, replace: str, fragment: str
):
    src, victim, out = _swap_after_listing(tmp_path / "raw", tmp_path, replace)
    assert (src.native is not None) == (stager == "native")
    with pytest.raises(StagingError) as info:
        files.stage_files(src, out, shard_target_mb=1, advance=lambda n, files: None, workers=1)
    assert str(victim) in str(info.value) and fragment in str(info.value), str(info.value)
    assert b"SSSS" not in b"".join(p.read_bytes() for p in out.glob("*.tar"))


@pytest.mark.parametrize("kind", ["folder-loop", "file-loop"])
def test_symbolic_link_loops_are_refused(
    volume_root: Path, contracts: Path, tmp_path: Path, kind: str
):
    raw = tmp_path / "raw"
    tree(raw)
    if kind == "folder-loop":
        (raw / "1" / "again").symlink_to(raw)
    else:
        (raw / "1" / "a.png").symlink_to(raw / "1" / "b.png")
        (raw / "1" / "b.png").symlink_to(raw / "1" / "a.png")
    refused(volume_root, "pics", raw, "symbolic link loop")


def test_over_long_path_is_a_clear_error(volume_root: Path, contracts: Path, tmp_path: Path):
    raw = tmp_path / "raw"
    tree(raw)
    # nested folders until the path is longer than PATH_MAX (4096)
    fd = os.open(raw / "1", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(20):
            os.mkdir("d" * 250, dir_fd=fd)
            child = os.open("d" * 250, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        with os.fdopen(os.open("deep.png", os.O_WRONLY | os.O_CREAT, dir_fd=fd), "wb") as fh:
            fh.write(png())
    finally:
        os.close(fd)
    refused(volume_root, "pics", raw, "File name too long")


@pytest.mark.parametrize("where", ["labels-file", "class-folder"])
def test_six_hundred_digit_label_is_refused(
    volume_root: Path, contracts: Path, tmp_path: Path, stager: str, where: str
):
    raw = tmp_path / "raw"
    tree(raw)
    huge = "9" * 600
    if where == "labels-file":
        rows = [f"{p.relative_to(raw)},{huge if i == 2 else 1}" for i, p in enumerate(tree(raw))]
        (raw / "labels.csv").write_text("file,label\n" + "\n".join(rows) + "\n")
        fragment = "row 4 column 'label'"
    else:
        # a folder name holds at most 255 bytes: 200 digits overflow an int64 just as well
        huge = huge[:200]
        (raw / "1").rename(raw / huge)
        fragment = f"{huge}: class folder"
    message = refused(volume_root, "pics", raw, "not an integer label of at most 18 digits")
    assert fragment in message


def _png_claiming(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    body = struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    return b"\x89PNG\r\n\x1a\n" + body + b"\0" * 64


def test_image_header_claiming_60000_square_pixels_is_refused(
    volume_root: Path, contracts: Path, tmp_path: Path, stager: str
):
    raw = tmp_path / "raw"
    tree(raw)
    (raw / "0" / "bomb.png").write_bytes(_png_claiming(60000, 60000))
    message = refused(volume_root, "pics", raw, "claims 60000x60000 pixels")
    assert "0/bomb.png" in message


FOLDERS_UNDER_LOW_ULIMIT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
from pathlib import Path
from trainyard.staging import sources, files
if sys.argv[2] == "python":
    sources._native = None
src = sources.open_source(sys.argv[1], "image_folder", "png")
assert (src.native is None) == (sys.argv[2] == "python"), sys.argv[2]
out = Path(sys.argv[3])
out.mkdir()
shards, _, _ = files.stage_files(src, out, shard_target_mb=1, advance=lambda n, files: None)
print(" ".join(s.hash for s in shards))
"""


def test_1500_class_folders_stage_under_ulimit_1024(tmp_path: Path):
    raw = tmp_path / "raw"
    body = png()
    for c in range(1500):
        (raw / f"c{c:04d}").mkdir(parents=True)
        (raw / f"c{c:04d}" / "a.png").write_bytes(body)
    hashes = []
    for way in ("native", "python"):
        proc = subprocess.run(
            [sys.executable, "-c", FOLDERS_UNDER_LOW_ULIMIT, str(raw), way, str(tmp_path / way)],
            capture_output=True,
            text=True,
            cwd=PLUGINS,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        hashes.append(proc.stdout.split())
    assert hashes[0] == hashes[1] and hashes[0]


@pytest.fixture
def table_contract(contracts_dir: Path) -> Path:
    return contracts_dir


def write_contract(folder: Path, fmt: str = "csv", key_type: str = "string") -> None:
    (folder / "tx.yaml").write_text(TABLE_CONTRACT % {"fmt": fmt, "key_type": key_type})


def test_ten_megabyte_csv_row_names_the_row(
    volume_root: Path, table_contract: Path, tmp_path: Path
):
    write_contract(table_contract)
    src = tmp_path / "tx.csv"
    src.write_text("id,x,y\na,1.0,0\nb," + "1" * (10 << 20) + ",1\nc,2.0,1\n")
    refused(volume_root, "tx", src, "row 3: longer than 2 MB", fmt="csv")


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_undeclared_column_is_refused_unless_allowed(
    volume_root: Path, table_contract: Path, tmp_path: Path, fmt: str
):
    write_contract(table_contract, fmt)
    rows = {"id": ["a", "b"], "x": [1.0, 2.0], "y": [0, 1], "ssn": ["123", "456"]}
    src = tmp_path / f"tx.{fmt}"
    if fmt == "csv":
        src.write_text("id,x,y,ssn\na,1.0,0,123\nb,2.0,1,456\n")
    elif fmt == "jsonl":
        src.write_text('{"id": "a", "x": 1.0, "y": 0, "ssn": "123"}\n')
    else:
        pq.write_table(pa.table(rows), src)
    message = refused(volume_root, "tx", src, "column 'ssn' is not in the contract", fmt=fmt)
    assert str(src) in message
    contract = (table_contract / "tx.yaml").read_text()
    (table_contract / "tx.yaml").write_text(contract + "allow_extra_columns: true\n")
    result = stage(pipeline("tx", src, fmt), quiet=True)
    assert pq.read_table(volumes.table_files(result.path)).schema.names == ["id", "x", "y"]


def test_int64_key_column_is_refused_before_staging(
    volume_root: Path, table_contract: Path, tmp_path: Path
):
    write_contract(table_contract, key_type="int64")
    src = tmp_path / "tx.csv"
    src.write_text("id,x,y\n1,1.0,0\n2,2.0,1\n")
    with pytest.raises(ContractError, match=r"roles\.key: key column 'id' is int64"):
        stage(pipeline("tx", src, "csv"), quiet=True)
    assert published(volume_root, "tx") == []
    # declared as a string, the integers are staged as text and train as keys
    write_contract(table_contract, key_type="string")
    result = stage(pipeline("tx", src, "csv"), quiet=True)
    keys = pq.read_table(volumes.table_files(result.path)).column("id").to_pylist()
    assert keys == ["1", "2"]


def test_hostile_staging_from_the_cli_is_one_line_no_traceback(
    volume_root: Path, contracts: Path, tmp_path: Path
):
    raw = tmp_path / "raw"
    tree(raw)
    os.mkfifo(raw / "0" / "pipe.png")
    script = textwrap.dedent(
        f"""
        import sys
        from trainyard.config import PipelineConfig
        from trainyard.errors import TrainyardError
        from trainyard.staging import stage
        p = PipelineConfig.model_validate({{
            "name": "pics", "dataset": "pics", "start_date": "2026-11-01",
            "source": {{"url": {str(raw)!r}, "format": "image_folder"}},
            "training": {{"model": "mlp"}}, "serving": {{"model_name": "pics"}}}})
        try:
            stage(p, quiet=True)
        except TrainyardError as e:
            print(e, file=sys.stderr)
            sys.exit(1)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=PLUGINS,
        env=os.environ.copy(),
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "0/pipe.png: not a regular file (a FIFO)" in proc.stderr


def test_a_csv_with_a_byte_order_mark_stages(
    volume_root: Path, table_contract: Path, tmp_path: Path
):
    """Found by a cold user: a UTF-8 BOM (as Excel writes) made the first column "missing"
    in a message that showed the header as it should be (the mark is invisible)."""
    write_contract(table_contract)
    src = tmp_path / "tx.csv"
    src.write_bytes(b"\xef\xbb\xbfid,x,y\r\na,1.0,0\r\nb,2.0,1\r\n")
    result = stage(pipeline("tx", src, "csv"), quiet=True)
    table = pq.read_table(volumes.table_files(result.path))
    assert table.column("id").to_pylist() == ["a", "b"] and table.schema.names == ["id", "x", "y"]


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
@pytest.mark.parametrize("twice", ["y", "x"])
def test_a_column_named_twice_is_refused(
    volume_root: Path, table_contract: Path, tmp_path: Path, fmt: str, twice: str
):
    """Found by a cold user: a CSV header naming the label twice staged the first copy and
    dropped the second, as the same snapshot as the file without it."""
    write_contract(table_contract, fmt)
    src = tmp_path / f"tx.{fmt}"
    if fmt == "csv":
        src.write_text(f"id,x,y,{twice}\na,1.0,0,7\nb,2.0,1,7\n")
    elif fmt == "jsonl":
        src.write_text(f'{{"id": "a", "x": 1.0, "y": 0, "{twice}": 7}}\n')
    else:
        columns = [pa.array(["a", "b"]), pa.array([1.0, 2.0]), pa.array([0, 1]), pa.array([7, 7])]
        pq.write_table(pa.Table.from_arrays(columns, names=["id", "x", "y", twice]), src)
    message = refused(volume_root, "tx", src, f"'{twice}'", fmt=fmt)
    assert "twice" in message, message
    assert str(src) in message


@pytest.mark.parametrize("name", ["light level", "extra col ü", "2nd"])
def test_a_column_no_contract_can_name_says_to_rename_or_drop_it(
    volume_root: Path, table_contract: Path, tmp_path: Path, name: str
):
    """Found by a cold user: 'declare it' was the advice for a column named 'extra col ü',
    which the contract's column names cannot be."""
    write_contract(table_contract)
    src = tmp_path / "tx.csv"
    src.write_text(f"id,x,y,{name}\na,1.0,0,1\nb,2.0,1,1\n")
    message = refused(volume_root, "tx", src, f"column {name!r} is not in the contract", fmt="csv")
    assert "no contract can name it" in message and "rename it in the source" in message
    assert "declare it" not in message


def test_a_quoted_header_name_spanning_lines_is_named_whole(
    volume_root: Path, table_contract: Path, tmp_path: Path
):
    """Found by a cold user: the column ``"ev\x1b[31milé\r\nx"`` was named without the
    ``x`` after its line break (the header was read as one line, the data by the CSV rules)."""
    write_contract(table_contract)
    src = tmp_path / "tx.csv"
    src.write_bytes(b'id,x,y,"ev\x1b[31mil\xc3\xa9\r\nx"\na,1.0,0,1\nb,2.0,1,1\n')
    name = "ev\x1b[31milé\r\nx"
    message = refused(volume_root, "tx", src, f"column {name!r} is not in the contract", fmt="csv")
    assert "no contract can name it" in message


def test_a_header_name_with_a_space_around_it_is_pointed_out(
    volume_root: Path, table_contract: Path, tmp_path: Path
):
    """Found by a cold user: ``column 'x' of the contract is missing (header: id, x , y)``
    did not show the trailing space that made it so."""
    write_contract(table_contract)
    src = tmp_path / "tx.csv"
    src.write_text("id,x ,y\na,1.0,0\nb,2.0,1\n")
    message = refused(volume_root, "tx", src, "column 'x' of the contract is missing", fmt="csv")
    assert "the header has 'x ', with spaces around it (header: id, 'x ', y)" in message
