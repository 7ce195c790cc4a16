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
import itertools
import mmap
import os
import pickle
import posixpath
import re
import signal
import struct
import sys
import tarfile
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard.errors import StagingError
from trainyard.staging.sources import Source, SourceFile
from trainyard.volumes import ShardInfo, hash_file

LABELS_FILE = "labels.csv"
_BLOCK = 512
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# ustar header: name (0:100), mode+uid+gid (100:124), size (124:136), mtime (136:148),
# checksum (148:156), then typeflag "0", empty link name, magic "ustar\0" version "00"
_HEADER = struct.Struct("100s24s12s12s8s356s")
_MODE_IDS = b"0000644\0" + b"0000000\0" + b"0000000\0"
_MTIME = b"00000000000\0"
_TAIL = (b"0" + b"\0" * 100 + b"ustar\x0000").ljust(_BLOCK - 156, b"\0")
_CONST_SUM = sum(_MODE_IDS) + sum(_MTIME) + sum(_TAIL) + 8 * 0x20
_CLS = b".cls"
_CLS_SUM = sum(_CLS)
_PIECE_MAX = 8 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# below this much data a second process costs more (fork, result pipe) than it saves
_PARALLEL_MIN_BYTES = 2 << 20


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
    return _HEADER.pack(raw, _MODE_IDS, size_field, _MTIME, b"%06o\0 " % chksum, _TAIL)


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
_SAFE_NAME = re.compile(r"([A-Za-z0-9_-]+(?:/[A-Za-z0-9_-]+)?)\.([A-Za-z0-9]+)")


def _key(rel: str) -> tuple[str, str]:
    safe = _SAFE_NAME.fullmatch(rel)
    if safe:
        return safe[1], safe[2].lower()
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
        label_of = {f.rel: index[f.rel.partition("/")[0]] for f in samples}
    plan = []
    for f in samples:
        key, ext = _key(f.rel)
        plan.append((f, key, ext, label_of[f.rel]))
    plan.sort(key=lambda p: p[1])
    for before, after in itertools.pairwise(plan):
        if before[1] == after[1]:
            raise StagingError(
                f"{after[0].path}: maps to the same sample key {after[1]!r} as {before[0].path!r}"
            )
    return plan, classes


def _root_files(src: Source) -> list[SourceFile]:
    path = f"{src.root}/{LABELS_FILE}"
    if src.fs.isfile(path):
        info = src.fs.info(path)
        return [SourceFile(path, LABELS_FILE, int(info.get("size") or 0), "")]
    return []


@dataclass
class _Layout:
    """Where every byte of every shard goes, decided from the listed sizes up front.

    Shards roll over once they reach the target size, in key order, exactly as a
    sequential writer would, so shard contents (and the snapshot id) do not depend on how
    many processes write them. ``pieces`` are contiguous runs of samples inside one shard:
    ``(shard, first, stop, start_offset, end_offset)``; the last piece of a shard also
    covers its two zero end-of-archive blocks.
    """

    names: list[str]
    sizes: list[int]
    rows: list[int]
    shard_of: list[int]
    pieces: list[tuple[int, int, int, int, int]]


def _layout(plan: list[tuple[SourceFile, str, str, int]], target: int, piece: int) -> _Layout:
    sizes: list[int] = []
    rows: list[int] = []
    shard_of: list[int] = []
    pieces: list[tuple[int, int, int, int, int]] = []
    shard = size = first = piece_start = 0
    for i, (f, key, ext, _label) in enumerate(plan):
        n = f.size
        data_hdr = (
            _BLOCK
            if len(key) + len(ext) < 100 and ext.isascii()
            else len(tar_header(f"{key}.{ext}", n))
        )
        cls_hdr = _BLOCK if len(key) <= 96 else len(tar_header(f"{key}.cls", 1))
        size += data_hdr + n + (-n % _BLOCK) + cls_hdr + _BLOCK
        shard_of.append(shard)
        last = i == len(plan) - 1
        if size >= target or last:
            end = size + 2 * _BLOCK
            pieces.append((shard, first, i + 1, piece_start, end))
            sizes.append(end)
            rows.append(i + 1 - sum(rows))
            shard += 1
            size = piece_start = 0
            first = i + 1
        elif size - piece_start >= piece:
            pieces.append((shard, first, i + 1, piece_start, size))
            piece_start, first = size, i + 1
    return _Layout([f"shard-{k:05d}.tar" for k in range(shard)], sizes, rows, shard_of, pieces)


def _put_header(buf: bytearray, at: int, raw: bytes, raw_sum: int, size: int) -> int:
    if len(raw) > 100 or size >= 8**11:
        header = tar_header(raw.decode("utf-8"), size)
        buf[at : at + len(header)] = header
        return len(header)
    size_field = b"%011o\0" % size
    chksum = _CONST_SUM + raw_sum + sum(size_field)
    _HEADER.pack_into(buf, at, raw, _MODE_IDS, size_field, _MTIME, b"%06o\0 " % chksum, _TAIL)
    return _BLOCK


