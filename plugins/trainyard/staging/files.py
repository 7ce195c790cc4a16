"""Folders of many small files (images) -> WebDataset-style tar shards + ``index.parquet``.

Each sample becomes two tar members, ``<key>.<ext>`` (the file's bytes) and ``<key>.cls``
(the label as ASCII digits), where ``<key>`` is ``<class>/<stem>`` without dots so
WebDataset groups them. Labels come from class folders (``<class>/<file>``; numeric folder
names are the label, other names are numbered in sorted order) or from a ``labels.csv``
(``file,label``) at the source root. Tar headers are built directly (POSIX ustar, fixed
mtime/owner), so the same files always give byte-identical shards, and each shard is hashed
while it is written.
"""

from __future__ import annotations

import csv
import io
import os
import posixpath
import re
import struct
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3

from trainyard.errors import StagingError
from trainyard.staging.sources import Source, SourceFile
from trainyard.volumes import ShardInfo, hash_file

LABELS_FILE = "labels.csv"
_BLOCK = 512
_FLUSH_BYTES = 4 << 20
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_ZERO_BLOCKS = b"\0" * (2 * _BLOCK)
# ustar header pieces around name (0:100), size (124:136) and checksum (148:156)
_MODE_IDS = b"0000644\0" + b"0000000\0" + b"0000000\0"
_MTIME = b"00000000000\0"
_TAIL = (b"0" + b"\0" * 100 + b"ustar\x0000").ljust(_BLOCK - 156, b"\0")
_CONST_SUM = sum(_MODE_IDS) + sum(_MTIME) + sum(_TAIL) + 8 * 0x20
_PADS = [b"\0" * n for n in range(_BLOCK)]


def tar_header(name: str, size: int) -> bytes:
    """A POSIX ustar header for a regular file (mode 0644, uid/gid 0, mtime 0).

    Args:
        name: Member name (PAX headers are used when it exceeds 100 bytes).
        size: Member size in bytes.

    Returns:
        512 bytes (or more, for a PAX long name).
    """
    raw = name.encode("utf-8")
    if len(raw) > 100 or size >= 8**11:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = size, 0o644, 0
        return info.tobuf(format=tarfile.PAX_FORMAT)
    size_field = b"%011o\0" % size
    chksum = _CONST_SUM + sum(raw) + sum(size_field)
    return b"".join(
        (raw.ljust(100, b"\0"), _MODE_IDS, size_field, _MTIME, b"%06o\0 " % chksum, _TAIL)
    )


def _pad(size: int) -> bytes:
    return _PADS[-size % _BLOCK]


def image_size(data: bytes, where: str) -> tuple[int, int]:
    """(width, height) of an image: PNG header directly, other formats through Pillow.

    Raises:
        StagingError: If the file is empty or not a readable image.
    """
    if not data:
        raise StagingError(f"{where}: image file is empty (0 bytes)")
    if data[:8] == _PNG_MAGIC and data[12:16] == b"IHDR" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return int(width), int(height)
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            return int(img.size[0]), int(img.size[1])
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise StagingError(f"{where}: not a readable image ({e})") from e


