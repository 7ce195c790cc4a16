"""Examples of a snapshot as numpy arrays, and the shard index the tf.data reader uses.

Pure numpy / pyarrow / PIL: **no TensorFlow import** (evaluation and the serving smoke
test use :func:`load_examples`).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from trainyard.contracts import MISSING_CATEGORY, holdout_mask
from trainyard.errors import ContractError, SnapshotError
from trainyard.fsutil import read_parquet
from trainyard.volumes import data_shards, read_manifest

Split = Literal["train", "holdout", "all"]


def select(keys: Sequence[str], fraction: float, split: Split) -> np.ndarray:
    """Boolean row selector of a split."""
    if split == "all":
        return np.ones(len(keys), dtype=bool)
    mask = holdout_mask(keys, fraction)
    if split == "holdout":
        return mask
    if split == "train":
        return ~mask
    raise ValueError(f"split must be 'train', 'holdout' or 'all', got {split!r}")


@dataclass(frozen=True)
class FileIndex:
    """Where each sample of a files snapshot lives inside the tar shards.

    Attributes:
        keys: Sample keys.
        labels: int64 labels.
        shard: Index into ``shards`` per sample.
        offset: Byte offset of the image member's data in its shard.
        size: Byte size of the image member.
        shards: Shard paths.
    """

    keys: list[str]
    labels: np.ndarray
    shard: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    shards: list[Path]

    @classmethod
    def concat(cls, parts: Sequence[FileIndex]) -> FileIndex:
        """Several snapshots' indexes as one (shard numbers shifted, order kept)."""
        if len(parts) == 1:
            return parts[0]
        shift = np.cumsum([0, *(len(p.shards) for p in parts[:-1])])
        return cls(
            keys=[k for p in parts for k in p.keys],
            labels=np.concatenate([p.labels for p in parts]).astype(np.int64),
            shard=np.concatenate([p.shard + s for p, s in zip(parts, shift, strict=True)]).astype(
                np.int64
            ),
            offset=np.concatenate([p.offset for p in parts]).astype(np.int64),
            size=np.concatenate([p.size for p in parts]).astype(np.int64),
            shards=[path for p in parts for path in p.shards],
        )

    def take(self, mask: np.ndarray) -> FileIndex:
        """The rows where ``mask`` is True, order kept."""
        idx = np.flatnonzero(mask)
        return FileIndex(
            keys=[self.keys[i] for i in idx],
            labels=self.labels[idx],
            shard=self.shard[idx],
            offset=self.offset[idx],
            size=self.size[idx],
            shards=self.shards,
        )


def _scan_tar(
    path: Path, image_ext: str | None
) -> tuple[dict[str, tuple[int, int]], dict[str, int]]:
    images: dict[str, tuple[int, int]] = {}
    labels: dict[str, int] = {}
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                key, dot, ext = member.name.rpartition(".")
                if not dot:
                    raise SnapshotError(f"{path}: member {member.name!r} has no extension")
                if ext == "cls":
                    fh = tar.extractfile(member)
                    text = fh.read().decode("ascii", "replace").strip() if fh else ""
                    try:
                        labels[key] = int(text)
                    except ValueError as e:
                        raise SnapshotError(
                            f"{path}: member {member.name!r}: label {text!r} is not an integer"
                        ) from e
                elif image_ext is None or ext == image_ext:
                    images[key] = (member.offset_data, member.size)
    except tarfile.TarError as e:
        raise SnapshotError(f"{path}: corrupt tar shard: {e}") from e
    return images, labels


