"""Tiny real SavedModels and a server-in-a-thread for the serving tests.

The image model is a linear softmax classifier over the flattened 8x8x1 image with fixed
weights, so tests can compute the expected classes in numpy; ``bias_class`` adds a large
bias to one class so every input predicts it (lets a load generator see which version
answered).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np

IMAGE_SPEC = {"image": ("float32", (None, 8, 8, 1))}
TABLE_SPEC = {"a": ("float32", (None,)), "b": ("float32", (None,))}


def image_weights(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(64, 10)).astype(np.float32), rng.normal(size=10).astype(np.float32)


def expected_classes(images: np.ndarray, seed: int, bias_class: int | None = None) -> np.ndarray:
    w, b = image_weights(seed)
    if bias_class is not None:
        b = b.copy()
        b[bias_class] += 1000.0
    return np.argmax(images.reshape(len(images), 64) @ w + b, axis=1)


def build_image_model(
    path: Path,
    seed: int = 0,
    bias_class: int | None = None,
    input_name: str = "image",
    side: int = 8,
) -> Path:
    """Save a linear classifier with TF Serving's signature (import TF lazily)."""
    import tensorflow as tf

    w, b = image_weights(seed)
    if bias_class is not None:
        b = b.copy()
        b[bias_class] += 1000.0
    if side != 8:
        w = np.resize(w, (side * side, 10))

    class Model(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(w)
            self.b = tf.Variable(b)

        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            logits = tf.reshape(x, [-1, side * side]) @ self.w + self.b
            probs = tf.nn.softmax(logits)
            return {"probabilities": probs, "class_id": tf.argmax(probs, axis=1)}

    m = Model()
    m.sig = tf.function(
        m.serve, input_signature=[tf.TensorSpec([None, side, side, 1], tf.float32, name=input_name)]
    )
    tf.saved_model.save(m, str(path), signatures={"serving_default": m.sig})
    return path


def build_table_model(path: Path, mirror: bool = False) -> Path:
    """Save a model with two scalar float32 inputs ``a`` and ``b`` (class = a > b).

    ``mirror`` swaps the classes (class = a < b).
    """
    import tensorflow as tf

    sign = -1.0 if mirror else 1.0

    class Model(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None], tf.float32, name="a"),
                tf.TensorSpec([None], tf.float32, name="b"),
            ]
        )
        def serve(self, a: tf.Tensor, b: tf.Tensor) -> dict[str, tf.Tensor]:
            logits = sign * tf.stack([b - a, a - b], axis=1)
            probs = tf.nn.softmax(logits)
            return {"probabilities": probs, "class_id": tf.argmax(probs, axis=1)}

    m = Model()
    tf.saved_model.save(m, str(path), signatures={"serving_default": m.serve})
    return path


def build_text_model(path: Path, default: bool = True) -> Path:
    """Save a model with string inputs and several signatures (TF 2 ``tf.Module``).

    * ``serving_default``: ``text`` (string, ``[None]``) → ``length`` (characters, int32),
      ``upper`` (text) and ``upper_bytes`` (the same, a ``*_bytes`` name: b64 in JSON).
    * ``byte_size``: ``image_bytes`` (string) → ``size`` (bytes, int32).
    * ``totals``: ``x`` (float32 ``[None, 2]``) → ``row_sum`` (batched) and ``total``
      (a scalar: an output without a batch dimension).

    ``default=False`` saves the first signature as ``text`` instead: a model without
    ``serving_default``, whose requests must name a signature.
    """
    import tensorflow as tf

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def text(self, text: tf.Tensor) -> dict[str, tf.Tensor]:
            upper = tf.strings.upper(text)
            return {
                "length": tf.strings.length(text, unit="UTF8_CHAR"),
                "upper": upper,
                "upper_bytes": upper,
            }

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
        def byte_size(self, image_bytes: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"size": tf.strings.length(image_bytes)}

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def totals(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"row_sum": tf.reduce_sum(x, axis=1), "total": tf.reduce_sum(x)}

    m = Model()
    tf.saved_model.save(
        m,
        str(path),
        signatures={
            "serving_default" if default else "text": m.text,
            "byte_size": m.byte_size,
            "totals": m.totals,
        },
    )
    return path


