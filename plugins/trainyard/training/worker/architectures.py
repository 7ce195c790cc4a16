"""Model registry: a name → a function building an uncompiled ``tf_keras`` model.

Add a model with :func:`register`::

    @register("my_model", inputs="table")
    def my_model(spec: ModelSpec) -> tf_keras.Model: ...

Every model takes inputs named after ``feature_spec(contract)``, raw (a table model builds
its preprocessing in, from ``spec.transform``: :func:`table_inputs`), and outputs
``spec.outputs`` units: class logits of shape (None, classes) for a classifier (the loss
applies the softmax; so does the exported serving signature), or (None, 1) for a regressor,
to which :func:`build_model` appends the target's scale (so a builder's last layer learns a
standardised target and serves the real one).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainyard.errors import ConfigError

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


@dataclass(frozen=True)
class ModelSpec:
    """What a model builder needs to know.

    Attributes:
        inputs: Feature name → (dtype, shape incl. batch dim None), as ``feature_spec``.
        outputs: Output units: classes, or 1 for a regressor.
        seed: Initialiser seed.
        target_stats: A regressor's target (mean, variance); None for a classifier.
        transform: Table features: the training split's preprocessing statistics
            (``transform.compute_statistics``), built into the model; None: the raw
            numbers go in as they are.
    """

    inputs: dict[str, tuple[str, tuple[int | None, ...]]]
    outputs: int
    seed: int = 0
    target_stats: tuple[float, float] | None = None
    transform: dict[str, Any] | None = None


Builder = Callable[[ModelSpec], Any]
MODELS: dict[str, Builder] = {}
#: What each model reads: ``image`` (a contract's image feature) or ``table`` (numeric
#: columns); ``pipelines check`` refuses a model for a dataset of the other kind.
MODEL_INPUTS: dict[str, str] = {}


def register(name: str, inputs: str) -> Callable[[Builder], Builder]:
    """Decorator adding a builder to the registry under ``name``.

    Args:
        name: The registry name (``training.model``).
        inputs: ``image`` or ``table``.
    """

    def deco(fn: Builder) -> Builder:
        MODELS[name] = fn
        MODEL_INPUTS[name] = inputs
        return fn

    return deco


def build_model(name: str, spec: ModelSpec) -> Any:
    """Build a registered model.

    Args:
        name: Registry name (``small_cnn``, ``mlp``, ...).
        spec: Inputs and classes.

    Returns:
        An uncompiled ``tf_keras.Model``.

    Raises:
        ConfigError: Unknown model name (lists the known ones) or inputs it cannot take.
    """
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r} (known: {', '.join(sorted(MODELS))})")
    model = MODELS[name](spec)
    if spec.target_stats is None:
        return model
    import tf_keras as keras

    mean, var = spec.target_stats
    scaled = keras.layers.Rescaling(scale=max(var, 1e-12) ** 0.5, offset=mean, name="target")
    return keras.Model(model.inputs, scaled(model.outputs[0]), name=model.name)


@register("small_cnn", inputs="image")
def small_cnn(spec: ModelSpec) -> Any:
    """A small CNN for one image input of shape (None, H, W, C)."""
    import tf_keras as keras

    if len(spec.inputs) != 1:
        raise ConfigError(f"small_cnn takes one image input, got {sorted(spec.inputs)}")
    (name, (_dtype, shape)) = next(iter(spec.inputs.items()))
    if len(shape) != 4:
        raise ConfigError(f"small_cnn needs an image input (None, H, W, C), got {name} {shape}")
    init = keras.initializers.GlorotUniform
    x = inp = keras.Input(shape=shape[1:], name=name, dtype="float32")
    x = keras.layers.Conv2D(
        32, 3, padding="same", activation="relu", kernel_initializer=init(spec.seed)
    )(x)
    if min(shape[1], shape[2]) >= 4:
        x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Conv2D(
        64, 3, padding="same", activation="relu", kernel_initializer=init(spec.seed + 1)
    )(x)
    x = (
        keras.layers.GlobalAveragePooling2D()(x)
        if min(shape[1], shape[2]) > 16
        else keras.layers.Flatten()(x)
    )
    x = keras.layers.Dense(64, activation="relu", kernel_initializer=init(spec.seed + 2))(x)
    out = keras.layers.Dense(spec.outputs, kernel_initializer=init(spec.seed + 3))(x)
    return keras.Model(inp, out, name="small_cnn")


def table_inputs(spec: ModelSpec) -> tuple[list[Any], Any]:
    """A table model's raw inputs and their encoding, one row of float32 per example.

    With ``spec.transform`` the contract's preprocessing is built in (imputation,
    normalisation, buckets, vocabularies: ``transform.encode_features``); without it the
    numeric inputs are concatenated as they are.

    Raises:
        ConfigError: A feature that is not one value per row.
    """
    import tf_keras as keras

    for name, (_dtype, shape) in spec.inputs.items():
        if len(shape) != 1:
            raise ConfigError(
                f"a table model takes one value per feature (None,), got {name} {shape}"
            )
    if spec.transform is not None:
        from trainyard.training.worker.transform import encode_features

        return encode_features(spec.inputs, spec.transform)
    inputs = [keras.Input(shape=(), name=name, dtype="float32") for name in spec.inputs]
    columns = [keras.layers.Reshape((1,))(inp) for inp in inputs]
    return inputs, keras.layers.Concatenate()(columns) if len(columns) > 1 else columns[0]


@register("mlp", inputs="table")
def mlp(spec: ModelSpec) -> Any:
    """An MLP over table features: raw inputs, preprocessed in the model, concatenated."""
    import tf_keras as keras

    inputs, x = table_inputs(spec)
    init = keras.initializers.GlorotUniform
    x = keras.layers.Dense(64, activation="relu", kernel_initializer=init(spec.seed))(x)
    x = keras.layers.Dense(32, activation="relu", kernel_initializer=init(spec.seed + 1))(x)
    out = keras.layers.Dense(spec.outputs, kernel_initializer=init(spec.seed + 2))(x)
    return keras.Model(inputs, out, name="mlp")
