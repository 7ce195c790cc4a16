"""Preprocessing statistics of the training split, and the layers that carry them.

The contract types every table feature (:class:`trainyard.contracts.Feature`); training
computes what the preprocessing needs over the training window's training split only
(never the holdout): means, variances, medians, min/max, vocabularies learned by
frequency. :func:`compute_statistics` is pure numpy and returns a JSON-ready document,
which the chief writes next to the model (``transform.json``) and ``register`` records in
the version's ``metadata.json``. :func:`encode_features` builds the statistics into the
model as Keras preprocessing layers (``Normalization``, ``Discretization``,
``StringLookup``, ``IntegerLookup``, ``Rescaling``) plus two small layers for missing
values, so the exported SavedModel takes raw values: strings for categorical features,
NaN for a missing number, ``""`` for a missing category (in-model, every null marker of
the contract is a missing category too). Training, evaluation, the deploy smoke test,
serving and stream scoring all feed raw rows through the same signature; no other code
preprocesses.

Every op the layers use is a stock TensorFlow op (hash tables, ``Bucketize``, ``IsNan``,
``SelectV2``): TF Serving loads the SavedModel as it is. A vocabulary is held by its
lookup layer's hash table, restored with the SavedModel (``LookupTableExportV2`` reads it
back out).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from trainyard.contracts import MISSING_CATEGORY
from trainyard.errors import TrainingError

if TYPE_CHECKING:
    from trainyard.contracts import Contract, Feature

TRANSFORM_FILE = "transform.json"
"""The statistics a model was built with, next to it (and in its ``metadata.json``)."""
TRANSFORM_VERSION = 1
_VAR_FLOOR = 1e-12
_FREQUENCIES_KEPT = 50


def _numeric_statistics(feature: Feature, values: np.ndarray) -> dict[str, Any]:
    values = np.asarray(values, dtype=np.float64)
    missing = np.isnan(values)
    present = values[~missing]
    if present.size == 0:
        raise TrainingError(
            f"feature {feature.name!r}: every value of the training split is missing: "
            "nothing to learn its statistics from"
        )
    stats: dict[str, Any] = {
        "kind": "numeric",
        "count": int(present.size),
        "missing": int(missing.sum()),
        "mean": float(present.mean()),
        "variance": float(present.var()),
        "median": float(np.median(present)),
        "min": float(present.min()),
        "max": float(present.max()),
        "normalize": "none" if feature.bucketize is not None else feature.normalize,
        "bucketize": list(feature.bucketize) if feature.bucketize is not None else None,
        "impute": feature.impute,
        "fill": None,
        "missing_indicator": feature.missing_indicator,
    }
    if feature.impute is not None:
        rule = feature.impute
        stats["fill"] = (
            stats["mean"]
            if rule == "mean"
            else stats["median"]
            if rule == "median"
            else 0.0
            if rule == "zero"
            else float(rule)
        )
    return stats


def _categorical_statistics(feature: Feature, values: np.ndarray) -> dict[str, Any]:
    textual = feature.dtype == "string"
    if textual:
        arr = np.asarray(values, dtype=object)
        missing = arr == MISSING_CATEGORY
        tokens, counts = np.unique(arr[~missing].astype(str), return_counts=True)
        tokens_list: list[Any] = tokens.tolist()
    else:
        arr = np.asarray(values, dtype=np.int64)
        missing = np.zeros(arr.shape, dtype=bool)
        ints, counts = np.unique(arr, return_counts=True)
        tokens_list = [int(v) for v in ints]
    counted = dict(zip(tokens_list, (int(c) for c in counts), strict=True))
    present = int((~missing).sum())
    if feature.vocabulary is not None:
        vocabulary = list(feature.vocabulary)
        source = "declared"
    else:
        ranked = sorted(
            ((count, token) for token, count in counted.items() if count >= feature.min_frequency),
            key=lambda ct: (-ct[0], ct[1]),
        )
        vocabulary = [token for _, token in ranked[: feature.top_k]]
        source = "learned"
        if not vocabulary:
            raise TrainingError(
                f"feature {feature.name!r}: no value of the training split occurs "
                f"min_frequency ({feature.min_frequency}) times: the learned vocabulary is "
                "empty"
            )
    kept = set(vocabulary)
    in_vocabulary = sum(c for t, c in counted.items() if t in kept)
    top = sorted(counted.items(), key=lambda tc: (-tc[1], tc[0]))[:_FREQUENCIES_KEPT]
    return {
        "kind": "categorical",
        "dtype": feature.dtype,
        "vocabulary_source": source,
        "vocabulary": vocabulary,
        "missing_entry": feature.nullable and textual,
        "oov_buckets": feature.oov_buckets,
        "top_k": feature.top_k,
        "min_frequency": feature.min_frequency,
        "count": present,
        "missing": int(missing.sum()),
        "distinct": len(counted),
        "oov_share": (present - in_vocabulary) / present if present else 0.0,
        "frequencies": [[t, c] for t, c in top],
    }


def compute_statistics(
    contract: Contract,
    features: Mapping[str, np.ndarray],
    snapshots: Sequence[str] = (),
) -> dict[str, Any]:
    """The preprocessing statistics of a training split (pure numpy).

    Args:
        contract: The dataset's contract (its typed features).
        features: The training split's raw feature columns, as
            :func:`trainyard.training.worker.data.load_examples` gives them (float32 with
            NaN for a missing number, text with ``""`` for a missing category, int64).
        snapshots: The snapshot ids the split comes from (recorded).

    Returns:
        ``{"version", "split": "train", "rows", "snapshots", "null_values", "features":
        {name: stats}}``, JSON-ready; per feature either numeric statistics (``mean``,
        ``variance``, ``median``, ``min``, ``max``, ``fill``, ...) or a vocabulary
        (``vocabulary``, ``missing_entry``, ``oov_buckets``, ``frequencies``, ...).

    Raises:
        TrainingError: A feature whose every value is missing, or whose learned
            vocabulary would be empty (names the feature).
    """
    rows = len(next(iter(features.values()))) if features else 0
    out: dict[str, Any] = {}
    for name in contract.roles.features:
        if contract.image is not None and name == contract.image.column:
            continue
        feature = contract.feature(name)
        values = features[name]
        out[name] = (
            _categorical_statistics(feature, values)
            if feature.categorical
            else _numeric_statistics(feature, values)
        )
    return {
        "version": TRANSFORM_VERSION,
        "split": "train",
        "rows": int(rows),
        "snapshots": list(snapshots),
        "null_values": list(contract.source.null_values),
        "features": out,
    }


def lookup_vocabulary(stats: Mapping[str, Any]) -> list[Any]:
    """The entries of a categorical feature's lookup, in index order.

    The missing category (``""``) first when the feature may be missing, then the
    vocabulary. Index 0..n-1 of the lookup, after its out-of-vocabulary buckets.
    """
    entries = list(stats["vocabulary"])
    return [MISSING_CATEGORY, *entries] if stats.get("missing_entry") else entries


def encoded_width(stats: Mapping[str, Any]) -> int:
    """How many columns one feature adds to the model's encoded input."""
    if stats["kind"] == "categorical":
        return len(lookup_vocabulary(stats)) + int(stats["oov_buckets"])
    width = len(stats["bucketize"]) + 1 if stats.get("bucketize") else 1
    return width + int(bool(stats.get("missing_indicator")))


