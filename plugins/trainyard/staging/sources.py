"""Raw sources through fsspec: resolve, list, fingerprint, and the contract's schema.

A source is a file or a folder behind an fsspec URL (a local path or NFS mount,
``file://``, or an object store whose fsspec package is installed). Its fingerprint (size
and modification time of every file) is taken before staging and compared after, so a
source that changes while it is read is refused instead of being staged half-old.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard.errors import StagingError
from trainyard.settings import get_settings

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
    """

    path: Path
    version: str
    columns: tuple[ContractColumn, ...]
    extension: str | None


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


@dataclass(frozen=True)
class SourceFile:
    """One file of a source: its fsspec path, path relative to the source root, size."""

    path: str
    rel: str
    size: int
    stamp: str


@dataclass(frozen=True)
class Source:
    """A resolved source: file system, root, and the files to stage (sorted)."""

    url: str
    format: str
    fs: Any
    root: str
    files: tuple[SourceFile, ...]
    extensions: tuple[str, ...] | None

    @property
    def is_local(self) -> bool:
        """True when the files are on a local (or mounted) file system."""
        return _is_local(self.fs)

    @property
    def total_bytes(self) -> int:
        """Sum of the file sizes."""
        return sum(f.size for f in self.files)

    def describe(self) -> dict[str, Any]:
        """The ``source`` entry of the manifest."""
        return {
            "url": self.url,
            "format": self.format,
            "files": len(self.files),
            "bytes": self.total_bytes,
        }

    def check_unchanged(self) -> None:
        """Compare every file's size and mtime with the listing taken before staging.

        Raises:
            StagingError: Naming the first file that changed, vanished or appeared.
        """
        again = _list_files(self.fs, self.root, self.format, self.extensions)
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


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def _stamp(info: dict[str, Any]) -> str:
    for key in ("mtime", "LastModified", "last_modified", "updated", "ETag", "etag", "created"):
        if info.get(key) is not None:
            return str(info[key])
    return ""


def _check_rel(rel: str, where: str) -> None:
    parts = rel.replace("\\", "/").split("/")
    if rel.startswith("/") or any(p in ("..", "") for p in parts):
        raise StagingError(f"{where}: file name {rel!r} tries to leave the source folder")


def _walk_local(root: str, extensions: tuple[str, ...] | None) -> list[SourceFile]:
    """List a local folder with ``os.scandir`` (one stat per file, no per-file realpath)."""
    real_root = os.path.realpath(root)
    out: list[SourceFile] = []
    stack = [(root, "")]
    while stack:
        folder, prefix = stack.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith("."):
                    continue
                rel = f"{prefix}{name}"
                if entry.is_symlink():
                    real = os.path.realpath(entry.path)
                    if os.path.commonpath([real, real_root]) != real_root:
                        raise StagingError(
                            f"{entry.path}: symbolic link points outside the source folder ({real})"
                        )
                if entry.is_dir():
                    stack.append((entry.path, f"{rel}/"))
                    continue
                if extensions is not None and not name.lower().endswith(extensions):
                    continue
                st = entry.stat()
                out.append(SourceFile(entry.path, rel, st.st_size, str(st.st_mtime_ns)))
    out.sort(key=lambda f: f.rel)
    return out


def _list_files(
    fs: Any, root: str, fmt: str, extensions: tuple[str, ...] | None
) -> tuple[SourceFile, ...]:
    if _is_local(fs) and os.path.isdir(root):
        return tuple(_walk_local(root, extensions))
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
        return tuple(sorted(out, key=lambda f: f.rel))
    info = fs.info(root)
    return (SourceFile(root, posixpath.basename(root), int(info.get("size") or 0), _stamp(info)),)


def open_source(url: str, fmt: str, extension: str | None = None) -> Source:
    """Resolve a source URL and list the files to stage.

    Args:
        url: A path or fsspec URL: one file, or a folder (files are found recursively).
        fmt: ``csv``, ``parquet``, ``jsonl`` or ``image_folder``.
        extension: For image folders, the sample file extension from the contract.

    Returns:
        The source, files sorted by relative path.

    Raises:
        StagingError: If the source is missing, holds no matching files, or all are empty.
    """
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        raise StagingError(f"{url}: cannot open source ({e})") from e
    root = root.rstrip("/") or "/"
    if not fs.exists(root):
        raise StagingError(f"{url}: source does not exist")
    if fmt == "image_folder":
        extensions: tuple[str, ...] | None = (
            (f".{extension.lower()}",) if extension else IMAGE_EXTENSIONS
        )
        if not fs.isdir(root):
            raise StagingError(f"{url}: an image_folder source must be a folder")
    else:
        extensions = TABLE_EXTENSIONS[fmt]
    files = _list_files(fs, root, fmt, extensions)
    if not files:
        raise StagingError(f"{url}: source is empty (no {'/'.join(extensions or ())} files)")
    if fmt != "image_folder" and all(f.size == 0 for f in files):
        raise StagingError(f"{files[0].path}: source is empty (0 bytes)")
    return Source(url, fmt, fs, root, files, extensions)