def build_example_model(path: Path) -> Path:
    """Save a ``tf.Example`` model with classify and regress signatures (TF 1 builder).

    Examples hold ``x`` (2 floats) and ``weight`` (an int64, default 1).

    * ``serving_default`` (classify): ``classes`` ``["neg", "pos"]`` with ``scores``
      softmax([-(x0 + x1), x0 + x1]) per example.
    * ``regress``: ``outputs`` = (2 * x0 + x1) * weight, shape ``[batch]``.
    * ``scores_only`` (classify): ``scores`` alone.
    * ``parse`` (predict): ``examples`` (string) → ``x``, to run a predict on them.
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        serialized = v1.placeholder(tf.string, [None], name="tf_example")
        parsed = tf.io.parse_example(
            serialized,
            {
                "x": tf.io.FixedLenFeature([2], tf.float32),
                "weight": tf.io.FixedLenFeature([], tf.int64, default_value=1),
            },
        )
        x, weight = parsed["x"], tf.cast(parsed["weight"], tf.float32)
        s = tf.reduce_sum(x, axis=1)
        scores = tf.nn.softmax(tf.stack([-s, s], axis=1))
        classes = tf.tile(tf.constant([["neg", "pos"]]), [tf.shape(serialized)[0], 1])
        value = (2.0 * x[:, 0] + x[:, 1]) * weight
        sigs = v1.saved_model.signature_def_utils
        builder = v1.saved_model.Builder(str(path))
        builder.add_meta_graph_and_variables(
            sess,
            [v1.saved_model.tag_constants.SERVING],
            signature_def_map={
                "serving_default": sigs.classification_signature_def(serialized, classes, scores),
                "regress": sigs.regression_signature_def(serialized, value),
                "scores_only": sigs.classification_signature_def(serialized, None, scores),
                "parse": sigs.predict_signature_def({"examples": serialized}, {"x": x}),
            },
        )
        builder.save()
    return path


def build_half_plus_two(path: Path) -> Path:
    """Save TF Serving's test model ``half_plus_two`` as a plain TF 2 export (``tf.Module``).

    The model of ``tensorflow_model_server_test.py`` and ``http_rest_api_handler_test.cc``
    (``saved_model_half_plus_two.py``, its TF 2 variant), written here with plain
    TensorFlow: ``y = 0.5 * x + 2`` (``y2``: ``+ 3``). ``tf.saved_model.save`` gives every
    signature the method ``tensorflow/serving/predict``, so its classify and regress
    signatures are known only by their tensors' names, as TF Serving finds them:

    * ``serving_default``: ``x`` (float32, ``[None]``) → ``y``;
    * ``regress_x_to_y``, ``regress_x_to_y2``: ``inputs`` (serialized ``tf.Example`` with a
      float ``x``) → ``outputs``, ``[batch, 1]``;
    * ``classify_x_to_y``: ``inputs`` → ``scores``, ``[batch, 1]``;
    * ``predict_any_rank`` (not in TF Serving's model): ``x`` of unknown rank → ``y``.
    """
    import tensorflow as tf

    features = {
        "x": tf.io.FixedLenFeature([1], tf.float32),
        "x2": tf.io.FixedLenFeature([1], tf.float32, default_value=[0.0]),
    }
    examples = tf.TensorSpec([None], tf.string, name="inputs")

    class HalfPlusTwo(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = tf.Variable(0.5)
            self.b = tf.Variable(2.0)
            self.c = tf.Variable(3.0)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def predict(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": self.a * x + self.b}

        @tf.function(input_signature=[tf.TensorSpec(None, tf.float32, name="x")])
        def predict_any_rank(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": self.a * x + self.b}

        @tf.function(input_signature=[examples])
        def regress_xy(self, inputs: tf.Tensor) -> dict[str, tf.Tensor]:
            x = tf.io.parse_example(inputs, features)["x"]
            return {"outputs": self.a * x + self.b}

        @tf.function(input_signature=[examples])
        def regress_xy2(self, inputs: tf.Tensor) -> dict[str, tf.Tensor]:
            x = tf.io.parse_example(inputs, features)["x"]
            return {"outputs": self.a * x + self.c}

        @tf.function(input_signature=[examples])
        def classify_xy(self, inputs: tf.Tensor) -> dict[str, tf.Tensor]:
            x = tf.io.parse_example(inputs, features)["x"]
            return {"scores": self.a * x + self.b}

    m = HalfPlusTwo()
    signatures = {
        "serving_default": m.predict,
        "predict_any_rank": m.predict_any_rank,
        "regress_x_to_y": m.regress_xy,
        "regress_x_to_y2": m.regress_xy2,
        "classify_x_to_y": m.classify_xy,
    }
    tf.saved_model.save(m, str(path), signatures=signatures)
    return path


class ThreadedServer:
    """Run a ServingServer on its own event loop thread (real HTTP on 127.0.0.1)."""

    def __init__(self, base_path: Path, **kwargs: object) -> None:
        from trainyard.serving.server import ServingServer

        self.loop = asyncio.new_event_loop()
        self.server = ServingServer(base_path, host="127.0.0.1", port=0, **kwargs)  # type: ignore[arg-type]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)

    def sync(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.repository.sync(), self.loop).result(60)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