class _PieceWriter:
    """Fills pieces of shards: reads the sample files straight into the piece's buffer."""

    def __init__(
        self,
        src: Source,
        plan: list[tuple[SourceFile, str, str, int]],
        fds: list[int],
        paths: list[Path],
        widths: array,
        heights: array,
    ) -> None:
        self.src = src
        self.local = src.is_local
        self.plan = plan
        self.fds = fds
        self.paths = paths
        self.widths = widths
        self.heights = heights
        self.dirs: dict[str, int] = {}  # source folder -> fd, files are opened relative to it

    def close(self) -> None:
        """Close the source folders opened by this process."""
        for fd in self.dirs.values():
            os.close(fd)
        self.dirs.clear()

    def write(self, piece: tuple[int, int, int, int, int]) -> int:
        """Build one piece in memory and write it at its offset; returns source bytes."""
        shard, first, stop, start, end = piece
        buf = bytearray(end - start)
        view = memoryview(buf)
        at = 0
        consumed = 0
        widths, heights, local, dirs = self.widths, self.heights, self.local, self.dirs
        for i in range(first, stop):
            f, key, ext, label = self.plan[i]
            n = f.size
            kraw = key.encode()
            ksum = sum(kraw)
            ename = b".%s" % ext.encode()
            at += _put_header(buf, at, kraw + ename, ksum + sum(ename), n)
            try:
                if local:
                    folder, _, name = f.path.rpartition("/")
                    dir_fd = dirs.get(folder)
                    if dir_fd is None:
                        dir_fd = dirs[folder] = os.open(folder or "/", _DIR_FLAGS)
                    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
                    try:
                        got = os.readv(fd, [view[at : at + n + 1]])
                        while 0 < got < n:
                            more = os.readv(fd, [view[at + got : at + n + 1]])
                            if not more:
                                break
                            got += more
                    finally:
                        os.close(fd)
                else:
                    data = self.src.fs.cat_file(f.path)
                    got = len(data)
                    if got == n:
                        buf[at : at + n] = data
            except OSError as e:
                raise StagingError(f"{f.path}: cannot read source file: {e}") from e
            if got != n:
                raise StagingError(
                    f"{f.path}: source changed while being staged "
                    f"(size {n} -> {got}{'+' if got > n else ''})"
                )
            if n >= 24 and buf.startswith(_PNG_MAGIC, at) and buf.startswith(b"IHDR", at + 12):
                widths[i], heights[i] = struct.unpack_from(">II", buf, at + 16)
            else:
                widths[i], heights[i] = image_size(bytes(view[at : at + n]), f.path)
            at += n + (-n % _BLOCK)
            cls = b"%d" % label
            at += _put_header(buf, at, kraw + _CLS, ksum + _CLS_SUM, len(cls))
            buf[at : at + len(cls)] = cls
            at += _BLOCK
            consumed += n
        view.release()
        fd, done = self.fds[shard], 0
        try:
            while done < len(buf):
                done += os.pwrite(fd, memoryview(buf)[done:], start + done)
        except OSError as e:
            raise StagingError(f"{self.paths[shard]}: cannot write shard: {e}") from e
        return consumed


def _default_workers() -> int:
    if sys.platform != "linux":
        return 1
    return max(1, min(len(os.sched_getaffinity(0)), 8))


def _run_pieces(
    writer: _PieceWriter,
    pieces: list[tuple[int, int, int, int, int]],
    workers: int,
    advance: Callable[[int], None],
) -> None:
    """Write every piece, ``workers`` processes taking every ``workers``-th piece.

    Each process stops at its first failure; the error reported is the one of the
    earliest failing piece, so a bad source gives the same message whatever the worker
    count. Children are forked (they share the plan and the open shard files) and send
    back only the image sizes they found.
    """
    if workers <= 1 or len(pieces) < 2:
        for piece in pieces:
            advance(writer.write(piece))
        return
    workers = min(workers, len(pieces))
    # one "earliest failed piece" slot per process, shared across the forks
    failed = mmap.mmap(-1, 8 * workers)
    slots = memoryview(failed).cast("q")
    for k in range(workers):
        slots[k] = len(pieces)
    children: list[tuple[int, int]] = []
    try:
        for k in range(1, workers):
            rfd, wfd = os.pipe()
            pid = os.fork()
            if pid == 0:  # child: never returns
                os.close(rfd)
                _child(writer, pieces, k, workers, slots, wfd)
            os.close(wfd)
            children.append((pid, rfd))
        errors: list[tuple[int, BaseException]] = []
        for j in range(0, len(pieces), workers):
            if j > min(slots):
                break
            try:
                advance(writer.write(pieces[j]))
            except StagingError as e:
                slots[0] = j
                errors.append((j, e))
                break
        for k, (pid, rfd) in enumerate(children, start=1):
            payload = _read_all(rfd)
            os.close(rfd)
            _, status = os.waitpid(pid, 0)
            children[k - 1] = (0, -1)
            if not payload:
                errors.append((slots[k], StagingError(f"staging worker {pid} died ({status})")))
                continue
            result = pickle.loads(payload)
            if result[0] == "error":
                errors.append((result[1], result[2]))
                continue
            for first, stop, w, h, consumed in result[1]:
                writer.widths[first:stop] = array("q", w)
                writer.heights[first:stop] = array("q", h)
                advance(consumed)
        if errors:
            raise min(errors, key=lambda e: e[0])[1]
    finally:
        for pid, rfd in children:
            if pid:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os.close(rfd)
        slots.release()
        failed.close()


