"""TF Serving's gRPC API over the same models as the REST server.

``tensorflow.serving.PredictionService`` (``Predict``, ``Classify``, ``Regress``,
``GetModelMetadata``) and
``tensorflow.serving.ModelService`` (``GetModelStatus``), with the request and response
protos of ``tensorflow-serving-api``, so a client written for TF Serving (its stubs,
``model_spec`` with a version or a version label, ``output_filter``) runs unchanged against
``trainyard serve --grpc-port``. Status codes and messages follow TF Serving's
``predict_util.cc`` and ``get_model_metadata_impl.cc``.

Connections count against the REST listener's cap and deadlines
(:class:`~trainyard.serving.http_guard.GrpcRelay`). TensorFlow and the gRPC modules are
imported when the server starts, not at import time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from typing import Any

import numpy as np

from trainyard.serving.classify_regress import (
    classification_results,
    example_batch,
    example_input_name,
    missing_signature,
    regression_results,
    serialized_examples,
)
from trainyard.serving.http_guard import ConnectionGuard, GrpcRelay
from trainyard.serving.schema import CLASSIFY_METHOD, REGRESS_METHOD, InvalidRequest, model_error
from trainyard.serving.versions import (
    LabelNotFound,
    LoadedVersion,
    ModelNotFound,
    ModelRepository,
    ServedSignature,
    SignatureNotFound,
)

log = logging.getLogger("trainyard.serving")

# tensorflow_serving.apis.get_model_status_pb2.ModelVersionStatus.State
_STATES = {"START": 10, "LOADING": 20, "AVAILABLE": 30, "UNLOADING": 40, "END": 50}


class _Abort(Exception):
    def __init__(self, code: Any, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _version_of(repo: ModelRepository, spec: Any, grpc: Any) -> tuple[str, LoadedVersion]:
    name = spec.name
    if not name:
        raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
    choice = spec.WhichOneof("version_choice")
    try:
        if choice == "version":
            return name, repo.get(name, int(spec.version.value))
        if choice == "version_label":
            return name, repo.get(name, label=spec.version_label)
        return name, repo.get(name)
    except ModelNotFound as e:
        raise _Abort(grpc.StatusCode.NOT_FOUND, str(e)) from e
    except LabelNotFound as e:
        raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from e


def _signature(lv: LoadedVersion, spec: Any, grpc: Any) -> ServedSignature:
    try:
        return lv.signature(spec.signature_name)
    except SignatureNotFound as e:
        raise _Abort(grpc.StatusCode.FAILED_PRECONDITION, str(e)) from e


# A TensorProto may give fewer values than its shape holds (the last one repeats), so a
# few bytes can ask for gigabytes: the expanded size is bounded before anything is built.
_MAX_TENSOR_BYTES = 256 * 2**20


def _check_proto_shape(name: str, proto: Any, max_rows: int, tf: Any, grpc: Any) -> None:
    """Refuse a tensor whose shape is invalid, too many rows or too large, unbuilt."""
    dims = [d.size for d in proto.tensor_shape.dim]
    if any(d < 0 for d in dims):
        raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"input {name}: invalid shape {dims}")
    if dims and dims[0] > max_rows:
        raise _Abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"batch of {dims[0]} rows exceeds the limit of {max_rows}",
        )
    size = int(np.prod(dims, dtype=object)) if dims else 1
    try:
        itemsize = tf.dtypes.as_dtype(proto.dtype).size or 8  # strings: a reference each
    except TypeError:  # not a dtype: make_ndarray names it
        itemsize = 1
    if size * itemsize > _MAX_TENSOR_BYTES:
        raise _Abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"input {name}: shape {dims} holds {size} values, more than this server builds "
            f"({_MAX_TENSOR_BYTES // 2**20} MB)",
        )


def _inputs(
    sig: ServedSignature, request: Any, tf: Any, grpc: Any, max_rows: int
) -> tuple[dict[str, Any], int]:
    sent, expected = set(request.inputs), set(sig.input_spec)
    if sent != expected:
        raise _Abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"input size does not match signature: {len(sent)}!={len(expected)} "
            f"len({{{','.join(sorted(sent))}}}) != len({{{','.join(sorted(expected))}}}). "
            f"Sent extra: {{{','.join(sorted(sent - expected))}}}. "
            f"Missing but required: {{{','.join(sorted(expected - sent))}}}.",
        )
    arrays: dict[str, np.ndarray] = {}
    rows: int | None = None
    for name, (dtype, shape) in sig.input_spec.items():
        _check_proto_shape(name, request.inputs[name], max_rows, tf, grpc)
        try:
            arr = tf.make_ndarray(request.inputs[name])
        except Exception as e:  # malformed TensorProto (content size, dtype)
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"input {name}: {e}") from e
        if dtype == "string" and arr.dtype.kind in "OS":
            arr = arr.astype(object)
        elif arr.dtype != np.dtype(dtype):
            raise _Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Expects arg {name} to be {np.dtype(dtype).name} but {arr.dtype.name} is provided",
            )
        if shape is not None and (
            arr.ndim != len(shape)
            or any(d is not None and d != a for d, a in zip(shape, arr.shape, strict=False))
        ):
            want = [-1 if d is None else d for d in shape]
            raise _Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"input {name} has shape {list(arr.shape)}, the signature expects {want}",
            )
        if shape and shape[0] is None and arr.ndim:
            if rows is not None and arr.shape[0] != rows:
                raise _Abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"inputs have different batch sizes ({rows} and {arr.shape[0]} for {name})",
                )
            rows = int(arr.shape[0])
        arrays[name] = arr
    return arrays, rows or 0


class _Servicer:
    """Both services' methods over one :class:`ModelRepository`."""

    def __init__(self, repo: ModelRepository, max_rows: int) -> None:
        import grpc
        import tensorflow as tf
        from tensorflow_serving.apis import (
            get_model_metadata_pb2,
            get_model_status_pb2,
            predict_pb2,
        )

        self.repo, self.max_rows = repo, max_rows
        self.grpc, self.tf = grpc, tf
        self.meta_pb, self.status_pb, self.predict_pb = (
            get_model_metadata_pb2,
            get_model_status_pb2,
            predict_pb2,
        )

    async def _call(self, context: Any, fn: Any, *args: Any) -> Any:
        try:
            return await fn(*args)
        except _Abort as e:
            await context.abort(e.code, e.message)
        except Exception as e:  # a model call TensorFlow refused
            code = (
                self.grpc.StatusCode.INVALID_ARGUMENT
                if type(e).__name__ == "InvalidArgumentError"
                else self.grpc.StatusCode.INTERNAL
            )
            log.warning("gRPC request failed: %s: %s", type(e).__name__, e)
            await context.abort(code, model_error(e))

    # ---- PredictionService ----------------------------------------------------------

    async def Predict(self, request: Any, context: Any) -> Any:
        """``PredictionService.Predict``."""
        return await self._call(context, self._predict, request)

    async def _predict(self, request: Any) -> Any:
        grpc, tf = self.grpc, self.tf
        name, lv = _version_of(self.repo, request.model_spec, grpc)
        sig = _signature(lv, request.model_spec, grpc)
        inputs, rows = _inputs(sig, request, tf, grpc, self.max_rows)
        if rows > self.max_rows:
            raise _Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"batch of {rows} rows exceeds the limit of {self.max_rows}",
            )
        wanted = list(request.output_filter)
        unknown = [o for o in wanted if o not in sig.output_spec]
        if unknown:
            raise _Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"output tensor alias not found in signature: {unknown[0]} Outputs expected "
                f"to be in the set {{{','.join(sorted(sig.output_spec))}}}.",
            )
        outputs = await sig.predict(inputs)
        response = self.predict_pb.PredictResponse()
        response.model_spec.name = name
        response.model_spec.version.value = lv.version
        response.model_spec.signature_name = sig.name
        for key in wanted or sorted(outputs):
            response.outputs[key].CopyFrom(tf.make_tensor_proto(outputs[key]))
        return response

    async def GetModelMetadata(self, request: Any, context: Any) -> Any:
        """``PredictionService.GetModelMetadata`` (``signature_def``, as TF Serving)."""
        return await self._call(context, self._metadata, request)

    async def _metadata(self, request: Any) -> Any:
        grpc = self.grpc
        fields = list(request.metadata_field)
        if not fields:
            raise _Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "GetModelMetadataRequest must specify at least one metadata_field",
            )
        for f in fields:
            if f != "signature_def":
                raise _Abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"Metadata field {f} is not supported"
                )
        name, lv = _version_of(self.repo, request.model_spec, grpc)
        response = self.meta_pb.GetModelMetadataResponse()
        response.model_spec.name = name
        response.model_spec.version.value = lv.version
        defs = self.meta_pb.SignatureDefMap()
        for key, sig in lv.signature_defs().items():
            defs.signature_def[key].CopyFrom(sig)
        response.metadata["signature_def"].Pack(defs)
        return response

    async def Classify(self, request: Any, context: Any) -> Any:
        """``PredictionService.Classify`` on a classify signature."""
        return await self._call(context, self._examples, request, CLASSIFY_METHOD)

    async def Regress(self, request: Any, context: Any) -> Any:
        """``PredictionService.Regress`` on a regress signature."""
        return await self._call(context, self._examples, request, REGRESS_METHOD)

    async def _examples(self, request: Any, method: str) -> Any:
        from tensorflow_serving.apis import classification_pb2, regression_pb2

        grpc = self.grpc
        name, lv = _version_of(self.repo, request.model_spec, grpc)
        try:
            sig = lv.signature(request.model_spec.signature_name)
        except SignatureNotFound as e:
            raise _Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                missing_signature(request.model_spec.signature_name),
            ) from e
        try:
            input_name = example_input_name(sig.name, sig.input_spec, sig.output_spec, method)
            examples = serialized_examples(request.input)
            if len(examples) > self.max_rows:
                raise InvalidRequest(
                    f"batch of {len(examples)} examples exceeds the limit of {self.max_rows}"
                )
            outputs = await sig.predict({input_name: example_batch(examples)})
            if method == CLASSIFY_METHOD:
                labels, scores, n = classification_results(outputs, len(examples))
            else:
                values = regression_results(outputs, len(examples))
        except InvalidRequest as e:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from e
        if method == CLASSIFY_METHOD:
            response: Any = classification_pb2.ClassificationResponse()
            for i in range(len(examples)):
                result = response.result.classifications.add()
                for j in range(i * n, (i + 1) * n):
                    result.classes.add(label=labels[j], score=float(scores[j]))
        else:
            response = regression_pb2.RegressionResponse()
            for v in values.tolist():
                response.result.regressions.add(value=v)
        response.model_spec.name = name
        response.model_spec.version.value = lv.version
        response.model_spec.signature_name = sig.name
        return response

    # ---- ModelService ---------------------------------------------------------------

    async def GetModelStatus(self, request: Any, context: Any) -> Any:
        """``ModelService.GetModelStatus``."""
        return await self._call(context, self._status, request)

    async def _status(self, request: Any) -> Any:
        grpc = self.grpc
        spec = request.model_spec
        if not spec.name:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
        # as get_model_status_impl.cc: a version narrows the answer, a label does not
        version = int(spec.version.value) if spec.HasField("version") else None
        try:
            entries = self.repo.status(spec.name, version)
        except ModelNotFound as e:
            raise _Abort(grpc.StatusCode.NOT_FOUND, str(e)) from e
        from tensorflow.core.protobuf import error_codes_pb2

        response = self.status_pb.GetModelStatusResponse()
        for entry in entries:
            status = response.model_version_status.add()
            status.version = int(entry["version"])
            status.state = _STATES.get(entry["state"], 0)
            err = entry.get("status", {})
            status.status.error_code = error_codes_pb2.Code.Value(err.get("error_code", "OK"))
            status.status.error_message = err.get("error_message", "")
        return response