def file_index(snapshot_dir: Path, contract: Any) -> FileIndex:
    """Scan the tar headers of a files snapshot (no image bytes read) and join the index.

    Args:
        snapshot_dir: The snapshot directory.
        contract: Its contract.

    Returns:
        One row per sample of ``index.parquet``, in index order.

    Raises:
        SnapshotError: Missing index or shard, a key of the index missing from its shard,
            or a label that disagrees with the shard's ``.cls`` member (names key and shard).
    """
    snapshot_dir = Path(snapshot_dir)
    shards = data_shards(snapshot_dir, "files")
    index_path = snapshot_dir / "index.parquet"
    try:
        table = read_parquet(index_path, [contract.roles.key, contract.roles.label, "shard"])
    except FileNotFoundError as e:
        raise SnapshotError(f"{index_path}: index not found") from e
    except (pa.ArrowInvalid, KeyError) as e:
        raise SnapshotError(f"{index_path}: unreadable index: {e}") from e
    keys = table.column(contract.roles.key).to_pylist()
    labels = np.asarray(
        table.column(contract.roles.label).to_numpy(zero_copy_only=False), dtype=np.int64
    )
    shard_names = table.column("shard").to_pylist()
    by_name = {p.name: i for i, p in enumerate(shards)}
    by_name.update({str(p.relative_to(snapshot_dir)): i for i, p in enumerate(shards)})
    ext = getattr(contract.source, "extension", None) if getattr(contract, "source", None) else None
    scans = [_scan_tar(p, ext) for p in shards]
    n = len(keys)
    shard_idx = np.empty(n, dtype=np.int64)
    offset = np.empty(n, dtype=np.int64)
    size = np.empty(n, dtype=np.int64)
    for row, (key, label, sname) in enumerate(zip(keys, labels, shard_names, strict=True)):
        if sname not in by_name:
            raise SnapshotError(
                f"{index_path}: row {row} (key {key!r}): shard {sname!r} is not in the manifest"
            )
        s = by_name[sname]
        images, cls = scans[s]
        if key not in images:
            raise SnapshotError(f"{shards[s]}: image of key {key!r} (index row {row}) is missing")
        if key in cls and cls[key] != label:
            raise SnapshotError(
                f"{shards[s]}: key {key!r}: .cls says {cls[key]} but index row {row} column "
                f"{contract.roles.label} says {label}"
            )
        shard_idx[row] = s
        offset[row], size[row] = images[key]
    return FileIndex(
        keys=keys, labels=labels, shard=shard_idx, offset=offset, size=size, shards=shards
    )


@dataclass(frozen=True)
class Examples:
    """Examples of one split.

    Attributes:
        features: Feature name → array, raw as the exported model takes it (images:
            float32 (n, H, W, C) in [0, 1]; numeric features: float32 (n,), NaN where
            missing; string categoricals: text (n,) objects, ``""`` where missing;
            integer-coded categoricals: int64 (n,)).
        labels: Labels (n,): int64 class ids, or float32 targets of a regressor.
        keys: Sample keys.
    """

    features: dict[str, np.ndarray]
    labels: np.ndarray
    keys: list[str]

    def __len__(self) -> int:
        return len(self.keys)


def _decode_image(data: bytes, contract: Any, where: str) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    img = contract.image
    try:
        with Image.open(io.BytesIO(data)) as im:
            mode = {1: "L", 3: "RGB", 4: "RGBA"}.get(img.channels)
            if mode is None:
                raise SnapshotError(f"{where}: unsupported image.channels {img.channels}")
            arr = np.asarray(im.convert(mode), dtype=np.float32)
    except (UnidentifiedImageError, OSError) as e:
        raise SnapshotError(f"{where}: not a decodable image: {e}") from e
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.shape != (img.height, img.width, img.channels):
        raise SnapshotError(
            f"{where}: image is {arr.shape}, contract says {(img.height, img.width, img.channels)}"
        )
    return arr / 255.0


def label_dtype(contract: Any) -> type[np.generic]:
    """The labels' dtype: float32 targets for a regressor, int64 class ids otherwise."""
    return np.float32 if contract.is_regression else np.int64


def feature_array(column: Any, feature: Any, where: str) -> np.ndarray:
    """One table feature's Arrow column as the exported model's raw input.

    Numbers become float32 with NaN for null; strings an object array of text with
    ``""`` (the missing category) for null; integer codes int64.

    Args:
        column: A pyarrow (chunked) array.
        feature: Its :class:`trainyard.contracts.Feature`.
        where: What is read (named in errors).

    Raises:
        SnapshotError: A null where the feature cannot be missing, or a value that does
            not fit the model's input.
    """
    import pyarrow.compute as pc

    if column.null_count and not feature.nullable:
        raise SnapshotError(
            f"{where}: column {feature.name} has {column.null_count} null values and the "
            "contract says it holds none"
        )
    try:
        if feature.dtype == "string":
            if column.null_count:
                column = pc.fill_null(column, MISSING_CATEGORY)
            return np.asarray(column.to_numpy(zero_copy_only=False), dtype=object)
        if feature.dtype == "int64":
            return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)
        if pa.types.is_boolean(column.type):
            column = pc.cast(column, pa.float32())
        return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float32)
    except (ValueError, TypeError, pa.ArrowInvalid) as e:
        raise SnapshotError(f"{where}: column {feature.name} does not fit the model: {e}") from e


