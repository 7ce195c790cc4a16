"""Folders of many small files (images) -> WebDataset-style tar shards + ``index.parquet``.

Each sample becomes two tar members, ``<key>.<ext>`` (the file's bytes) and ``<key>.cls``
(the label as ASCII digits), where ``<key>`` is ``<class>/<stem>`` without dots so
WebDataset groups them. Labels come from class folders (``<class>/<file>``; numeric folder
names are the label, other names are numbered in sorted order) or from a ``labels.csv``
(``file,label``) at the source root. Tar headers are built directly (POSIX ustar, fixed
mtime/owner), so the same files always give byte-identical shards.

Speed (many files of a few KB): the shard layout is fixed from the listed sizes before any
file is read, so every member's offset is known, and pieces of shards can be filled in any
order with the same result. Two fillers write the same bytes:

* the C packer (``_native.c``, built by ``setup.py``) for the common case,
  a local folder of class folders of plainly named files (``<class>/<stem>.<ext>``, as the
  C scanner in :mod:`.sources` lists it): threads read each file straight into its slot
  (``open``/``read``/``fstat``/``close``), write headers beside it, ``pwrite`` each piece
  and start its writeback, with no Python object per file;
* the Python path for everything else (labels file, nested folders, names that need
  rewriting or PAX headers, object stores): headers of a run of samples built at once with
  numpy, files read with ``readv`` into a reused buffer, pieces filled by forked processes.

Each shard is hashed (BLAKE3) once complete.
"""

from __future__ import annotations

import csv
import errno
import io
import itertools
import os
import posixpath
import re
import struct
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from stat import S_ISREG
from typing import Any

from trainyard.contracts import MAX_IMAGE_PIXELS
from trainyard.errors import StagingError
from trainyard.progress import Advance
from trainyard.staging.forks import gc_paused, run_forked, shared_array, usable_cpus
from trainyard.staging.sources import Source, SourceFile, change_stamp, under
from trainyard.volumes import ShardInfo, hash_file

LABELS_FILE = "labels.csv"
#: Labels are class numbers: 18 digits always fit an int64.
MAX_LABEL_DIGITS = 18
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
_PIECE_MAX = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_MAX_DIR_FDS = 256
# below this much data and this many files a second process costs more than it saves
_PARALLEL_MIN_BYTES = 64 << 20
_PARALLEL_MIN_FILES = 8192
_NATIVE_PARALLEL_MIN_FILES = 1024


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
    except Image.DecompressionBombError as e:
        raise StagingError(f"{where}: image too large ({e})") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise StagingError(f"{where}: not a readable image ({e})") from None


def label_value(text: str, where: str) -> int:
    """A label as an integer of at most :data:`MAX_LABEL_DIGITS` digits (int64 range).

    Raises:
        StagingError: Naming ``where``, for a value that is not an integer or does not
            fit a 64-bit label.
    """
    digits = text.strip()
    if len(digits.lstrip("+-")) > MAX_LABEL_DIGITS or not digits.lstrip("+-").isdigit():
        shown = text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"
        raise StagingError(f"{where}: {shown!r} is not an integer label of at most 18 digits")
    return int(digits)


