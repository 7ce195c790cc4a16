"""tf.data input pipelines over a snapshot's shards.

Files snapshots (tar shards): the tar headers are scanned once in Python
(:func:`trainyard.training.worker.data.file_index`); the dataset itself is pure TensorFlow ops —
each shard is read with one ``tf.io.read_file`` and its images are sliced out with
``tf.strings.substr`` at their offsets. The small encoded examples are shuffled and
batched, then each batch is decoded in one call (one tf.data function call per batch, not
per example); with a local cache, examples are decoded one by one and cached decoded. Pure
graph ops mean the same pipeline runs on remote parameter-server workers.

Resized JPEGs are decoded with libjpeg's DCT scaling where the image (or crop window) is at
least twice the target size. Training pipelines may ask for ``augment``: the ImageNet
ResNet-50 reference augmentation (TF official models, MLPerf): a random crop window (area
8-100 %, aspect ratio 3/4-4/3, ``sample_distorted_bounding_box``) of which only the window
is decoded (``decode_and_crop_jpeg``), resized to the target and randomly flipped.
Evaluation pipelines (no ``augment``) resize the whole image, deterministically.

Table snapshots (Parquet): Arrow record batches are read with pyarrow and handed to
tf.data a whole batch at a time (``from_generator``) under all-reduce; under
parameter-server training the split is materialised as tensors (workers cannot run the
coordinator's Python generators). Features stay raw, as the exported model takes them
(strings, NaN for a missing number): the preprocessing is inside the model
(:mod:`trainyard.training.worker.transform`), whose statistics :class:`SnapshotInput`
computes over the training split.

Per-worker sharding: with at least as many shards as input pipelines, whole shards go to
each pipeline; otherwise every pipeline keeps every n-th example.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import tensorflow as tf

from trainyard.errors import TrainingError
from trainyard.training.worker.data import (
    FileIndex,
    feature_array,
    file_index,
    label_dtype,
    load_window_examples,
    select,
)
from trainyard.training.worker.transform import compute_statistics
from trainyard.volumes import data_shards, read_manifest

AUTOTUNE = tf.data.AUTOTUNE


@dataclass(frozen=True)
class InputSpec:
    """What the training loop needs to know about a split.

    Attributes:
        kind: ``files`` or ``table``.
        num_examples: Examples in the split.
        outputs: Output units: the contract's class count, or 1 for a regressor.
        transform: Table features: the preprocessing statistics of the split
            (:func:`~trainyard.training.worker.transform.compute_statistics`), else None.
        target_stats: A regressor's label (mean, variance) over the split, else None.
    """

    kind: str
    num_examples: int
    outputs: int
    transform: dict[str, Any] | None = None
    target_stats: tuple[float, float] | None = None


class SnapshotInput:
    """Builds per-worker tf.data pipelines of one split of a snapshot or a training window.

    Args:
        snapshot_dir: The snapshot, or every snapshot of a training window (all of one
            kind; each split by its own stable key hash, then read as one).
        contract: Its contract.
        split: ``train``, ``holdout`` or ``all``.
        in_graph: Build only graph-serialisable datasets (parameter-server workers).
        cache: None, ``"memory"``, or a directory for ``Dataset.cache`` files (local disk).
        resize: Resize decoded images to the contract's height x width (sources whose
            images vary in size); otherwise a mismatching image is an error.
    """

    def __init__(
        self,
        snapshot_dir: Path | Sequence[Path],
        contract: Any,
        split: str = "train",
        in_graph: bool = False,
        cache: str | None = None,
        resize: bool = False,
    ) -> None:
        self.resize = resize
        dirs = [snapshot_dir] if isinstance(snapshot_dir, str | Path) else list(snapshot_dir)
        self.snapshot_dirs = [Path(d) for d in dirs]
        if not self.snapshot_dirs:
            raise TrainingError("no snapshot to read")
        self.snapshot_dir = self.snapshot_dirs[-1]
        self.contract = contract
        self.split = split
        self.in_graph = in_graph
        self.cache = cache
        kinds = {read_manifest(d).kind for d in self.snapshot_dirs}
        if len(kinds) != 1:
            raise TrainingError(
                f"the training window mixes snapshot kinds {sorted(kinds)}: "
                + ", ".join(str(d) for d in self.snapshot_dirs)
            )
        self.kind = kinds.pop()
        fraction = contract.split.holdout_fraction if contract.split else 0.0
        self._index: FileIndex | None = None
        self._table: dict[str, np.ndarray] | None = None
        self._files: list[Path] = []
        if self.kind == "files":
            index = FileIndex.concat([file_index(d, contract) for d in self.snapshot_dirs])
            self._index = index.take(select(index.keys, fraction, split))  # type: ignore[arg-type]
            labels = self._index.labels
            keys = self._index.keys
            transform = None
        else:
            ex = load_window_examples(self.snapshot_dirs, contract, split)  # type: ignore[arg-type]
            labels, keys = ex.labels, ex.keys
            # statistics of this split only: the training split never sees the holdout
            ids = [d.name for d in self.snapshot_dirs]
            transform = compute_statistics(contract, ex.features, ids) if len(keys) else None
            self._table = {**ex.features, "__label__": labels} if in_graph else None
            self._files = [f for d in self.snapshot_dirs for f in data_shards(d, "table")]
            self._keep = set(ex.keys) if split != "all" else None
        if contract.is_regression:
            target = (float(np.mean(labels)), float(np.var(labels))) if len(labels) else (0.0, 1.0)
            self.spec = InputSpec(self.kind, len(labels), 1, transform, target)
        else:
            n = contract.num_classes()
            _check_class_ids(labels, keys, n, contract.roles.label, self.snapshot_dirs)
            self.spec = InputSpec(self.kind, len(labels), n, transform)

    def epochs(
        self,
        batch_size: int,
        batches_per_epoch: int,
        num_pipelines: int = 1,
        pipeline_id: int = 0,
        seed: int = 0,
        first_epoch: int = 0,
    ) -> tf.data.Dataset:
        """A training pipeline's batches, epoch after epoch, each epoch shuffled anew.

        Each epoch is exactly ``batches_per_epoch`` batches of this pipeline's examples,
        shuffled again (shards and examples; a pipeline with fewer examples than an epoch
        needs reads them again, shuffled again): the order of epoch ``e`` follows from
        ``seed`` and ``e`` alone. A run resumed from a checkpoint at ``first_epoch`` skips
        the epochs before it (their encoded examples are read, not decoded, not trained
        on), so it gets the batches an uninterrupted run would have had.

        Args:
            batch_size: Per-pipeline batch size.
            batches_per_epoch: Batches per epoch (the training loop's steps per epoch).
            num_pipelines: Number of input pipelines (workers).
            pipeline_id: This pipeline's index.
            seed: The run's seed for this pipeline.
            first_epoch: The epoch training starts (or resumes) at.

        Returns:
            Batches of ``(features dict, labels)``, without end.
        """
        if self.kind == "files" and not self.cache:
            ds = self._files_dataset(
                num_pipelines,
                pipeline_id,
                True,
                seed,
                batch_size,
                epoch_batches=batches_per_epoch,
                skip_epochs=first_epoch,
            )
            return ds.with_options(self._options()).prefetch(AUTOTUNE)
        base = self._elements(num_pipelines, pipeline_id)
        per_pipeline = max(self.spec.num_examples // max(num_pipelines, 1), 1)
        ds = base.shuffle(min(per_pipeline, 10_000, self._shuffle_cap()), seed=seed)
        ds = _epoch_batches(ds, batch_size, batches_per_epoch, 1 if num_pipelines == 1 else 2)
        if first_epoch:
            ds = ds.skip(first_epoch * batches_per_epoch)
        return ds.with_options(self._options()).prefetch(AUTOTUNE)

    def _elements(self, num_pipelines: int, pipeline_id: int) -> tf.data.Dataset:
        """This pipeline's examples once, in order, decoded (and cached when asked)."""
        if self.kind == "files":
            ds = self._files_dataset(num_pipelines, pipeline_id, False, 0)
        elif self.in_graph:
            ds = self._tensor_dataset(num_pipelines, pipeline_id)
        else:
            ds = self._parquet_dataset(num_pipelines, pipeline_id)
        return self._cached(ds, num_pipelines, pipeline_id)

    def _cached(self, ds: tf.data.Dataset, num_pipelines: int, pipeline_id: int) -> tf.data.Dataset:
        """``ds`` cached in memory or in files, as the input asks (else ``ds``)."""
        if self.cache == "memory":
            return ds.cache()
        if self.cache:
            Path(self.cache).mkdir(parents=True, exist_ok=True)
            return ds.cache(
                str(Path(self.cache) / f"{self.split}-{pipeline_id}-of-{num_pipelines}")
            )
        return ds

    def dataset(
        self,
        batch_size: int,
        num_pipelines: int = 1,
        pipeline_id: int = 0,
        shuffle: bool = True,
        repeat: bool = True,
        seed: int = 0,
        drop_remainder: bool = True,
        augment: bool = False,
    ) -> tf.data.Dataset:
        """The batched dataset of one input pipeline.

        Args:
            batch_size: Per-pipeline batch size.
            num_pipelines: Number of input pipelines (workers).
            pipeline_id: This pipeline's index.
            shuffle: Shuffle shards and examples.
            repeat: Repeat forever (training with ``steps_per_epoch``).
            seed: Shuffle seed.
            drop_remainder: Drop the last partial batch (static shapes for distribution).
            augment: Training augmentation of images (needs ``resize``, no ``cache``): a
                random crop window, decoded alone for JPEGs, resized, randomly flipped.

        Returns:
            Batches of ``(features dict, labels)``: raw features, as the exported model
            takes them (float32, NaN where missing; strings; int64 codes).

        Raises:
            TrainingError: ``augment`` without ``resize``, with a cache, or on a table.
        """
        if augment and (self.kind != "files" or not self.resize or self.cache):
            raise TrainingError(
                f"{self.snapshot_dir}: augment needs a files snapshot read with resize=True "
                "and no cache (a cache would freeze one random crop per image)"
            )
        if self.kind == "files" and not self.cache:
            ds = self._files_dataset(
                num_pipelines,
                pipeline_id,
                shuffle,
                seed,
                batch_size,
                repeat,
                drop_remainder,
                augment,
            )
            return ds.with_options(self._options()).prefetch(AUTOTUNE)
        if self.kind == "files":
            ds = self._files_dataset(num_pipelines, pipeline_id, shuffle, seed)
            ds = self._cached(ds, num_pipelines, pipeline_id)
        else:
            ds = self._elements(num_pipelines, pipeline_id)
        if repeat:
            ds = ds.repeat()
        if shuffle:
            per_pipeline = max(self.spec.num_examples // max(num_pipelines, 1), 1)
            ds = ds.shuffle(min(per_pipeline, 10_000, self._shuffle_cap()), seed=seed)
        ds = ds.batch(batch_size, drop_remainder=drop_remainder, num_parallel_calls=AUTOTUNE)
        return ds.with_options(self._options()).prefetch(AUTOTUNE)

    @staticmethod
    def _options() -> tf.data.Options:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        # shuffled or not, the order is the seed's: never whichever thread finished first
        options.deterministic = True
        # Parallelism comes from parallel map calls; one op spreading over the intra-op
        # pool only adds hand-offs (as TF's ImageNet ResNet input pipeline sets it).
        options.threading.max_intra_op_parallelism = 1
        return options

    def _shuffle_cap(self) -> int:
        """Shuffle buffer size that keeps the decoded examples under ~256 MB."""
        if self.kind == "files" and self.contract.image is not None:
            img = self.contract.image
            example_bytes = img.height * img.width * img.channels * 4
        else:
            example_bytes = 8 * (len(self.contract.roles.features) + 1)
        return max(64, (256 << 20) // example_bytes)

    def _files_dataset(
        self,
        num_pipelines: int,
        pipeline_id: int,
        shuffle: bool,
        seed: int,
        batch_size: int | None = None,
        repeat: bool = False,
        drop_remainder: bool = True,
        augment: bool = False,
        epoch_batches: int | None = None,
        skip_epochs: int = 0,
    ) -> tf.data.Dataset:
        """The files pipeline; with ``epoch_batches``, epochs of that many (:meth:`epochs`)."""
        index = self._index
        assert index is not None and self.contract.image is not None
        img = self.contract.image
        image_name = img.column
        resize = self.resize
        ext = getattr(getattr(self.contract, "source", None), "extension", None) or ""
        jpeg = ext.lower() in ("jpg", "jpeg")
        groups = [np.flatnonzero(index.shard == s) for s in range(len(index.shards))]
        shard_ids = [s for s, rows in enumerate(groups) if len(rows)]
        element_stride = 1
        if len(shard_ids) >= num_pipelines:
            shard_ids = shard_ids[pipeline_id::num_pipelines]
        else:
            element_stride = num_pipelines
        paths = [str(index.shards[s]) for s in shard_ids]
        offsets = tf.ragged.constant(
            [index.offset[groups[s]].tolist() for s in shard_ids], dtype=tf.int64
        )
        sizes = tf.ragged.constant(
            [index.size[groups[s]].tolist() for s in shard_ids], dtype=tf.int64
        )
        labels = tf.ragged.constant(
            [index.labels[groups[s]].tolist() for s in shard_ids], dtype=tf.int64
        )
        shards = tf.data.Dataset.from_tensor_slices((paths, offsets, sizes, labels))
        if shuffle:
            shards = shards.shuffle(len(paths), seed=seed)

        def members(
            path: tf.Tensor, off: tf.Tensor, size: tf.Tensor, label: tf.Tensor
        ) -> tf.data.Dataset:
            content = tf.io.read_file(path)
            pieces = tf.strings.substr(content, off, size)
            return tf.data.Dataset.from_tensor_slices((pieces, label))

        ds = shards.interleave(
            members,
            cycle_length=min(max(len(paths), 1), 4),
            num_parallel_calls=AUTOTUNE,
            deterministic=True,  # the order is the seed's, not the threads'
        )
        if element_stride > 1:
            ds = ds.shard(element_stride, pipeline_id)

        def decode_one(data: tf.Tensor) -> tf.Tensor:
            if augment and jpeg:
                image = _decode_jpeg_random_crop(data, img.height, img.width, img.channels, seed)
            elif resize and jpeg:
                image = _decode_jpeg_at_least(data, img.height, img.width, img.channels)
            else:
                image = tf.io.decode_image(data, channels=img.channels, expand_animations=False)
                if augment:
                    image = _random_crop(image, tf.shape(image), seed)
            if augment:
                image = tf.image.random_flip_left_right(image, seed=seed)
            if resize:
                image = tf.image.resize(image, (img.height, img.width)) / 255.0
            else:
                image = tf.cast(image, tf.float32) / 255.0
            return tf.ensure_shape(image, (img.height, img.width, img.channels))

        if batch_size is None:  # decode each example (before a cache of decoded examples)
            return ds.map(
                lambda data, label: ({image_name: decode_one(data)}, label),
                num_parallel_calls=AUTOTUNE,
                deterministic=True,
            )
        # Shuffle and batch the small encoded examples, then decode a whole batch per
        # call: one tf.data function call per batch instead of one per example.
        if epoch_batches is not None:
            mine = sum(len(groups[s]) for s in shard_ids) // element_stride
            need = epoch_batches * batch_size
            ds = ds.shuffle(min(max(mine, 1), 10_000), seed=seed)
            ds = _epoch_batches(ds, batch_size, epoch_batches, -(-need // max(mine, 1)))
            if skip_epochs:  # before decoding: a resumed run reads them, decodes none
                ds = ds.skip(skip_epochs * epoch_batches)
        else:
            if repeat:
                ds = ds.repeat()
            if shuffle:
                ds = ds.shuffle(min(self.spec.num_examples, 10_000), seed=seed)
            ds = ds.batch(batch_size, drop_remainder=drop_remainder)
        out = tf.TensorSpec((img.height, img.width, img.channels), tf.float32)

        def decode_batch(
            data: tf.Tensor, label: tf.Tensor
        ) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
            images = tf.map_fn(decode_one, data, fn_output_signature=out, parallel_iterations=16)
            return {image_name: images}, label

        return ds.map(decode_batch, num_parallel_calls=AUTOTUNE, deterministic=True)

    def _tensor_dataset(self, num_pipelines: int, pipeline_id: int) -> tf.data.Dataset:
        assert self._table is not None
        feats = {f: self._table[f] for f in self.contract.roles.features}
        ds = tf.data.Dataset.from_tensor_slices((feats, self._table["__label__"]))
        return ds.shard(num_pipelines, pipeline_id) if num_pipelines > 1 else ds

    def _parquet_dataset(self, num_pipelines: int, pipeline_id: int) -> tf.data.Dataset:
        roles = self.contract.roles
        features = list(roles.features)
        typed = {f: self.contract.feature(f) for f in features}
        files = self._files
        stride = 1
        if len(files) >= num_pipelines:
            files = files[pipeline_id::num_pipelines]
        else:
            stride = num_pipelines
        keep = self._keep
        fraction = self.contract.split.holdout_fraction if self.contract.split else 0.0
        split = self.split

        def batches():  # whole Arrow record batches, never one example at a time
            seen = 0
            for path in files:
                pf = pq.ParquetFile(path)
                where = str(path)
                for rb in pf.iter_batches(
                    batch_size=8192, columns=[roles.key, roles.label, *features]
                ):
                    sel = np.ones(rb.num_rows, dtype=bool)
                    if keep is not None:
                        keys = rb.column(roles.key).to_pylist()
                        sel = select(keys, fraction, split)  # type: ignore[arg-type]
                    if stride > 1:
                        pos = np.arange(seen, seen + rb.num_rows)
                        sel &= pos % stride == pipeline_id
                    seen += rb.num_rows
                    x = {f: feature_array(rb.column(f), typed[f], where)[sel] for f in features}
                    y = rb.column(roles.label).to_numpy(zero_copy_only=False)
                    yield x, np.asarray(y, label_type)[sel]

        label_type = label_dtype(self.contract)
        signature = (
            {f: tf.TensorSpec((None,), tf.as_dtype(typed[f].dtype)) for f in features},
            tf.TensorSpec((None,), tf.as_dtype(label_type)),
        )
        return tf.data.Dataset.from_generator(batches, output_signature=signature).unbatch()


def _epoch_batches(
    shuffled: tf.data.Dataset, batch_size: int, batches: int, reads: int
) -> tf.data.Dataset:
    """Epochs of exactly ``batches`` batches, without end, each shuffled anew.

    ``shuffled`` (one pass, its shuffle reshuffling on every iteration) is read ``reads``
    times per epoch at most (a pipeline shorter than an epoch); every epoch starts a new
    pass, so the shuffles of epoch ``e`` are the ``e``-th draws of their seeds.
    """
    one = shuffled.repeat(max(reads, 1)) if reads > 1 else shuffled
    return one.batch(batch_size, drop_remainder=True).take(batches).repeat()


def _check_class_ids(
    labels: np.ndarray, keys: Sequence[str], n: int, column: str, dirs: Sequence[Path]
) -> None:
    """Every label must be a class id below the contract's class count.

    Raises:
        TrainingError: Naming the first bad row's key and value, and how many there are.
    """
    bad = np.flatnonzero((labels < 0) | (labels >= n))
    if bad.size:
        i = int(bad[0])
        raise TrainingError(
            f"{', '.join(map(str, dirs))}: key {keys[i]!r}: {column} {labels[i].item()!r} is not "
            f"a class id in [0, {n}) (the contract's class count; {bad.size} such rows)"
        )


def _decode_jpeg_at_least(data: tf.Tensor, height: int, width: int, channels: int) -> tf.Tensor:
    """Decode a JPEG with libjpeg's DCT scaling (1/2, 1/4, 1/8) while it stays >= the target.

    Decoding at a reduced scale skips most of the inverse DCT work, the bulk of a JPEG
    decode; the image is resized to the target size afterwards anyway.
    """
    shape = tf.image.extract_jpeg_shape(data)
    fit = tf.minimum(shape[0] // height, shape[1] // width)
    branch = tf.cast(fit >= 2, tf.int32) + tf.cast(fit >= 4, tf.int32) + tf.cast(fit >= 8, tf.int32)

    def at(ratio: int):  # type: ignore[no-untyped-def]
        return lambda: tf.io.decode_jpeg(
            data, channels=channels, ratio=ratio, dct_method="INTEGER_FAST"
        )

    return tf.switch_case(branch, [at(1), at(2), at(4), at(8)])


def _crop_window(shape: tf.Tensor, seed: int) -> tuple[tf.Tensor, tf.Tensor]:
    """A random crop window ``(y, x)``, ``(h, w)`` as the ImageNet ResNet-50 reference draws it.

    Area 8-100 % of the image, aspect ratio 3/4-4/3, at most 10 attempts, else the whole
    image (``tf.image.sample_distorted_bounding_box`` with no object boxes).
    """
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.zeros((1, 0, 4), tf.float32),
        seed=seed,
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return begin[:2], size[:2]


def _random_crop(image: tf.Tensor, shape: tf.Tensor, seed: int) -> tf.Tensor:
    """A random crop window (:func:`_crop_window`) of a decoded image."""
    begin, size = _crop_window(shape, seed)
    return tf.slice(image, tf.concat([begin, [0]], 0), tf.concat([size, [-1]], 0))


def _decode_jpeg_random_crop(
    data: tf.Tensor, height: int, width: int, channels: int, seed: int
) -> tf.Tensor:
    """Decode only a random crop window of a JPEG (:func:`_crop_window`).

    ``decode_and_crop_jpeg`` skips the inverse DCT and colour conversion outside the
    window; where the window is at least twice the target size it is decoded at a DCT
    scale (1/2, 1/4, 1/8; the window is then given in scaled pixels) as in
    :func:`_decode_jpeg_at_least`. The result is at least the target size unless the
    window itself is smaller.
    """
    (y, x), (h, w) = (tf.unstack(t) for t in _crop_window(tf.image.extract_jpeg_shape(data), seed))
    fit = tf.minimum(h // height, w // width)
    branch = tf.cast(fit >= 2, tf.int32) + tf.cast(fit >= 4, tf.int32) + tf.cast(fit >= 8, tf.int32)

    def at(ratio: int):  # type: ignore[no-untyped-def]
        window = tf.stack([y // ratio, x // ratio, h // ratio, w // ratio])
        return lambda: tf.io.decode_and_crop_jpeg(
            data, window, channels=channels, ratio=ratio, dct_method="INTEGER_FAST"
        )

    return tf.switch_case(branch, [at(1), at(2), at(4), at(8)])