def encode_features(
    inputs: Mapping[str, tuple[str, tuple[int | None, ...]]], transform: Mapping[str, Any]
) -> tuple[list[Any], Any]:
    """Keras inputs taking raw values, and their preprocessed, concatenated encoding.

    Args:
        inputs: Feature name → (dtype, shape), as ``feature_spec`` (``(None,)`` each).
        transform: :func:`compute_statistics`' document.

    Returns:
        ``(inputs, encoded)``: one ``tf_keras.Input`` per feature (in ``inputs`` order)
        and a float32 tensor (batch, sum of :func:`encoded_width`).
    """
    import tf_keras as keras

    layers = keras.layers
    null_values = [v for v in transform.get("null_values", [""]) if v != MISSING_CATEGORY]
    tensors, columns = [], []
    for name, (dtype, shape) in inputs.items():
        if len(shape) != 1:
            raise TrainingError(f"table feature {name!r} must be one value per row, got {shape}")
        stats = transform["features"][name]
        inp = keras.Input(shape=(), name=name, dtype=dtype)
        tensors.append(inp)
        if stats["kind"] == "categorical":
            x = inp
            lookup_cls = layers.StringLookup if dtype == "string" else layers.IntegerLookup
            if dtype == "string" and null_values:
                x = null_markers(null_values, name=f"{name}_null_markers")(x)
            lookup = lookup_cls(
                vocabulary=lookup_vocabulary(stats),
                num_oov_indices=int(stats["oov_buckets"]),
                mask_token=None,
                output_mode="one_hot",
                name=f"{name}_lookup",
            )
            # one value per row as (batch, 1): a lookup's one-hot of a rank-1 batch of one
            # row would lose its batch dimension
            columns.append(lookup(layers.Reshape((1,), name=f"{name}_column")(x)))
            continue
        x = layers.Reshape((1,), name=f"{name}_column")(inp)
        indicator = None
        if stats.get("fill") is None:  # may not be missing: a NaN is the caller's error
            x = required(name, name=f"{name}_required")(x)
        else:
            if stats.get("missing_indicator"):
                indicator = missing_indicator(name=f"{name}_missing")(x)
            x = fill_missing(float(stats["fill"]), name=f"{name}_impute")(x)
        if stats.get("bucketize"):
            x = layers.Discretization(
                bin_boundaries=[float(e) for e in stats["bucketize"]],
                output_mode="one_hot",
                name=f"{name}_buckets",
            )(x)
        elif stats["normalize"] == "standard":
            x = layers.Normalization(
                mean=stats["mean"], variance=max(stats["variance"], _VAR_FLOOR), name=f"{name}_z"
            )(x)
        elif stats["normalize"] == "minmax":
            span = stats["max"] - stats["min"]
            scale = 1.0 / span if span > 0 and math.isfinite(span) else 1.0
            x = layers.Rescaling(scale=scale, offset=-stats["min"] * scale, name=f"{name}_01")(x)
        columns.append(x)
        if indicator is not None:
            columns.append(indicator)
    encoded = layers.Concatenate(name="encoded")(columns) if len(columns) > 1 else columns[0]
    return tensors, encoded