class GrpcListener:
    """The gRPC side of a server: TF Serving's services behind the public port.

    The services listen on a private Unix socket, reached through
    :class:`~trainyard.serving.http_guard.GrpcRelay` connections on the public port.

    Attributes:
        port: The public port.
    """

    def __init__(self, server: Any, front: asyncio.AbstractServer, port: int, sockdir: str):
        self._server, self._front, self._sockdir = server, front, sockdir
        self.port = port

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, let calls in progress finish (``grace`` s), remove the socket."""
        self._front.close()
        await self._server.stop(grace=grace)
        shutil.rmtree(self._sockdir, ignore_errors=True)


async def start_grpc_server(
    repo: ModelRepository,
    host: str,
    port: int,
    max_rows: int,
    guard: ConnectionGuard,
    idle_timeout: float,
) -> GrpcListener:
    """Start TF Serving's gRPC services on ``host:port`` (0: any free port).

    Connections are accepted by an asyncio listener under ``guard`` (the REST listener's:
    one cap and one eviction order for both) and relayed to a ``grpc.aio`` server on a Unix
    socket in a private directory, which closes a connection idle (no call) for
    ``idle_timeout`` seconds with a GOAWAY, as the REST side closes an idle keep-alive one.

    Returns:
        The listener (its ``port`` is the bound one).

    Raises:
        OSError: If the port cannot be bound.
    """
    import grpc
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    # the generated bases answer UNIMPLEMENTED for what is not served (MultiInference,
    # HandleReloadConfigRequest)
    servicer_type = type(
        "Servicer",
        (
            _Servicer,
            prediction_service_pb2_grpc.PredictionServiceServicer,
            model_service_pb2_grpc.ModelServiceServicer,
        ),
        {},
    )
    servicer = servicer_type(repo, max_rows)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 64 * 2**20),
            ("grpc.max_connection_idle_ms", int(idle_timeout * 1000)),
        ]
    )
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(servicer, server)  # type: ignore[arg-type]
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(servicer, server)  # type: ignore[arg-type]
    sockdir = tempfile.mkdtemp(prefix="trainyard-grpc-")
    path = os.path.join(sockdir, "grpc.sock")
    if not server.add_insecure_port(f"unix:{path}"):
        shutil.rmtree(sockdir, ignore_errors=True)
        raise OSError(f"cannot listen for gRPC on {path}")
    await server.start()
    try:
        front = await asyncio.get_running_loop().create_server(
            lambda: GrpcRelay(guard, path), host, port, backlog=128, reuse_address=True
        )
    except OSError as e:
        await server.stop(None)
        shutil.rmtree(sockdir, ignore_errors=True)
        why = os.strerror(e.errno).lower() if e.errno else str(e)
        raise OSError(e.errno, f"cannot listen for gRPC on {host}:{port}: {why}") from e
    bound = int(front.sockets[0].getsockname()[1])
    return GrpcListener(server, front, bound, sockdir)