def _read_error(e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return "it is a symbolic link now (it was a regular file when listed)"
    return str(e)


def check_image_sizes(widths: Any, heights: Any, path_of: Callable[[int], str]) -> None:
    """Refuse the first image (in key order) whose header claims too many pixels.

    Raises:
        StagingError: Naming the file and its claimed size.
    """
    import numpy as np

    pixels = np.asarray(widths, np.int64) * np.asarray(heights, np.int64)
    over = np.flatnonzero(pixels > MAX_IMAGE_PIXELS)
    if len(over):
        i = int(over[0])
        raise StagingError(
            f"{path_of(i)}: image header claims {int(widths[i])}x{int(heights[i])} pixels, "
            f"more than the {MAX_IMAGE_PIXELS} allowed"
        )


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
        labels[name] = label_value(label, f"{f.path}: row {lineno} column 'label'")
    return labels


_SAFE_KEY = re.compile(r"^[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)?$")
# names (one per line) that are all their own keys: "[<class>/]<stem>.<ext>"
_ALL_SAFE = re.compile(r"(?:(?:[A-Za-z0-9_-]+/)?[A-Za-z0-9_-]+\.[A-Za-z0-9]+\n)*")


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
    index: dict[str, int] = {}
    label_of: dict[str, int] | None = None
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
            index = {n: label_value(n, f"{src.root}/{n}: class folder") for n in names}
        else:
            classes = names
            index = {n: i for i, n in enumerate(names)}
    rels = [f.rel for f in samples]
    if _ALL_SAFE.fullmatch("".join(r + "\n" for r in rels)):
        # every name is its own key: "<key>.<ext>", the key "[<class>/]<stem>"
        parts = [r.rpartition(".") for r in rels]
        keys = [p[0] for p in parts]
        exts = [p[2].lower() for p in parts]
        if label_of is None:
            labels = [index[k.partition("/")[0]] for k in keys]
        else:
            labels = [label_of[r] for r in rels]
        plan = list(zip(samples, keys, exts, labels, strict=True))
    else:
        plan = []
        for f in samples:
            key, ext = _key(f.rel)
            folder = f.rel.partition("/")[0]
            plan.append((f, key, ext, index[folder] if label_of is None else label_of[f.rel]))
    plan.sort(key=itemgetter(1))
    if len({p[1] for p in plan}) != len(plan):
        for before, after in itertools.pairwise(plan):
            if before[1] == after[1]:
                raise StagingError(
                    f"{after[0].path}: maps to the same sample key {after[1]!r} "
                    f"as {before[0].path!r}"
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
    many processes write them. Per sample: ``start`` (offset of its first header in its
    shard), ``data_hdr``/``cls_hdr`` (header lengths, 512 unless a PAX long name).
    ``pieces`` are contiguous runs of samples inside one shard: ``(shard, first, stop,
    start_offset, end_offset)``; the last piece of a shard also covers its two zero
    end-of-archive blocks.
    """

    names: list[str]
    sizes: list[int]
    rows: list[int]
    shard_of: Any
    start: Any
    data_hdr: Any
    cls_hdr: Any
    pieces: list[tuple[int, int, int, int, int]]


def _header_lengths(plan: list[tuple[SourceFile, str, str, int]], sizes: Any) -> tuple[Any, Any]:
    """Header lengths of every data and ``.cls`` member: 512 unless a PAX long name."""
    import numpy as np

    n = len(plan)
    key_len = np.fromiter((len(p[1]) for p in plan), np.int64, n)
    ext_len = {e: len(e.encode()) for e in {p[2] for p in plan}}
    name_len = key_len + 1 + np.fromiter((ext_len[p[2]] for p in plan), np.int64, n)
    data_hdr = np.full(n, _BLOCK, np.int64)
    for i in np.flatnonzero((name_len > 100) | (sizes >= 8**11)).tolist():
        data_hdr[i] = len(tar_header(f"{plan[i][1]}.{plan[i][2]}", int(sizes[i])))
    cls_hdr = np.full(n, _BLOCK, np.int64)
    for i in np.flatnonzero(key_len + 4 > 100).tolist():
        cls_hdr[i] = len(tar_header(f"{plan[i][1]}.cls", 1))
    return data_hdr, cls_hdr


def _layout(sizes: Any, data_hdr: Any, cls_hdr: Any, target: int, piece: int) -> _Layout:
    import numpy as np

    n = len(sizes)
    record = data_hdr + sizes + (-sizes % _BLOCK) + cls_hdr + _BLOCK
    ends = np.cumsum(record)
    start = ends - record
    shard_of = np.empty(n, np.int64)
    shard_sizes: list[int] = []
    rows: list[int] = []
    pieces: list[tuple[int, int, int, int, int]] = []
    first = 0
    while first < n:
        base = int(start[first])
        # a shard closes at the first sample that brings it to the target size
        last = min(int(np.searchsorted(ends, base + target, side="left")), n - 1)
        stop = last + 1
        shard = len(shard_sizes)
        shard_of[first:stop] = shard
        start[first:stop] -= base
        end = int(ends[last]) - base + 2 * _BLOCK
        shard_sizes.append(end)
        rows.append(stop - first)
        at = first
        while at < stop:
            cut = min(int(np.searchsorted(start[at:stop], start[at] + piece)) + at, stop)
            cut = max(cut, at + 1)
            piece_end = end if cut == stop else int(start[cut])
            pieces.append((shard, at, cut, int(start[at]), piece_end))
            at = cut
        first = stop
    names = [f"shard-{k:05d}.tar" for k in range(len(shard_sizes))]
    return _Layout(names, shard_sizes, rows, shard_of, start, data_hdr, cls_hdr, pieces)


def _octal(values: Any, digits: int) -> Any:
    """``values`` as zero-padded octal ASCII digits, one row per value."""
    import numpy as np

    shifts = 3 * np.arange(digits - 1, -1, -1, dtype=np.int64)
    return ((values[:, None] >> shifts) & 7).astype(np.uint8) + ord("0")


def _headers(keys: list[str], suffix: bytes, sizes: Any) -> Any:
    """POSIX ustar headers of ``<key><suffix>`` members, one 512-byte row each.

    Byte for byte what :func:`tar_header` packs (names of at most 100 bytes), for many
    members at once.
    """
    import numpy as np

    n = len(keys)
    out = np.empty((n, _BLOCK), np.uint8)
    out[:] = np.frombuffer(_HEADER.pack(b"", _MODE_IDS, b"", _MTIME, b"", _TAIL), np.uint8)
    names = np.array(keys, dtype="S100").view(np.uint8).reshape(n, 100)
    key_len = np.fromiter(map(len, keys), np.int64, n)
    rows = np.arange(n)
    for j, byte in enumerate(suffix):
        names[rows, key_len + j] = byte
    out[:, :100] = names
    out[:, 124:135] = _octal(sizes, 11)
    out[:, 135] = 0
    out[:, 148:156] = ord(" ")
    chksum = out.sum(axis=1, dtype=np.int64)
    out[:, 148:154] = _octal(chksum, 6)
    out[:, 154] = 0
    return out


class _PieceWriter:
    """Fills pieces of shards: reads the sample files straight into the piece's buffer."""

    def __init__(
        self,
        src: Source,
        plan: list[tuple[SourceFile, str, str, int]],
        sizes: Any,
        layout: _Layout,
        fds: list[int],
        paths: list[Path],
    ) -> None:
        import numpy as np

        self.src = src
        self.local = src.is_local
        self.plan = plan
        self.sizes = sizes
        self.layout = layout
        self.fds = fds
        self.paths = paths
        # shared memory: forked writers fill in the sizes of the images they read
        self.widths = shared_array(len(plan), np.int64)
        self.heights = shared_array(len(plan), np.int64)
        # files are opened relative to their folder (openat), folders opened once
        folders: dict[str, int] = {}
        splits = [p[0].path.rpartition("/") for p in plan]
        self.base = [name for _, _, name in splits]
        self.folder_of = [folders.setdefault(d or "/", len(folders)) for d, _, _ in splits]
        self.folders = list(folders)
        self.stamps = [p[0].stamp for p in plan]
        exts = {e: k for k, e in enumerate(sorted({p[2] for p in plan}))}
        self.exts = list(exts)
        self.ext_of = np.array([exts[p[2]] for p in plan], np.int64)
        self.dir_fds: dict[int, int] = {}
        self.buffer = bytearray()

    def close(self) -> None:
        """Close the source folders opened by this process."""
        for fd in self.dir_fds.values():
            os.close(fd)
        self.dir_fds.clear()

    def _dir_fd(self, k: int) -> int:
        fd = self.dir_fds.get(k)
        if fd is None:
            fd = self.dir_fds[k] = os.open(self.folders[k], _DIR_FLAGS)
        return fd

    def _members(self, first: int, stop: int, sizes: Any) -> tuple[Any, Any, dict[int, bytes]]:
        """Data member headers (n x 512) and ``.cls`` members (n x 1024) of a piece.

        Samples whose names need PAX headers get theirs in the third value instead (to be
        placed after the block rows), as ``{row: data header}`` and ``{-1 - row: cls
        member}``.
        """
        import numpy as np

        lay, plan = self.layout, self.plan
        n = stop - first
        keys = [p[1] for p in plan[first:stop]]
        labels = [b"%d" % p[3] for p in plan[first:stop]]
        data = np.empty((n, _BLOCK), np.uint8)
        ext_of = self.ext_of[first:stop]
        plain = lay.data_hdr[first:stop] == _BLOCK
        for e in np.unique(ext_of).tolist():
            rows = ((ext_of == e) & plain).nonzero()[0]
            suffix = b".%s" % self.exts[e].encode()
            data[rows] = _headers([keys[r] for r in rows.tolist()], suffix, sizes[rows])
        cls = np.zeros((n, 2 * _BLOCK), np.uint8)
        cls_len = np.fromiter(map(len, labels), np.int64, n)
        rows = (lay.cls_hdr[first:stop] == _BLOCK).nonzero()[0]
        cls[rows, :_BLOCK] = _headers([keys[r] for r in rows.tolist()], _CLS, cls_len[rows])
        width = int(cls_len.max())
        cls[:, _BLOCK : _BLOCK + width] = (
            np.array(labels, dtype=f"S{width}").view(np.uint8).reshape(n, width)
        )
        odd: dict[int, bytes] = {}
        for r in (lay.data_hdr[first:stop] != _BLOCK).nonzero()[0].tolist():
            p = plan[first + r]
            odd[r] = tar_header(f"{p[1]}.{p[2]}", int(sizes[r]))
        for r in (lay.cls_hdr[first:stop] != _BLOCK).nonzero()[0].tolist():
            body = labels[r].ljust(_BLOCK, b"\0")
            odd[-1 - r] = tar_header(f"{keys[r]}.cls", len(labels[r])) + body
        return data, cls, odd

    def write(self, piece: tuple[int, int, int, int, int]) -> int:
        """Build one piece in memory and write it at its offset; returns source bytes.

        Every member starts on a 512-byte block, so the headers of the whole piece are
        placed with two block-row assignments; the loop over files only opens, reads
        (straight into the member's slot) and closes.

        Raises:
            StagingError: For the first sample of the piece (in key order) that cannot be
                read, changed size since it was listed, or is not a readable image; or
                when the shard cannot be written.
        """
        import numpy as np

        shard, first, stop, start, end = piece
        lay = self.layout
        # one buffer per process, reused: fresh memory would page-fault on every write
        reused = len(self.buffer) >= end - start
        if not reused:
            self.buffer = bytearray(end - start)
        buf = memoryview(self.buffer)[: end - start]
        arr = np.frombuffer(buf, np.uint8)
        blocks = arr.reshape(-1, _BLOCK)
        sizes = self.sizes[first:stop]
        rec = lay.start[first:stop] - start
        data_at = rec + lay.data_hdr[first:stop]
        cls_at = data_at + sizes + (-sizes % _BLOCK)
        if reused:
            # every byte is overwritten below except the padding after each body and
            # the end-of-archive blocks: zero just those blocks
            blocks[(cls_at[sizes > 0] // _BLOCK) - 1] = 0
            blocks[(cls_at[-1] + 2 * _BLOCK) // _BLOCK :] = 0
        data, cls, odd = self._members(first, stop, sizes)
        blocks[rec // _BLOCK] = data
        cls_block = cls_at // _BLOCK
        blocks[cls_block] = cls[:, :_BLOCK]
        blocks[cls_block + 1] = cls[:, _BLOCK:]
        for r, member in odd.items():
            at = int(rec[r]) if r >= 0 else int(cls_at[-1 - r])
            buf[at : at + len(member)] = member
        failed = self._fill(buf, first, stop, data_at.tolist(), sizes.tolist())
        count = stop - first if failed is None else failed[0]
        self._image_sizes(arr, first, data_at[:count], sizes[:count])
        if failed is not None:
            raise failed[1]
        fd, written = self.fds[shard], 0
        try:
            while written < len(buf):
                written += os.pwrite(fd, buf[written:], start + written)
        except OSError as e:
            raise StagingError(f"{self.paths[shard]}: cannot write shard: {e}") from e
        return int(sizes.sum())

    def _fill(
        self, buf: memoryview, first: int, stop: int, data_at: list[int], sizes: list[int]
    ) -> tuple[int, StagingError] | None:
        """Read every sample file of a piece into its slot, one ``readv`` each.

        Returns:
            None, or the first failure as ``(row in piece, error)``.
        """
        plan = self.plan
        view = memoryview(buf)
        r = fd = -1
        got = n = mtime = stamp = 0
        regular = True
        try:
            if not self.local:
                for r in range(stop - first):
                    n, at = sizes[r], data_at[r]
                    data = self.src.fs.cat_file(plan[first + r][0].path)
                    got = len(data)
                    if got != n:
                        break
                    buf[at : at + n] = data
            else:
                folders = self.folder_of[first:stop]
                if len(self.dir_fds) > _MAX_DIR_FDS:
                    self.close()
                dir_fds = {k: self._dir_fd(k) for k in set(folders)}
                open_, readv, fstat, close = os.open, os.readv, os.fstat, os.close
                # a file swapped for a FIFO or a link after listing neither blocks nor
                # leads out of the folder (listed links were resolved to their targets)
                flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
                # one byte more than listed is asked for: a file that grew is caught here
                slots = [view[at : at + n + 1] for at, n in zip(data_at, sizes, strict=True)]
                for r, (name, k, slot, n, stamp) in enumerate(  # noqa: B007 - r names a failure
                    zip(
                        self.base[first:stop],
                        folders,
                        slots,
                        sizes,
                        self.stamps[first:stop],
                        strict=True,
                    )
                ):
                    fd = open_(name, flags, dir_fd=dir_fds[k])
                    got = readv(fd, [slot])
                    while 0 < got < n:
                        more = readv(fd, [slot[got:]])
                        if not more:
                            break
                        got += more
                    # as tar does: the bytes read are the listed version of the file
                    st = fstat(fd)
                    close(fd)
                    fd = -1
                    mtime, regular = change_stamp(st), S_ISREG(st.st_mode)
                    if not regular or got != n or mtime != stamp:
                        break
                slots.clear()
        except OSError as e:
            if fd >= 0:
                os.close(fd)
            path = plan[first + r][0].path
            return r, StagingError(f"{path}: cannot read source file: {_read_error(e)}")
        finally:
            view.release()
        if not regular:
            path = plan[first + r][0].path
            return r, StagingError(f"{path}: not a regular file any more (changed after listing)")
        if got != n:
            path = plan[first + r][0].path
            grew = "+" if got > n else ""
            return r, StagingError(
                f"{path}: source changed while being staged (size {n} -> {got}{grew})"
            )
        if self.local and mtime != stamp:
            path = plan[first + r][0].path
            return r, StagingError(
                f"{path}: source changed while being staged (mtime {stamp} -> {mtime})"
            )
        return None

    def _image_sizes(self, arr: Any, first: int, data_at: Any, sizes: Any) -> None:
        """Width and height from the PNG header bytes already in the buffer, else Pillow."""
        import numpy as np

        count = len(sizes)
        if not count:
            return
        index = np.minimum(data_at[:, None] + np.arange(24), len(arr) - 1)
        head = arr[index]
        png = (
            (sizes >= 24)
            & (head[:, :8] == np.frombuffer(_PNG_MAGIC, np.uint8)).all(axis=1)
            & (head[:, 12:16] == np.frombuffer(b"IHDR", np.uint8)).all(axis=1)
        )
        dims = np.ascontiguousarray(head[:, 16:24]).view(">u4").astype(np.int64)
        self.widths[first : first + count] = dims[:, 0]
        self.heights[first : first + count] = dims[:, 1]
        for r in (~png).nonzero()[0].tolist():
            at, n = int(data_at[r]), int(sizes[r])
            where = self.plan[first + r][0].path
            size = image_size(bytes(arr[at : at + n]), where)
            self.widths[first + r], self.heights[first + r] = size


def _run_pieces(
    writer: _PieceWriter,
    pieces: list[tuple[int, int, int, int, int]],
    workers: int,
    advance: Advance,
) -> None:
    """Write every piece, ``workers`` processes taking every ``workers``-th piece.

    Each process stops at its first failure; the error reported is the one of the
    earliest failing piece, so a bad source gives the same message whatever the worker
    count. Image sizes land in the writer's shared arrays; children report the bytes they
    consumed when done.
    """
    workers = max(1, min(workers, len(pieces)))
    failed = shared_array(workers, "int64")
    failed[:] = len(pieces)

    def part(k: int) -> tuple[int, int, int, StagingError | None]:
        consumed = files = 0
        for j in range(k, len(pieces), workers):
            if j > failed.min():
                break
            try:
                n = writer.write(pieces[j])
            except StagingError as e:
                failed[k] = j
                return j, consumed, files, e
            if k == 0:
                advance(n, pieces[j][2] - pieces[j][1])
            else:
                consumed += n
                files += pieces[j][2] - pieces[j][1]
        return len(pieces), consumed, files, None

    outcomes = run_forked(workers, part)
    for _j, consumed, files, _e in outcomes[1:]:
        advance(consumed, files)
    first_failed = min(outcomes, key=itemgetter(0))
    if first_failed[3] is not None:
        raise first_failed[3]


def stage_files(
    src: Source,
    out_dir: Path,
    *,
    shard_target_mb: int,
    advance: Advance,
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
    with gc_paused():
        return _stage_files(src, out_dir, shard_target_mb, advance, workers)


def _piece_size(total: int, workers: int) -> int:
    """Bytes per piece: about four pieces per worker, 64 KB to 8 MB."""
    return max(64 << 10, min(_PIECE_MAX, total // (4 * workers) + 1))


def _workers(src: Source, files: int, total: int, workers: int | None) -> int:
    if workers is not None:
        return workers
    if src.native is not None:
        # threads: cheap enough from a thousand files on
        return usable_cpus() if files >= _NATIVE_PARALLEL_MIN_FILES else 1
    small = total < _PARALLEL_MIN_BYTES and files < _PARALLEL_MIN_FILES
    return 1 if small or not src.is_local else usable_cpus()


_INDEX_SCHEMA_FIELDS = (
    ("key", "string"),
    ("label", "int64"),
    ("shard", "string"),
    ("bytes", "int64"),
    ("width", "int64"),
    ("height", "int64"),
)


def _stage_files(
    src: Source,
    out_dir: Path,
    shard_target_mb: int,
    advance: Advance,
    workers: int | None,
) -> tuple[list[ShardInfo], Any, dict[str, Any]]:
    import numpy as np
    import pyarrow as pa

    native = _native_plan(src) if src.native is not None else None
    if native is not None:
        sizes = src.native.sizes
        data_hdr = cls_hdr = np.full(len(sizes), _BLOCK, np.int64)
        classes = native.classes
    else:
        plan, classes = plan_samples(src)
        if not plan:
            raise StagingError(f"{src.url}: source is empty (no sample files)")
        sizes = np.array([p[0].size for p in plan], np.int64)
        data_hdr, cls_hdr = _header_lengths(plan, sizes)
    total = int(sizes.sum())
    workers = _workers(src, len(sizes), total, workers)
    layout = _layout(sizes, data_hdr, cls_hdr, shard_target_mb << 20, _piece_size(total, workers))
    paths = [out_dir / name for name in layout.names]
    fds: list[int] = []
    try:
        for path in paths:
            try:
                fds.append(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
            except OSError as e:
                raise StagingError(f"{path}: cannot write shard: {e}") from e
        if native is not None:
            widths, heights = _pack_native(src, native, layout, fds, paths, workers, advance)
            listing = src.native
            check_image_sizes(widths, heights, lambda i: under(src.root, listing.rel(i)))
            keys = pa.StringArray.from_buffers(
                len(sizes), pa.py_buffer(src.native.key_off), pa.py_buffer(src.native.keys)
            )
            labels = native.labels
        else:
            writer = _PieceWriter(src, plan, sizes, layout, fds, paths)
            try:
                _run_pieces(writer, layout.pieces, workers, advance)
            finally:
                writer.close()
            widths, heights = writer.widths, writer.heights
            keys, labels = [p[1] for p in plan], [p[3] for p in plan]
            check_image_sizes(widths, heights, lambda i: plan[i][0].path)
        shards = []
        for name, size, rows, path, fd in zip(
            layout.names, layout.sizes, layout.rows, paths, fds, strict=True
        ):
            if native is None and hasattr(os, "posix_fadvise"):
                # start writeback now (dirty pages stay cached), so the fsync before
                # publishing has little left to wait for (the C packer starts it per piece)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            shards.append(ShardInfo(name, size, rows, hash_file(path)))
    finally:
        for fd in fds:
            os.close(fd)
    schema = pa.schema([(name, pa.type_for_alias(t)) for name, t in _INDEX_SCHEMA_FIELDS])
    table = pa.table(
        [
            keys,
            labels,
            pa.DictionaryArray.from_arrays(layout.shard_of, layout.names).cast(pa.string()),
            sizes,
            widths,
            heights,
        ],
        schema=schema,
    )
    index_path = out_dir / "index.parquet"
    try:
        import pyarrow.parquet as pq

        pq.write_table(table, index_path, compression="zstd", row_group_size=1 << 20)
    except OSError as e:
        raise StagingError(f"{index_path}: cannot write the index: {e}") from e
    shards.append(
        ShardInfo(
            "index.parquet", index_path.stat().st_size, len(sizes), hash_file(index_path), "index"
        )
    )
    extra: dict[str, Any] = {"classes": classes} if classes else {}
    return shards, schema, extra


@dataclass
class _NativePlan:
    """Labels of a natively listed source: per folder, per sample, and the class names."""

    by_folder: Any
    labels: Any
    classes: list[str] | None


def _native_plan(src: Source) -> _NativePlan:
    """Labels as :func:`plan_samples` gives them, from the class folders' names."""
    import numpy as np

    listing = src.native
    assert listing is not None
    used = np.unique(listing.file_dir).tolist()
    names = sorted(listing.folders[k] for k in used)
    classes: list[str] | None = None
    if all(n.isdigit() for n in names):
        index = {n: label_value(n, f"{under(src.root, n)}: class folder") for n in names}
    else:
        classes = names
        index = {n: i for i, n in enumerate(names)}
    by_folder = np.array([index.get(name, -1) for name in listing.folders], np.int64)
    return _NativePlan(by_folder, by_folder[listing.file_dir], classes)


# what _native.pack reports for the earliest failed piece (0: none failed)
_READ_ERROR, _SIZE_CHANGED, _MTIME_CHANGED, _WRITE_ERROR, _NOT_REGULAR = 1, 2, 3, 4, 5


def _pack_native(
    src: Source,
    plan: _NativePlan,
    layout: _Layout,
    fds: list[int],
    paths: list[Path],
    workers: int,
    advance: Advance,
) -> tuple[Any, Any]:
    """Fill every piece with the C packer, ``workers`` threads; returns widths, heights.

    Pieces go in batches so progress moves; a failure stops at its batch. Images that
    are not PNGs get their sizes from Pillow afterwards, and the first error in key order
    (a read or change found by the packer, or an unreadable image before it) is raised.
    """
    import numpy as np

    from trainyard.staging.sources import _native

    listing = src.native
    assert listing is not None and _native is not None
    n = len(listing.sizes)
    widths = np.empty(n, np.int64)
    heights = np.empty(n, np.int64)
    pieces = np.array(layout.pieces, np.int64).reshape(-1, 5)
    fd_array = np.array(fds, np.int64)
    lengths = pieces[:, 4] - pieces[:, 3]
    threads = max(1, min(workers, len(pieces)))
    # one slot per thread, as long as the longest piece (+1 byte: a file that grew)
    buffers = np.empty(threads * (int(lengths.max()) + 1), np.uint8)
    # a batch per ~64 MB (progress moves between batches), at least 8 pieces per thread
    batch = max(8 * threads, (64 << 20) // max(1, int(lengths.max())))
    outcome: tuple[int, int, int, int, int, int] = (0, -1, 0, 0, 0, 0)
    for p0 in range(0, len(pieces), batch):
        p1 = min(p0 + batch, len(pieces))
        outcome = _native.pack(
            src.root,
            listing.folders,
            plan.by_folder,
            listing.names,
            listing.name_off,
            listing.stem_len,
            listing.file_dir,
            listing.sizes,
            listing.mtimes,
            listing.keys,
            listing.key_off,
            pieces,
            p0,
            p1,
            fd_array,
            widths,
            heights,
            buffers,
            workers,
            True,
        )
        if outcome[0]:
            break
        first, last = int(pieces[p0, 1]), int(pieces[p1 - 1, 2])
        advance(int(listing.sizes[first:last].sum()), last - first)
    kind, failed, err, got, mtime, shard = outcome
    checked = n if not kind else failed
    # pieces before the failed one are in the shards; the failed piece's files are not
    written_before = n
    if kind:
        written_before = int(pieces[np.searchsorted(pieces[:, 2], failed, "right"), 1])
    for i in np.flatnonzero(widths[:checked] < 0).tolist():
        path = under(src.root, listing.rel(i))
        size = int(listing.sizes[i])
        if i < written_before:
            k = int(layout.shard_of[i])
            data = os.pread(fds[k], size, int(layout.start[i]) + _BLOCK)
        else:
            with open(path, "rb") as fh:
                data = fh.read()
        widths[i], heights[i] = image_size(data, path)
    if not kind:
        return widths, heights
    if kind == _WRITE_ERROR:
        error = OSError(err, os.strerror(err))
        raise StagingError(f"{paths[shard]}: cannot write shard: {error}")
    rel = listing.rel(failed)
    path = under(src.root, rel)
    size = int(listing.sizes[failed])
    if kind == _READ_ERROR:
        error = OSError(err, os.strerror(err), rel.rpartition("/")[2])
        raise StagingError(f"{path}: cannot read source file: {_read_error(error)}")
    if kind == _NOT_REGULAR:
        raise StagingError(f"{path}: not a regular file any more (changed after listing)")
    if kind == _SIZE_CHANGED:
        grew = "+" if got > size else ""
        raise StagingError(
            f"{path}: source changed while being staged (size {size} -> {got}{grew})"
        )
    assert kind == _MTIME_CHANGED, kind
    stamp = int(listing.mtimes[failed])
    raise StagingError(f"{path}: source changed while being staged (mtime {stamp} -> {mtime})")
