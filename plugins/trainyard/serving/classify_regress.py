"""TF Serving's Classify and Regress APIs: ``tf.Example`` requests, labelled results.

A ``:classify`` / ``:regress`` request names examples as JSON objects (feature name →
value or list of values) and an optional ``context`` object whose features every example
shares::

    {"signature_name": "...", "context": {"f": 1}, "examples": [{"g": [0.5, 1.5]}, ...]}

Each example becomes a serialized ``tf.Example`` (context first, the example's own
features replacing a context feature of the same name, as TF Serving merges them), fed
to the signature's input. As TF Serving by default (``--enable_signature_method_name_check``
off), the signature's ``method_name`` is not looked at, so a TF 2 export (whose signatures
are all ``tensorflow/serving/predict``) classifies and regresses too: a classification
signature has one input named ``inputs`` and outputs ``classes`` (strings) and/or
``scores`` (float32), ``[batch, n]``; a regression signature one input ``inputs`` and one
output ``outputs`` (float32, ``[batch]`` or ``[batch, 1]``). The rules and messages follow
TF Serving's ``json_tensor.cc`` (``MakeExampleFromJsonObject``,
``MakeJsonFromClassificationResult``), ``classifier.cc`` and ``regressor.cc``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from trainyard.serving.schema import (
    CLASSIFY_METHOD,
    DEFAULT_SIGNATURE,
    SIGNATURE_NAME_ERROR,
    FeatureSpec,
    InvalidRequest,
    decode_b64,
    dump_array,
    is_b64_object,
    parse_json_object,
)

_INT64_MAX = 2**63 - 1
_UINT64_MAX = 2**64 - 1
# tensorflow/core/framework/types.pb.h names, for TF Serving's messages
_DT = {"float32": "DT_FLOAT", "float64": "DT_DOUBLE", "int64": "DT_INT64", "int32": "DT_INT32"}


class ExampleRequest:
    """A decoded ``:classify`` / ``:regress`` request.

    Attributes:
        signature: The ``signature_name`` it named (``""``: the default).
        examples: One serialized ``tf.Example`` per example, context merged in.
    """

    def __init__(self, signature: str, examples: list[bytes]) -> None:
        self.signature = signature
        self.examples = examples

    @property
    def rows(self) -> int:
        """The number of examples."""
        return len(self.examples)


def _feature(name: str, content: Any) -> Any:
    """One JSON feature value (or list of values) as a ``tf.train.Feature``."""
    from tensorflow.core.example import feature_pb2

    feature = feature_pb2.Feature()
    kind: str | None = None
    values = content if isinstance(content, list) else [content]
    for val in values:
        if (
            val is None
            or isinstance(val, list)
            or (isinstance(val, dict) and not is_b64_object(val))
        ):
            json_type = {type(None): "Null", list: "Array", dict: "Object"}[type(val)]
            raise InvalidRequest(
                f"Feature: {name} has element with unexpected JSON type: {json_type}"
            )
        if isinstance(val, bool):
            want, value = "int64_list", int(val)
        elif isinstance(val, dict):
            want, value = "bytes_list", decode_b64(val["b64"], f"feature {name}")
        elif isinstance(val, str):
            want, value = "bytes_list", val.encode("utf-8", "surrogatepass")
        elif isinstance(val, float) or val > _UINT64_MAX or val < -(2**63):
            # a float_list holds float32: beyond its range is inf, as rapidjson's GetFloat
            want, value = "float_list", float(val)
        elif val > _INT64_MAX:
            raise InvalidRequest(
                f"Feature: {name} has uint64_t element. Only int64_t is supported."
            )
        else:
            want, value = "int64_list", int(val)
        if kind is not None and kind != want:
            raise InvalidRequest(
                f"Unexpected element type in feature: {name} expecting type: "
                f"{kind.removesuffix('_list')}"
            )
        kind = want
        getattr(feature, want).value.append(value)
    return feature


def _example(obj: Any, what: str) -> bytes:
    """A JSON object of features as a serialized ``tf.Example``."""
    from tensorflow.core.example import example_pb2

    if not isinstance(obj, dict):
        json_type = {list: "Array", str: "String", type(None): "Null", bool: "Bool"}.get(
            type(obj), "Number"
        )
        raise InvalidRequest(f"{what}: Example must be JSON object but got JSON {json_type}")
    example = example_pb2.Example()
    for name, content in obj.items():
        example.features.feature[name].CopyFrom(_feature(name, content))
    return example.SerializeToString()


def missing_signature(name: str) -> str:
    """TF Serving's message (classifier.cc, regressor.cc) for a signature a model lacks."""
    return f"No signature was found with the name: {name or DEFAULT_SIGNATURE}"