class _TarShards:
    """Writes tar shards with rollover by size, hashing bytes as they are written."""

    def __init__(self, out_dir: Path, target_bytes: int) -> None:
        self.out_dir = out_dir
        self.target_bytes = target_bytes
        self.shards: list[ShardInfo] = []
        self.fh: Any = None
        self.hasher: Any = None
        self.parts: list[bytes] = []
        self.pending = 0
        self.size = 0
        self.samples = 0
        self.name = ""

    def _open(self) -> None:
        self.name = f"shard-{len(self.shards):05d}.tar"
        self.fh = open(self.out_dir / self.name, "wb")  # noqa: SIM115 - closed in _close
        self.hasher = blake3.blake3()
        self.size = self.samples = 0

    def _flush(self) -> None:
        if self.parts:
            chunk = b"".join(self.parts)
            self.fh.write(chunk)
            self.hasher.update(chunk)
            self.parts = []
            self.pending = 0

    def add(self, key: str, ext: str, data: bytes, label: int) -> str:
        if self.fh is None:
            self._open()
        cls = b"%d" % label
        n = len(data)
        self.parts += (
            tar_header(f"{key}.{ext}", n),
            data,
            _PADS[-n % _BLOCK],
            tar_header(f"{key}.cls", len(cls)),
            cls,
            _PADS[-len(cls) % _BLOCK],
        )
        self.samples += 1
        added = 2 * _BLOCK + n + (-n % _BLOCK) + len(cls) + (-len(cls) % _BLOCK)
        self.size += added
        self.pending += added
        if self.pending >= _FLUSH_BYTES:
            self._flush()
        name = self.name
        if self.size >= self.target_bytes:
            self._close()
        return name

    def _close(self) -> None:
        self.parts.append(_ZERO_BLOCKS)
        self._flush()
        self.fh.close()
        path = self.out_dir / self.name
        self.shards.append(
            ShardInfo(self.name, path.stat().st_size, self.samples, self.hasher.hexdigest())
        )
        self.fh = None

    def finish(self) -> list[ShardInfo]:
        if self.fh is not None:
            self._close()
        return self.shards

    def abort(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None


def _read_labels_file(src: Source, f: SourceFile) -> dict[str, int]:
    labels: dict[str, int] = {}
    with src.fs.open(f.path, "rb") as fh:
        try:
            text = fh.read().decode("utf-8")
        except UnicodeDecodeError as e:
            raise StagingError(f"{f.path}: not UTF-8 text ({e.reason})") from e
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None)
    if not header or len(header) < 2:
        raise StagingError(f"{f.path}: row 1: expected a header 'file,label'")
    for lineno, row in enumerate(rows, start=2):
        if not row:
            continue
        if len(row) != 2:
            raise StagingError(f"{f.path}: row {lineno}: expected 2 columns, got {len(row)}")
        name, label = row[0].strip(), row[1].strip()
        parts = name.replace("\\", "/").split("/")
        if name.startswith("/") or ".." in parts or "" in parts:
            raise StagingError(
                f"{f.path}: row {lineno}: file name {name!r} tries to leave the source folder"
            )
        try:
            labels[name] = int(label)
        except ValueError as e:
            raise StagingError(
                f"{f.path}: row {lineno} column 'label': {label!r} is not an integer"
            ) from e
    return labels


_SAFE_KEY = re.compile(r"^[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)?$")


def _key(rel: str) -> tuple[str, str]:
    stem, ext = posixpath.splitext(rel)
    if _SAFE_KEY.match(stem):
        return stem, ext[1:].lower()
    parts = stem.split("/")
    head = parts[0] if len(parts) > 1 else ""
    tail = "_".join(parts[1:]) if len(parts) > 1 else parts[0]
    key = f"{_UNSAFE.sub('_', head)}/{_UNSAFE.sub('_', tail)}" if head else _UNSAFE.sub("_", tail)
    return key, ext.lstrip(".").lower()


def plan_samples(src: Source) -> tuple[list[tuple[SourceFile, str, str, int]], list[str] | None]:
    """Decide key, extension and label of every sample file.

    Returns:
        ``[(file, key, ext, label)]`` in key order, and the class names when labels were
        numbered from non-numeric folder names (else None).

    Raises:
        StagingError: For an unlabelled file, a labels file naming a missing file or a
            path outside the folder, or two files that map to the same key.
    """
    labels_file = next((f for f in _root_files(src) if f.rel == LABELS_FILE), None)
    samples = [f for f in src.files if f.rel != LABELS_FILE]
    classes: list[str] | None = None
    if labels_file is not None:
        labels = _read_labels_file(src, labels_file)
        by_rel = {f.rel: f for f in samples}
        missing = sorted(set(labels) - set(by_rel))
        if missing:
            raise StagingError(f"{labels_file.path}: lists {missing[0]!r}, which does not exist")
        unlabelled = sorted(set(by_rel) - set(labels))
        if unlabelled:
            raise StagingError(f"{by_rel[unlabelled[0]].path}: not listed in {LABELS_FILE}")
        label_of = {rel: labels[rel] for rel in by_rel}
    else:
        loose = [f for f in samples if "/" not in f.rel]
        if loose:
            raise StagingError(
                f"{loose[0].path}: no label (put samples in class folders or add {LABELS_FILE})"
            )
        names = sorted({f.rel.split("/", 1)[0] for f in samples})
        if all(n.isdigit() for n in names):
            index = {n: int(n) for n in names}
        else:
            classes = names
            index = {n: i for i, n in enumerate(names)}
        label_of = {f.rel: index[f.rel.split("/", 1)[0]] for f in samples}
    plan = []
    seen: dict[str, str] = {}
    for f in samples:
        key, ext = _key(f.rel)
        if key in seen:
            raise StagingError(f"{f.path}: maps to the same sample key {key!r} as {seen[key]!r}")
        seen[key] = f.path
        plan.append((f, key, ext, label_of[f.rel]))
    plan.sort(key=lambda p: p[1])
    return plan, classes