def _table_columns(snapshot_dir: Path, contract: Any) -> dict[str, np.ndarray | list[str]]:
    roles = contract.roles
    names = [roles.key, roles.label, *roles.features]
    cols: dict[str, list[Any]] = {n: [] for n in names}
    for path in data_shards(snapshot_dir, "table"):
        try:
            table = read_parquet(path, names)
        except (pa.ArrowInvalid, KeyError) as e:
            raise SnapshotError(f"{path}: cannot read columns {names}: {e}") from e
        for n in names:
            cols[n].append(table.column(n))
    out: dict[str, np.ndarray | list[str]] = {}
    for n in names:
        chunked = pa.chunked_array([c for arr in cols[n] for c in arr.chunks], type=cols[n][0].type)
        if n == roles.key:
            out[n] = [str(k) for k in chunked.to_pylist()]
            continue
        if n != roles.label:
            out[n] = feature_array(chunked, contract.feature(n), str(snapshot_dir))
            continue
        if chunked.null_count:
            raise SnapshotError(f"{snapshot_dir}: column {n} has {chunked.null_count} null values")
        try:
            out[n] = np.asarray(chunked.to_numpy(zero_copy_only=False), dtype=label_dtype(contract))
        except (ValueError, TypeError) as e:
            raise SnapshotError(f"{snapshot_dir}: column {n} is not numeric: {e}") from e
    return out


def load_window_examples(snapshot_dirs: Sequence[Path], contract: Any, split: Split) -> Examples:
    """One split of several snapshots (a training window), concatenated in the given order.

    Each snapshot is split by its own stable key hash (:func:`load_examples`), so a row
    is in the holdout whichever window it is read in.

    Raises:
        SnapshotError: As :func:`load_examples`, or if no snapshot is given.
    """
    if not snapshot_dirs:
        raise SnapshotError("a training window needs at least one snapshot")
    parts = [load_examples(Path(d), contract, split) for d in snapshot_dirs]
    if len(parts) == 1:
        return parts[0]
    return Examples(
        features={
            name: np.concatenate([p.features[name] for p in parts]) for name in parts[0].features
        },
        labels=np.concatenate([p.labels for p in parts]),
        keys=[k for p in parts for k in p.keys],
    )


def load_examples(snapshot_dir: Path, contract: Any, split: Split) -> Examples:
    """Load one split of a snapshot into memory.

    Args:
        snapshot_dir: A files or table snapshot directory.
        contract: Its contract (``trainyard.contracts.Contract``).
        split: ``train`` (``~holdout_mask``), ``holdout`` or ``all``.

    Returns:
        The examples, in snapshot order.

    Raises:
        SnapshotError: Missing/corrupt shard, undecodable image (names shard and key), a
            null where the contract allows none, or a feature value that does not fit the
            model (names the column).
    """
    snapshot_dir = Path(snapshot_dir)
    kind = read_manifest(snapshot_dir).kind
    fraction = contract.split.holdout_fraction if contract.split else 0.0
    if kind == "files":
        if contract.image is None:
            raise ContractError(
                f"{snapshot_dir}: files snapshot but the contract has no image section"
            )
        index = file_index(snapshot_dir, contract)
        index = index.take(select(index.keys, fraction, split))
        images = np.empty(
            (len(index.keys), contract.image.height, contract.image.width, contract.image.channels),
            np.float32,
        )
        for s, shard in enumerate(index.shards):
            rows = np.flatnonzero(index.shard == s)
            if not len(rows):
                continue
            with shard.open("rb") as fh:
                for r in rows:
                    fh.seek(int(index.offset[r]))
                    data = fh.read(int(index.size[r]))
                    images[r] = _decode_image(data, contract, f"{shard} key {index.keys[r]!r}")
        return Examples(
            features={contract.image.column: images}, labels=index.labels, keys=index.keys
        )
    cols = _table_columns(snapshot_dir, contract)
    keys = cols[contract.roles.key]
    assert isinstance(keys, list)
    sel = select(keys, fraction, split)
    return Examples(
        features={f: np.asarray(cols[f])[sel] for f in contract.roles.features},
        labels=np.asarray(cols[contract.roles.label])[sel],
        keys=[k for k, m in zip(keys, sel, strict=True) if m],
    )