def decode_example_request(body: bytes, verb: str, max_rows: int) -> ExampleRequest:
    """Decode a ``:classify`` or ``:regress`` body into serialized examples.

    Args:
        body: The raw request body (UTF-8 JSON).
        verb: ``classify`` or ``regress`` (for messages).
        max_rows: The most examples accepted in one request.

    Returns:
        The signature name and one serialized ``tf.Example`` per example.

    Raises:
        InvalidRequest: If the body or an example is malformed (names the feature).
    """
    doc = parse_json_object(body, "'examples'")
    signature = doc.get("signature_name", "")
    if type(signature) is not str:
        raise InvalidRequest(SIGNATURE_NAME_ERROR)
    context = _example(doc["context"], "context") if "context" in doc else b""
    examples = doc.get("examples")
    if examples is None:
        raise InvalidRequest(f"When method is {verb}, key 'examples' is expected and was not found")
    if not isinstance(examples, list):
        raise InvalidRequest("Expecting 'examples' value to be an list/array")
    if not examples:
        raise InvalidRequest("'examples' value is an empty array")
    if len(examples) > max_rows:
        raise InvalidRequest(f"'examples' has {len(examples)} entries, at most {max_rows}")
    # Concatenated serializations parse as their merge: an example's feature replaces
    # the context's feature of the same name, as TF Serving's input_util does.
    return ExampleRequest(
        signature,
        [context + _example(ex, f"examples[{i}]") for i, ex in enumerate(examples)],
    )


def example_input_name(
    signature: str, input_spec: FeatureSpec, output_spec: FeatureSpec, wanted: str
) -> str:
    """The input a classify or regress call feeds its examples to, checked as TF Serving does.

    ``classifier.cc``/``regressor.cc`` (``PreProcessClassification``/``...Regression``, the
    method name left unchecked as by default): one input, named ``inputs``; one or two
    outputs among ``classes`` and ``scores``, or the one output ``outputs``.

    Args:
        signature: The signature's name, for messages.
        input_spec: Its inputs.
        output_spec: Its outputs.
        wanted: ``CLASSIFY_METHOD`` or ``REGRESS_METHOD``: what the request asks for.

    Raises:
        InvalidRequest: If the signature cannot classify (regress) (TF Serving's messages).
    """
    classify = wanted == CLASSIFY_METHOD
    kind = "classification" if classify else "regression"
    if len(input_spec) != 1:
        raise InvalidRequest("Expected one input Tensor.")
    outputs = len(output_spec)
    if classify and outputs not in (1, 2):
        raise InvalidRequest(f"Expected one or two output Tensors, found {outputs}")
    if not classify and outputs != 1:
        raise InvalidRequest("Expected one output Tensor.")
    if "inputs" not in input_spec:
        raise InvalidRequest(f"No {kind} inputs found in SignatureDef: {signature}")
    if classify and not {"classes", "scores"} & set(output_spec):
        raise InvalidRequest(
            'Expected classification signature outputs to contain at least one of "classes" '
            f'or "scores". Signature was: {signature}'
        )
    if not classify and "outputs" not in output_spec:
        raise InvalidRequest(f"No regression outputs found in SignatureDef: {signature}")
    dtype = input_spec["inputs"][0]
    if dtype != "string":  # TensorFlow's own refusal to feed strings, with its words
        raise InvalidRequest(f"Expects arg inputs to be {dtype} but string is provided")
    return "inputs"


def example_batch(examples: Sequence[bytes]) -> np.ndarray:
    """Serialized examples as the string tensor a classify/regress signature takes."""
    arr = np.empty(len(examples), dtype=object)
    arr[:] = list(examples)
    return arr


def _dt(arr: np.ndarray) -> str:
    return _DT.get(arr.dtype.name, "DT_STRING" if arr.dtype.kind in "OSU" else arr.dtype.name)