def _root_files(src: Source) -> list[SourceFile]:
    path = f"{src.root}/{LABELS_FILE}"
    if src.fs.isfile(path):
        info = src.fs.info(path)
        return [SourceFile(path, LABELS_FILE, int(info.get("size") or 0), "")]
    return []


def _read_file(src: Source, f: SourceFile, local: bool) -> bytes:
    if not local:
        return src.fs.cat_file(f.path)
    fd = os.open(f.path, os.O_RDONLY)
    try:
        return os.read(fd, f.size + 1)
    finally:
        os.close(fd)


def stage_files(
    src: Source,
    out_dir: Path,
    *,
    shard_target_mb: int,
    advance: Callable[[int], None],
) -> tuple[list[ShardInfo], Any, dict[str, Any]]:
    """Stream a folder of small files into tar shards and write ``index.parquet``.

    Args:
        src: An ``image_folder`` source.
        out_dir: The private snapshot directory being filled.
        shard_target_mb: Roll over to a new tar shard past this size.
        advance: Progress callback, bytes of source consumed.

    Returns:
        The shards (tar shards, then the index with role ``index``), the index's Arrow
        schema, and extra manifest facts (``classes`` when labels were numbered).

    Raises:
        StagingError: For an empty or unreadable image, a bad labels file, or a failed
            write (e.g. disk full); names the file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    plan, classes = plan_samples(src)
    if not plan:
        raise StagingError(f"{src.url}: source is empty (no sample files)")
    tars = _TarShards(out_dir, shard_target_mb << 20)
    keys: list[str] = []
    labels: list[int] = []
    shard_of: list[str] = []
    sizes: list[int] = []
    widths: list[int] = []
    heights: list[int] = []
    local = src.is_local
    try:
        for f, key, ext, label in plan:
            try:
                data = _read_file(src, f, local)
            except OSError as e:
                raise StagingError(f"{f.path}: cannot read source file: {e}") from e
            if len(data) != f.size:
                raise StagingError(
                    f"{f.path}: source changed while being staged (size {f.size} -> {len(data)}+)"
                )
            width, height = image_size(data, f.path)
            shard_of.append(tars.add(key, ext, data, label))
            keys.append(key)
            labels.append(label)
            sizes.append(len(data))
            widths.append(width)
            heights.append(height)
            advance(len(data))
        shards = tars.finish()
    except OSError as e:
        tars.abort()
        target = out_dir / tars.name if tars.name else out_dir
        raise StagingError(f"{target}: cannot write shard: {e}") from e
    finally:
        tars.abort()
    schema = pa.schema(
        [
            ("key", pa.string()),
            ("label", pa.int64()),
            ("shard", pa.string()),
            ("bytes", pa.int64()),
            ("width", pa.int64()),
            ("height", pa.int64()),
        ]
    )
    table = pa.table([keys, labels, shard_of, sizes, widths, heights], schema=schema)
    index_path = out_dir / "index.parquet"
    try:
        pq.write_table(table, index_path, compression="zstd", row_group_size=1 << 20)
    except OSError as e:
        raise StagingError(f"{index_path}: cannot write the index: {e}") from e
    shards.append(
        ShardInfo(
            "index.parquet", index_path.stat().st_size, len(keys), hash_file(index_path), "index"
        )
    )
    extra: dict[str, Any] = {"classes": classes} if classes else {}
    return shards, schema, extra
