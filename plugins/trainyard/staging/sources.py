"""Raw sources through fsspec: resolve, list, fingerprint, and the contract's schema.

A source is a file or a folder behind an fsspec URL (a local path or NFS mount,
``file://``, or an object store whose fsspec package is installed). Its fingerprint (size
and change stamp of every file: :func:`change_stamp`) is taken before staging and compared
after, so a source that changes while it is read is refused instead of being staged
half-old. Readers that compare each file with its listing as they read it (the
small-files stager does, as ``tar`` does) leave only the folders' modification times to
check afterwards.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from pathlib import Path
from stat import S_ISREG
from typing import Any, NamedTuple

from trainyard import native
from trainyard.connections import Connection, storage_options
from trainyard.errors import SourceMissing, StagingError
from trainyard.fsutil import redact_url
from trainyard.settings import get_settings
from trainyard.staging.forks import gc_paused, run_forked, shared_array, usable_cpus

_native = native.load("trainyard.staging._native")  # None: the Python path stages alone

TABLE_EXTENSIONS: dict[str, tuple[str, ...]] = {
    "csv": (".csv",),
    "parquet": (".parquet", ".parq"),
    "jsonl": (".jsonl", ".json", ".ndjson"),
}
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff")


@dataclass(frozen=True)
class ContractColumn:
    """One column of the contract: name, type name and nullability."""

    name: str
    type: str
    nullable: bool = True


@dataclass(frozen=True)
class ContractInfo:
    """The part of a data contract staging needs.

    Attributes:
        path: The contract file.
        version: Contract version (recorded in the manifest and the snapshot id).
        columns: Declared columns, in order.
        extension: ``source.extension`` (image folders: which files are samples).
        allow_extra_columns: Whether a table source may hold columns the contract does
            not declare (they are dropped); otherwise such a column is refused.
        null_values: The cells read as null in every column (``source.null_values``).
    """

    path: Path
    version: str
    columns: tuple[ContractColumn, ...]
    extension: str | None
    allow_extra_columns: bool = False
    null_values: tuple[str, ...] = ("",)

    @property
    def staging_terms(self) -> str:
        """Everything of the contract staging reads, as one string.

        Its version, columns, extension, extras rule and null markers: a source listed the
        same under the same terms needs no reading, and an edit of these without a new
        version (a column's type) still counts as a change.
        """
        cols = ";".join(f"{c.name}:{c.type}:{c.nullable}" for c in self.columns)
        nulls = "\x1f".join(self.null_values)
        return f"{self.version}\0{cols}\0{self.extension}\0{self.allow_extra_columns}\0{nulls}"


def read_contract(dataset: str) -> ContractInfo:
    """The part of ``<contracts_dir>/<dataset>.yaml`` staging needs, checked in full.

    Args:
        dataset: The dataset name.

    Returns:
        The contract's path, version, columns and source extension.

    Raises:
        ContractError: If the contract is missing or invalid (names file, line and field).
    """
    from trainyard.contracts import load_contract

    contract = load_contract(dataset)
    ext = contract.source.extension
    return ContractInfo(
        path=contract.path or get_settings().contracts_dir / f"{dataset}.yaml",
        version=contract.version,
        columns=tuple(ContractColumn(c.name, c.type, c.nullable) for c in contract.columns),
        extension=ext.lstrip(".") if ext else None,
        allow_extra_columns=contract.allow_extra_columns,
        null_values=contract.source.null_values,
    )


def arrow_type(type_name: str) -> Any:
    """The Arrow type of a contract type name (``string``, ``int64``, ``timestamp`` ...).

    Raises:
        StagingError: If the type name is unknown.
    """
    import pyarrow as pa

    types = {
        "string": pa.string(),
        "str": pa.string(),
        "int64": pa.int64(),
        "int32": pa.int32(),
        "int": pa.int64(),
        "integer": pa.int64(),
        "float64": pa.float64(),
        "float32": pa.float32(),
        "float": pa.float64(),
        "double": pa.float64(),
        "bool": pa.bool_(),
        "boolean": pa.bool_(),
        "timestamp": pa.timestamp("us"),
        "datetime": pa.timestamp("us"),
        "date": pa.date32(),
        "binary": pa.binary(),
    }
    try:
        return types[type_name.lower()]
    except KeyError as e:
        raise StagingError(
            f"contract type {type_name!r} is not supported (known: {', '.join(sorted(types))})"
        ) from e


def contract_schema(contract: ContractInfo) -> Any:
    """The Arrow schema a table snapshot is cast to."""
    import pyarrow as pa

    if not contract.columns:
        raise StagingError(f"{contract.path}: contract declares no columns")
    return pa.schema(
        [pa.field(c.name, arrow_type(c.type), nullable=c.nullable) for c in contract.columns]
    )


class SourceFile(NamedTuple):
    """One file of a source: its fsspec path, path relative to the source root, size, stamp.

    ``stamp`` is the change stamp (ns, :func:`change_stamp`) on a local file system, else the
    store's own version or time string.
    """

    path: str
    rel: str
    size: int
    stamp: int | str


@dataclass(frozen=True)
class NativeListing:
    """A folder of class folders as listed by the C scanner (``_native.scan``).

    Per file, in sample key order (``<folder>/<stem>``): its folder's index in ``folders``,
    its name (NUL-terminated in ``names`` at ``name_off``), the length of its stem, size,
    change stamp (ns) and key (in ``keys`` at ``key_off``: Arrow's string layout).
    No Python object per file exists until :attr:`Source.files` is asked for.
    """

    folders: list[str]
    file_dir: Any
    names: bytes
    name_off: Any
    stem_len: Any
    sizes: Any
    mtimes: Any
    keys: bytes
    key_off: Any

    def rel(self, i: int) -> str:
        """Path of file ``i`` relative to the source root (``<folder>/<name>``)."""
        at, end = int(self.name_off[i]), int(self.name_off[i + 1]) - 1
        name = self.names[at:end].decode("utf-8", "surrogateescape")
        return f"{self.folders[int(self.file_dir[i])]}/{name}"

    def source_files(self, root: str) -> tuple[SourceFile, ...]:
        """The same files as :class:`SourceFile` entries, sorted by relative path."""
        names = self.names.decode("utf-8", "surrogateescape").split("\0")[:-1]
        folder_of = self.file_dir.tolist()
        rels = [f"{self.folders[k]}/{n}" for k, n in zip(folder_of, names, strict=True)]
        paths = [under(root, r) for r in rels]
        out = list(map(SourceFile, paths, rels, self.sizes.tolist(), self.mtimes.tolist()))
        out.sort(key=itemgetter(1))
        return tuple(out)


def under(root: str, rel: str) -> str:
    """``rel`` joined to a local source root, as the listings spell paths."""
    return (root if root.endswith("/") else root + "/") + rel


@dataclass(frozen=True)
class Source:
    """A resolved source: file system, root, and the files to stage (sorted).

    ``folders`` (local sources): every folder listed, with its modification time taken
    just before it was listed; a file created, removed or renamed in it changes that time.
    ``native``: set when the C scanner listed the source (a local folder of class folders
    of plainly named files); then ``listed`` is empty and :attr:`files` is built on demand.
    """

    url: str
    format: str
    fs: Any
    root: str
    listed: tuple[SourceFile, ...]
    extensions: tuple[str, ...] | None
    folders: tuple[tuple[str, int], ...] = ()
    native: NativeListing | None = None

    @cached_property
    def files(self) -> tuple[SourceFile, ...]:
        """The files to stage, sorted by path relative to the root."""
        if self.native is not None:
            return self.native.source_files(self.root)
        return self.listed

    @property
    def is_local(self) -> bool:
        """True when the files are on a local (or mounted) file system."""
        return _is_local(self.fs)

    @property
    def count(self) -> int:
        """Number of files."""
        return len(self.native.sizes) if self.native is not None else len(self.listed)

    @property
    def total_bytes(self) -> int:
        """Sum of the file sizes."""
        if self.native is not None:
            return int(self.native.sizes.sum())
        return sum(f.size for f in self.listed)

    def describe(self) -> dict[str, Any]:
        """The ``source`` entry of the manifest (credentials in the URL masked)."""
        return {
            "url": redact_url(self.url),
            "format": self.format,
            "files": self.count,
            "bytes": self.total_bytes,
        }

    def fingerprint(self, contract_terms: str) -> str:
        """A digest of the listing: every file's relative path, size and modification stamp.

        Staging the same listing under the same contract terms gives the same snapshot, so
        an interval whose fingerprint did not change need not be read again; any
        rewritten, added or removed file (or a contract that stages otherwise) changes it.

        Args:
            contract_terms: What of the contract the data is staged by
                (:attr:`ContractInfo.staging_terms`).

        Returns:
            32 hex digits.
        """
        import hashlib

        h = hashlib.blake2b(digest_size=16)
        h.update(f"{self.format}\0{contract_terms}\0".encode())
        if self.native is not None:
            h.update(self.native.names)
            h.update(self.native.file_dir.tobytes())
            h.update(self.native.sizes.tobytes())
            h.update(self.native.mtimes.tobytes())
        else:
            for f in self.listed:
                h.update(f"{f.rel}\0{f.size}\0{f.stamp}\n".encode("utf-8", "surrogateescape"))
        return h.hexdigest()

    def check_unchanged(self, files_verified: bool = False) -> None:
        """Check that the source still holds the files it was listed with, unchanged.

        Args:
            files_verified: The reader already compared each file's size and modification
                time with the listing as it read it (as ``tar`` does); then, on a local
                file system, only the folders are checked for files that appeared or
                vanished, and the full re-listing runs only to name what changed.

        Raises:
            StagingError: Naming the first file that changed, vanished or appeared.
        """
        if files_verified and self.folders:
            moved = [f for f, stamp in self.folders if _folder_stamp(f) != stamp]
            if not moved:
                return
            self._compare_listing()
            raise StagingError(f"{moved[0]}: files changed while the source was being staged")
        self._compare_listing()

    def _compare_listing(self) -> None:
        again, _ = _list_files(self.fs, self.root, self.format, self.extensions)
        before = {f.rel: f for f in self.files}
        after = {f.rel: f for f in again}
        for rel, f in before.items():
            now = after.get(rel)
            if now is None:
                raise StagingError(f"{f.path}: source file vanished while being staged")
            if (now.size, now.stamp) != (f.size, f.stamp):
                raise StagingError(
                    f"{f.path}: source changed while being staged "
                    f"(size {f.size} -> {now.size}, mtime {f.stamp} -> {now.stamp})"
                )
        extra = sorted(set(after) - set(before))
        if extra:
            raise StagingError(
                f"{self.fs.unstrip_protocol(self.root)}: file {extra[0]!r} appeared while "
                "the source was being staged"
            )


def _folder_stamp(folder: str) -> int:
    try:
        return os.stat(folder).st_mtime_ns
    except OSError:
        return -1


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def change_stamp(st: os.stat_result) -> int:
    """A local file's change stamp (ns): the later of its modification and change times.

    A rewrite that keeps the size and sets the modification time back (``cp -p``,
    ``rsync -t``, ``touch -r``) still moves the status-change time, which no user can set:
    a corrected file is read again, never taken for the listed one.
    """
    return max(st.st_mtime_ns, st.st_ctime_ns)


def _stamp(info: dict[str, Any]) -> str:
    if info.get("mtime") is not None and info.get("created") is not None:
        # a local file as fsspec lists it: its change stamp (change_stamp), in seconds
        return str(max(info["mtime"], info["created"]))
    for key in ("mtime", "LastModified", "last_modified", "updated", "ETag", "etag", "created"):
        if info.get(key) is not None:
            return str(info[key])
    return ""


def _check_rel(rel: str, where: str) -> None:
    parts = rel.replace("\\", "/").split("/")
    if rel.startswith("/") or any(p in ("..", "") for p in parts):
        raise StagingError(f"{where}: file name {rel!r} tries to leave the source folder")


# below this many files one process stats them faster than forking a second one
_PARALLEL_STAT_MIN = 16384


def _walk_local(
    root: str, extensions: tuple[str, ...] | None
) -> tuple[list[SourceFile], list[tuple[str, int]]]:
    """List a local folder: names with ``os.scandir``, then one ``stat`` per file.

    The stats run in forked processes for large folders (see :mod:`.forks`).

    Returns:
        The files sorted by relative path, and every folder listed with its modification
        time, taken before it was read.
    """
    real_root = os.path.realpath(root)
    folders: list[tuple[str, int]] = []
    names: list[str] = []
    rels: list[str] = []
    folder_of: list[int] = []
    # files that are symbolic links are read at their target (checked to be inside the
    # source), so every file can then be opened without following links
    targets: dict[int, str] = {}
    visited = {real_root}
    stack = [(root, "")]
    while stack:
        folder, prefix = stack.pop()
        k = len(folders)
        folders.append((folder, _folder_stamp(folder)))
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError as e:
            raise StagingError(f"{folder}: cannot list source folder: {e.strerror}") from None
        for entry in entries:
            name = entry.name
            if name[0] == ".":
                continue
            link = entry.is_symlink()
            if link:
                real = os.path.realpath(entry.path)
                if os.path.commonpath([real, real_root]) != real_root:
                    raise StagingError(
                        f"{entry.path}: symbolic link points outside the source folder ({real})"
                    )
            try:
                is_dir = entry.is_dir()
            except OSError:
                raise StagingError(f"{entry.path}: {_not_regular(entry.path)}") from None
            if is_dir:
                real = os.path.realpath(entry.path)
                if real in visited:
                    raise StagingError(
                        f"{entry.path}: symbolic link loop: leads to {real}, a folder "
                        "already listed"
                    )
                visited.add(real)
                stack.append((entry.path, f"{prefix}{name}/"))
                continue
            if extensions is not None and not name.lower().endswith(extensions):
                continue
            try:
                is_file = entry.is_file()
            except OSError:
                is_file = False
            if not is_file:
                raise StagingError(f"{entry.path}: {_not_regular(entry.path)}")
            if link:
                targets[len(names)] = real
            names.append(name)
            rels.append(prefix + name)
            folder_of.append(k)
    heads = [f if f.endswith("/") else f + "/" for f, _ in folders]
    paths = [heads[k] + name for k, name in zip(folder_of, names, strict=True)]
    sizes, mtimes = _stat_all([f for f, _ in folders], folder_of, names, paths)
    for i, real in targets.items():
        paths[i] = real
    out = list(map(SourceFile, paths, rels, sizes, mtimes))
    out.sort(key=itemgetter(1))
    return out, folders


def _not_regular(path: str) -> str:
    """Why ``path`` cannot be staged as a sample or table file (it is not a regular file)."""
    import errno
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "symbolic link loop"
        return f"cannot read source file: {e.strerror}"
    kinds = (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder"),
    )
    kind = next((text for test, text in kinds if test(mode)), "of an unknown kind")
    return f"not a regular file ({kind}); only regular files are staged"


def _stat_all(
    folders: list[str], folder_of: list[int], names: list[str], paths: list[str]
) -> tuple[list[int], list[int]]:
    """Size and change stamp (ns) of every file, relative to its open folder."""
    n = len(names)
    workers = usable_cpus() if n >= _PARALLEL_STAT_MIN else 1
    sizes = shared_array(n, "int64")
    mtimes = shared_array(n, "int64")

    def part(k: int) -> None:
        lo, hi = n * k // workers, n * (k + 1) // workers
        # files come folder by folder: one folder open at a time (a source may hold more
        # folders than the process may open files)
        current, fd = -1, -1
        stat = os.stat
        i = lo
        try:
            for i in range(lo, hi):
                f = folder_of[i]
                if f != current:
                    if fd >= 0:
                        os.close(fd)
                        fd = -1
                    fd = os.open(folders[f], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                    current = f
                st = stat(names[i], dir_fd=fd)
                if not S_ISREG(st.st_mode):
                    raise StagingError(f"{paths[i]}: {_not_regular(paths[i])}")
                sizes[i] = st.st_size
                mtimes[i] = change_stamp(st)
        except OSError as e:
            raise StagingError(f"{paths[i]}: cannot read source file: {e.strerror}") from None
        finally:
            if fd >= 0:
                os.close(fd)

    run_forked(workers, part)
    return sizes.tolist(), mtimes.tolist()


def _list_files(
    fs: Any, root: str, fmt: str, extensions: tuple[str, ...] | None
) -> tuple[tuple[SourceFile, ...], tuple[tuple[str, int], ...]]:
    """The files under ``root`` (sorted), and the folders listed (local sources only)."""
    if _is_local(fs) and os.path.isdir(root):
        files, folders = _walk_local(root, extensions)
        return tuple(files), tuple(folders)
    if fs.isdir(root):
        found = fs.find(root, detail=True, withdirs=False)
        real_root = os.path.realpath(root) if _is_local(fs) else None
        out = []
        for path, info in found.items():
            rel = path[len(root) + 1 :] if path.startswith(root + "/") else path
            name = posixpath.basename(rel)
            if name.startswith(".") or any(p.startswith(".") for p in rel.split("/")[:-1]):
                continue
            if extensions is not None and not name.lower().endswith(extensions):
                continue
            _check_rel(rel, fs.unstrip_protocol(root))
            if real_root is not None:
                real = os.path.realpath(path)
                if os.path.commonpath([real, real_root]) != real_root:
                    raise StagingError(
                        f"{path}: symbolic link points outside the source folder ({real})"
                    )
            out.append(SourceFile(path, rel, int(info.get("size") or 0), _stamp(info)))
        return tuple(sorted(out, key=itemgetter(1))), ()
    if _is_local(fs) and not os.path.isfile(root):
        raise StagingError(f"{root}: {_not_regular(root)}")
    info = fs.info(root)
    size = int(info.get("size") or 0)
    return (SourceFile(root, posixpath.basename(root), size, _stamp(info)),), ()


def _scan_native(root: str, extensions: tuple[str, ...] | None) -> tuple[Any, Any] | None:
    """List a local image folder with the C scanner, when it is built and applies.

    Returns:
        The listing and the folders with their modification times, or None: the module
        is not built, or the folder is not plain class folders of plainly named files
        (labels file, nested folders, symbolic links, names that need rewriting), which
        the Python listing handles.
    """
    import numpy as np

    if _native is None or extensions is None:
        return None
    got = _native.scan(root, extensions, usable_cpus())
    if isinstance(got, str):
        return None
    names, stamps, file_dir, blob, name_off, stem_len, sizes, mtimes, keys, key_off = got
    stamp_list = np.frombuffer(stamps, np.int64).tolist()
    folders = (
        (root, stamp_list[0]),
        *((under(root, name), stamp) for name, stamp in zip(names, stamp_list[1:], strict=True)),
    )
    listing = NativeListing(
        folders=names,
        file_dir=np.frombuffer(file_dir, np.int32),
        names=blob,
        name_off=np.frombuffer(name_off, np.int64),
        stem_len=np.frombuffer(stem_len, np.int32),
        sizes=np.frombuffer(sizes, np.int64),
        mtimes=np.frombuffer(mtimes, np.int64),
        keys=keys,
        key_off=np.frombuffer(key_off, np.int32),
    )
    return listing, folders


def _why_not_there(fs: Any, root: str) -> None:
    """Raise the store's own error when a source "does not exist" because it was refused.

    ``exists`` answers False for a refusal too (401, 403): asked for its metadata, and for
    one byte over HTTP (whose ``info`` reads a refusal as absence), the store says which.
    """
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    try:
        if "http" in protocols:
            fs.cat_file(root, start=0, end=1)
        else:
            fs.info(root)
    except FileNotFoundError:
        return


def open_source(
    url: str, fmt: str, extension: str | None = None, conn: Connection | None = None
) -> Source:
    """Resolve a source URL and list the files to stage.

    Args:
        url: A path or fsspec URL: one file, or a folder (files are found recursively).
        fmt: ``csv``, ``parquet``, ``jsonl`` or ``image_folder``.
        extension: For image folders, the sample file extension from the contract.
        conn: The Airflow connection holding the store's credentials (``source.conn_id``).

    Returns:
        The source, files sorted by relative path.

    Raises:
        StagingError: If the source is missing, holds no matching files, or all are empty.
    """
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(url, **storage_options(url, conn))
    except (ImportError, ValueError) as e:
        raise StagingError(f"{redact_url(url)}: cannot open source ({e})") from None
    root = root.rstrip("/") or "/"
    if not fs.exists(root):
        _why_not_there(fs, root)
        raise SourceMissing(f"{redact_url(url)}: source does not exist")
    if fmt == "image_folder":
        extensions: tuple[str, ...] | None = (
            (f".{extension.lower()}",) if extension else IMAGE_EXTENSIONS
        )
        if not fs.isdir(root):
            raise StagingError(f"{redact_url(url)}: an image_folder source must be a folder")
    else:
        extensions = TABLE_EXTENSIONS[fmt]
    native = None
    if fmt == "image_folder" and _is_local(fs):
        native = _scan_native(root, extensions)
    if native is not None and len(native[0].sizes):
        return Source(url, fmt, fs, root, (), extensions, native[1], native[0])
    with gc_paused():
        files, folders = _list_files(fs, root, fmt, extensions)
    if not files:
        raise StagingError(
            f"{redact_url(url)}: source is empty (no {'/'.join(extensions or ())} files)"
        )
    if fmt != "image_folder" and all(f.size == 0 for f in files):
        raise StagingError(f"{files[0].path}: source is empty (0 bytes)")
    return Source(url, fmt, fs, root, files, extensions, folders)