def _child(
    writer: _PieceWriter,
    pieces: list[tuple[int, int, int, int, int]],
    k: int,
    workers: int,
    slots: memoryview,
    wfd: int,
) -> None:
    code = 0
    try:
        done = []
        result: tuple = ("ok", done)
        for j in range(k, len(pieces), workers):
            if j > min(slots):
                break
            try:
                consumed = writer.write(pieces[j])
            except StagingError as e:
                slots[k] = j
                result = ("error", j, e)
                break
            _shard, first, stop, _start, _end = pieces[j]
            done.append(
                (
                    first,
                    stop,
                    writer.widths[first:stop].tobytes(),
                    writer.heights[first:stop].tobytes(),
                    consumed,
                )
            )
        try:
            payload = pickle.dumps(result)
        except Exception as e:  # an unpicklable exception: keep its message
            payload = pickle.dumps(("error", result[1], StagingError(repr(e))))
        with os.fdopen(wfd, "wb") as out:
            out.write(payload)
    except BaseException:  # reported to the parent as a dead worker
        code = 1
    finally:
        os._exit(code)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def stage_files(
    src: Source,
    out_dir: Path,
    *,
    shard_target_mb: int,
    advance: Callable[[int], None],
    workers: int | None = None,
) -> tuple[list[ShardInfo], Any, dict[str, Any]]:
    """Pack a folder of small files into tar shards and write ``index.parquet``.

    The shard layout (which sample goes where, at which offset) is computed from the
    listed file sizes, then pieces of shards are filled in parallel: each file is read
    with one ``open``/``readv``/``close`` straight into the piece's buffer, headers are
    packed next to it, and the piece is written with one ``pwrite``. Shards are hashed
    once complete (BLAKE3, memory-mapped, multithreaded).

    Args:
        src: An ``image_folder`` source.
        out_dir: The private snapshot directory being filled.
        shard_target_mb: Roll over to a new tar shard past this size.
        advance: Progress callback, bytes of source consumed.
        workers: Processes writing pieces (default: usable CPUs, 1 off Linux or for
            small or remote sources). The output is byte-identical for any value.

    Returns:
        The shards (tar shards, then the index with role ``index``), the index's Arrow
        schema, and extra manifest facts (``classes`` when labels were numbered).

    Raises:
        StagingError: For an empty or unreadable image, a file whose size changed since
            it was listed, a bad labels file, or a failed write (e.g. disk full); names
            the file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    plan, classes = plan_samples(src)
    if not plan:
        raise StagingError(f"{src.url}: source is empty (no sample files)")
    total = sum(f.size for f, _k, _e, _l in plan)
    if workers is None:
        small = total < _PARALLEL_MIN_BYTES or not src.is_local
        workers = 1 if small else _default_workers()
    piece = max(64 << 10, min(_PIECE_MAX, total // (4 * workers) + 1))
    layout = _layout(plan, shard_target_mb << 20, piece)
    paths = [out_dir / name for name in layout.names]
    widths = array("q", bytes(8 * len(plan)))
    heights = array("q", bytes(8 * len(plan)))
    fds: list[int] = []
    try:
        for path in paths:
            try:
                fds.append(
                    os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                )
            except OSError as e:
                raise StagingError(f"{path}: cannot write shard: {e}") from e
        writer = _PieceWriter(src, plan, fds, paths, widths, heights)
        try:
            _run_pieces(writer, layout.pieces, workers, advance)
        finally:
            writer.close()
    finally:
        for fd in fds:
            os.close(fd)
    shards = [
        ShardInfo(name, size, rows, hash_file(path))
        for name, size, rows, path in zip(
            layout.names, layout.sizes, layout.rows, paths, strict=True
        )
    ]
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
    table = pa.table(
        [
            [p[1] for p in plan],
            [p[3] for p in plan],
            pa.DictionaryArray.from_arrays(layout.shard_of, layout.names).cast(pa.string()),
            [p[0].size for p in plan],
            pa.Array.from_buffers(pa.int64(), len(plan), [None, pa.py_buffer(widths)]),
            pa.Array.from_buffers(pa.int64(), len(plan), [None, pa.py_buffer(heights)]),
        ],
        schema=schema,
    )
    index_path = out_dir / "index.parquet"
    try:
        pq.write_table(table, index_path, compression="zstd", row_group_size=1 << 20)
    except OSError as e:
        raise StagingError(f"{index_path}: cannot write the index: {e}") from e
    shards.append(
        ShardInfo(
            "index.parquet", index_path.stat().st_size, len(plan), hash_file(index_path), "index"
        )
    )
    extra: dict[str, Any] = {"classes": classes} if classes else {}
    return shards, schema, extra