def classification_results(
    outputs: dict[str, np.ndarray], rows: int
) -> tuple[list[str], np.ndarray, int]:
    """A classify signature's outputs as labels and float32 scores, ``n`` per example.

    Missing ``classes`` give empty labels and missing ``scores`` give 0, as TF Serving's
    ``ClassificationResult`` leaves them unset (``PostProcessClassificationResult``).

    Returns:
        ``(labels, scores, n)``: ``rows * n`` labels and scores, example by example.

    Raises:
        InvalidRequest: If ``classes``/``scores`` are missing, mis-shaped or mistyped.
    """
    classes, scores = outputs.get("classes"), outputs.get("scores")
    if classes is None and scores is None:
        raise InvalidRequest(
            "Expected classification signature outputs to contain classes or scores"
        )
    for name, arr, dtype in (("classes", classes, "DT_STRING"), ("scores", scores, "DT_FLOAT")):
        if arr is None:
            continue
        if arr.ndim != 2:
            raise InvalidRequest(
                f"Expected Tensor shape: [batch_size num_classes] but got {list(arr.shape)}"
            )
        if _dt(arr) != dtype:
            raise InvalidRequest(f"Expected {name} Tensor of {dtype}. Got: {_dt(arr)}")
        if arr.shape[0] != rows:
            raise InvalidRequest(
                f"Expected {name} output batch size of {rows}. Got: {arr.shape[0]}"
            )
    if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
        raise InvalidRequest(
            "Tensors class and score should match in dim_size(1). Got "
            f"{classes.shape[1]} vs. {scores.shape[1]}"
        )
    n = (classes if classes is not None else scores).shape[1]  # type: ignore[union-attr]
    if classes is not None:
        labels = [
            v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            for v in classes.reshape(-1).tolist()
        ]
    else:
        labels = [""] * (rows * n)
    values = scores.reshape(-1) if scores is not None else np.zeros(rows * n, dtype=np.float32)
    return labels, values, n


def encode_classification(outputs: dict[str, np.ndarray], rows: int) -> bytes:
    """``{"results": [[[label, score], ...], ...]}`` from a classify signature's outputs.

    Raises:
        InvalidRequest: If ``classes``/``scores`` are missing or mis-shaped.
    """
    labels, scores, n = classification_results(outputs, rows)
    numbers = dump_array(scores)[1:-1].split(b",") if scores.size else []
    pairs = [
        b"[" + orjson.dumps(lab) + b"," + num + b"]"
        for lab, num in zip(labels, numbers, strict=True)
    ]
    results = [b"[" + b",".join(pairs[i * n : (i + 1) * n]) + b"]" for i in range(rows)]
    return b'{"results":[' + b",".join(results) + b"]}"


def regression_results(outputs: dict[str, np.ndarray], rows: int) -> np.ndarray:
    """A regress signature's ``outputs`` as one float32 value per example.

    Raises:
        InvalidRequest: If ``outputs`` is missing, not ``[batch]`` / ``[batch, 1]`` or not
            float32 (``PostProcessRegressionResult``'s messages).
    """
    out = outputs.get("outputs")
    if out is None:
        raise InvalidRequest("No regression outputs found in SignatureDef")
    if not (out.ndim == 1 or (out.ndim == 2 and out.shape[1] == 1)):
        raise InvalidRequest(
            "Expected output Tensor shape to be either [batch_size] or [batch_size, 1] "
            f"but got {list(out.shape)}"
        )
    if out.shape[0] != rows:
        raise InvalidRequest(
            f"Input batch size did not match output batch size: {rows} vs. {out.shape[0]}"
        )
    if _dt(out) != "DT_FLOAT":
        raise InvalidRequest(f"Expected output Tensor of DT_FLOAT.  Got: {_dt(out)}")
    return out.reshape(-1)


def encode_regression(outputs: dict[str, np.ndarray], rows: int) -> bytes:
    """``{"results": [value, ...]}`` from a regress signature's ``outputs``.

    Raises:
        InvalidRequest: If ``outputs`` is missing or not ``[batch]`` / ``[batch, 1]``.
    """
    return b'{"results":' + dump_array(regression_results(outputs, rows)) + b"}"


def serialized_examples(input_proto: Any) -> list[bytes]:
    """The examples of a gRPC ``tensorflow.serving.Input``, context merged in.

    Raises:
        InvalidRequest: If it holds no examples.
    """
    kind = input_proto.WhichOneof("kind")
    if kind == "example_list":
        examples = [ex.SerializeToString() for ex in input_proto.example_list.examples]
    elif kind == "example_list_with_context":
        with_context = input_proto.example_list_with_context
        context = with_context.context.SerializeToString()
        examples = [context + ex.SerializeToString() for ex in with_context.examples]
    else:
        examples = []
    if not examples:
        raise InvalidRequest("Input is empty.")
    return examples