def _layer_classes() -> tuple[type, type, type, type]:
    """The missing-value layers, defined on first use (importing this module needs no TF)."""
    import tensorflow as tf
    import tf_keras as keras

    @keras.utils.register_keras_serializable(package="trainyard")
    class _FillMissing(keras.layers.Layer):  # type: ignore[misc,name-defined]
        """NaN → ``fill`` (the imputation the contract declares)."""

        def __init__(self, fill: float, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.fill = float(fill)

        def call(self, x: Any) -> Any:
            return tf.where(tf.math.is_nan(x), tf.constant(self.fill, x.dtype), x)

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "fill": self.fill}

    @keras.utils.register_keras_serializable(package="trainyard")
    class _MissingIndicator(keras.layers.Layer):  # type: ignore[misc,name-defined]
        """1.0 where the value is NaN (missing), else 0.0."""

        def call(self, x: Any) -> Any:
            return tf.cast(tf.math.is_nan(x), x.dtype)

    @keras.utils.register_keras_serializable(package="trainyard")
    class _NullMarkers(keras.layers.Layer):  # type: ignore[misc,name-defined]
        """A string equal to one of the contract's null markers → ``""`` (missing)."""

        def __init__(self, markers: Sequence[str], **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.markers = [str(m) for m in markers]

        def call(self, x: Any) -> Any:
            hit = tf.reduce_any(tf.equal(tf.expand_dims(x, -1), tf.constant(self.markers)), -1)
            return tf.where(hit, tf.constant(MISSING_CATEGORY), x)

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "markers": self.markers}

    @keras.utils.register_keras_serializable(package="trainyard")
    class _Required(keras.layers.Layer):  # type: ignore[misc,name-defined]
        """Refuses a NaN (a missing value) in a feature the contract lets never be missing.

        Without it a NaN went through ReLU as 0 and the model answered the same scores for
        every such row; now the call fails (TF Serving: 400 ``INVALID_ARGUMENT``), naming
        the feature.
        """

        def __init__(self, feature: str, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.feature = str(feature)

        def call(self, x: Any) -> Any:
            ok = tf.reduce_all(tf.logical_not(tf.math.is_nan(x)))
            why = f"{self.feature}: a missing value (null or NaN) where the contract allows none"
            with tf.control_dependencies([tf.debugging.Assert(ok, [why])]):
                return tf.identity(x)

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "feature": self.feature}

    return _FillMissing, _MissingIndicator, _NullMarkers, _Required


_CLASSES: tuple[type, type, type, type] | None = None


def _classes() -> tuple[type, type, type, type]:
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _layer_classes()
    return _CLASSES


def fill_missing(fill: float, **kwargs: Any) -> Any:
    """A layer replacing NaN by ``fill``."""
    return _classes()[0](fill, **kwargs)


def missing_indicator(**kwargs: Any) -> Any:
    """A layer giving 1.0 where its input is NaN, else 0.0."""
    return _classes()[1](**kwargs)


def null_markers(markers: Sequence[str], **kwargs: Any) -> Any:
    """A layer mapping each null marker string to ``""`` (the missing category)."""
    return _classes()[2](markers, **kwargs)


def required(feature: str, **kwargs: Any) -> Any:
    """A layer failing the call when its input holds a NaN, naming ``feature``."""
    return _classes()[3](feature, **kwargs)
