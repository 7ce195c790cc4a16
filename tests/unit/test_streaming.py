"""Stream scoring without a broker: contract checks, the Kafka engine, the scorer Deployment.

The Kafka back-end is covered here for everything that runs without a Kafka broker (none
runs on this machine): its client settings, the offsets it commits, message conversion,
and a real confluent-kafka producer failing clearly when no broker answers. The Redis
back-end runs for real in ``tests/reliability/test_stream_scoring.py``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from kubernetes import client as k

from tests.support.streams import LOOSE_CONTRACT
from trainyard import k8s
from trainyard.config import PipelineConfig
from trainyard.contracts import parse_contract_text
from trainyard.errors import ConfigError
from trainyard.k8s.scoring import scorer_deployment, scorer_name
from trainyard.streaming.engines import (
    KafkaStreams,
    Message,
    Output,
    StreamError,
    Streams,
    encode_scores,
    kafka_consumer_config,
    kafka_producer_config,
    next_offsets,
)
from trainyard.streaming.model_endpoint import scores_of
from trainyard.streaming.records import RecordChecker
from trainyard.streaming.score_stream import model_unreachable, waiting_for_the_model

ROOT = Path(__file__).resolve().parents[2]
STREAMS = Streams("txn.in", "txn.scores", "txn.dead", "trainyard-transactions")


@pytest.fixture(scope="module")
def checker() -> RecordChecker:
    path = ROOT / "data_contracts" / "transactions.yaml"
    return RecordChecker(parse_contract_text(path.read_text(), path))


GOOD = {"txn_id": "t-1", "amount": 12.5, "hour": 3, "customer_age": 40}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({}, None),
        ({"merchant_category": "fuel", "is_fraud": 0}, None),
        ({"customer_age": 95}, None),  # max is a warn rule: scored
        ({"amount": 0}, "amount: 0 is below the minimum 0 (exclusive)"),
        ({"amount": 2e6}, "amount: 2000000.0 is above the maximum 1e+06"),
        ({"amount": float("nan")}, "amount: expected a finite number, got nan"),
        ({"amount": True}, "amount: expected a number, got True"),
        ({"hour": 3.5}, "hour: expected an integer, got 3.5"),
        ({"hour": 3.0}, "hour: expected an integer, got 3.0"),
        ({"hour": 24}, "hour: 24 is above the maximum 23"),
        ({"hour": None}, "hour: null"),
        ({"customer_age": 2**63}, "customer_age: 9223372036854775808 is outside the int64 range"),
        ({"customer_age": 1e20}, "customer_age: 1e+20 is outside the int64 range"),
        ({"customer_age": 2**63 - 1}, None),  # max is a warn rule: scored
        ({"txn_id": "t 1"}, "txn_id: 't 1' does not match '^[A-Za-z0-9_-]+$'"),
        ({"txn_id": "t1\n"}, "txn_id: 't1\\n' does not match '^[A-Za-z0-9_-]+$'"),
        ({"txn_id": 7}, "txn_id: expected a string, got 7"),
        ({"merchant_category": "toys"}, "merchant_category: 'toys' is not an allowed value"),
        ({"is_fraud": 2}, "is_fraud: 2 is not an allowed value"),
        ({"colour": "red"}, "colour: unknown field (not a column of the contract)"),
    ],
)
def test_record_rules(checker: RecordChecker, change: dict[str, Any], reason: str | None) -> None:
    assert checker.check({**GOOD, **change}) == reason


HOSTILE_VALUES: list[Any] = [
    None, True, False, 0, 1, 2, -1, 3.5, 3.0, -0.0, 23, 24, 0.0, 2e6, 95, 18, 1e39, -1e39,
    float("inf"), float("nan"), 2**53, 2**53 + 1, -(2**53) - 1, 2**63, 10**30, "x", "t-1", "",
    2**63 - 1, -(2**63), -(2**63) - 1, 2**31, 2**31 - 1, -(2**31), -(2**31) - 1, 1e20, 2.0**62,
    -9.3e18, 3e9,
    "t 1", "fuel", "toys", "ünï", "a" * 70, [1], {"a": 1}, b"b", "t-1\n", "t-1\n\n",
]  # fmt: skip


class _Dict(dict):
    """A dict subclass: what a caller other than orjson may hand the checks."""


def _hostile_records(good: dict[str, Any], keys: list[str], n: int) -> list[Any]:
    rnd = random.Random(11)
    out: list[Any] = [good, [1], "s", None, 7, _Dict(good)]
    for _ in range(n):
        r = dict(good)
        for _ in range(rnd.randint(0, 3)):
            k = rnd.choice(keys)
            if rnd.random() < 0.15:
                r.pop(k, None)
            else:
                r[k] = rnd.choice(HOSTILE_VALUES)
        out.append(r)
    return out


def test_a_batch_decodes_and_checks_each_record(checker: RecordChecker) -> None:
    raws = [orjson.dumps(GOOD), b"{oops", orjson.dumps({**GOOD, "hour": 99})]
    recs, reasons = checker.parse_batch(raws)
    assert reasons[0] is None and reasons[1].startswith("not JSON")
    assert reasons[2] == "hour: 99 is above the maximum 23" and recs[0] == GOOD


@pytest.mark.parametrize("contract", ["transactions", "loose"])
def test_hostile_records_get_a_reason_each_and_the_rest_are_scored(
    checker: RecordChecker, contract: str
) -> None:
    """Every hostile value (bools, huge and non-integral numbers, NaN, nested values,
    subclasses) gets a reason naming its field, never an exception; the batch's model
    inputs are the passing records' features, in order, as float32 (inf where a value
    does not fit)."""
    if contract == "loose":
        checker = RecordChecker(parse_contract_text(LOOSE_CONTRACT, Path("loose.yaml")))
        good = {"id": "t-1", "x": 0.5, "n": 1, "flag": True, "extra": [1]}
        keys = ["id", "x", "n", "flag", "day", "y", "w", "extra", "zz"]
    else:
        good, keys = GOOD, ["txn_id", "amount", "hour", "customer_age", "merchant_category"]
        keys += ["is_fraud", "zz"]
    records = _hostile_records(good, keys, 4000)
    reasons, inputs = checker.check_parsed(records)
    assert reasons == [checker.check(r) for r in records] == checker.check_batch(records)
    passing = [r for r, why in zip(records, reasons, strict=True) if why is None]
    assert 100 < len(passing) < len(records) - 100
    named = [why for r, why in zip(records, reasons, strict=True) if isinstance(r, dict) and why]
    assert all(why.split(":")[0] in [*keys, "txn_id", "id"] for why in named)
    assert list(inputs) == checker.features
    for name, column in inputs.items():
        assert column.dtype == np.float32 and len(column) == len(passing)
        with np.errstate(over="ignore"):
            want = np.array([float(r[name]) for r in passing], dtype=np.float32)
        np.testing.assert_array_equal(column, want)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({}, None),
        ({"x": 9007199254740992}, None),  # 2**53: below the bound 2**53 + 1
        ({"x": 2**53 + 1}, "x: 9007199254740993 is above the maximum 9.0072e+15 (exclusive)"),
        ({"n": 2}, None),
        ({"n": 4}, "n: 4 is not an allowed value"),
        ({"n": True}, "n: expected an integer, got True"),
        ({"flag": 1}, "flag: expected true or false, got 1"),
        ({"w": 2**31}, "w: 2147483648 is outside the int32 range"),
        ({"day": None}, None),  # nullable is a warn rule
        ({"w": None}, None),
        ({"id": "t-12345678"}, "id: longer than 8 characters"),
        ({"id": "x-1"}, "id: 'x-1' does not match '^t-'"),
        ({"more": {"a": 1}}, None),  # extra columns allowed
    ],
)  # fmt: skip
def test_loose_contract_rules_and_bounds_beyond_2_53_are_exact(
    change: dict[str, Any], reason: str | None
) -> None:
    """Integers compare with a bound beyond 2**53 exactly (a double would round both)."""
    text = LOOSE_CONTRACT.replace("max: 9007199254740992", "max: 9007199254740993")
    checker = RecordChecker(parse_contract_text(text, Path("loose.yaml")))
    record = {"id": "t-1", "x": 0.5, "n": 1, "flag": False, **change}
    assert checker.check(record) == reason
    reasons, inputs = checker.check_parsed([record, {"id": "t-1", "x": 0.5, "n": 9}])
    assert reasons == [reason, "flag: missing (the key and every feature are required)"]
    assert inputs["x"].tolist() == ([] if reason else [float(np.float32(record["x"]))])


def test_records_json_refuses_are_read_leniently_to_name_the_field(
    checker: RecordChecker,
) -> None:
    """NaN and Infinity (what Python's json writes by default) and numbers beyond float64
    name the field and keep the id; what the scorer could not write back stays refused."""
    head = b'{"txn_id":"t-1","hour":3,"customer_age":40,'
    raws = [
        head + b'"amount":NaN}',
        head + b'"amount":-Infinity}',
        head + b'"amount":1e999999}',
        head + b'"amount":1' + b"0" * 400 + b"}",  # an int beyond 64 bits and float64
        b'{"txn_id":"\\ud800","amount":NaN}',  # a lone surrogate
        b'{"txn_id":"t-4","amount":5,"hour":3,"customer_age":-9223372036854775809}',
        b"{nope",
    ]
    records, reasons, inputs = checker.parse_inputs(raws)
    assert reasons[:3] == [
        "amount: expected a finite number, got nan",
        "amount: expected a finite number, got -inf",
        "amount: expected a finite number, got inf",
    ]
    assert records[0]["txn_id"] == "t-1"
    # an integer beyond float64 (a cold user's 10**309): as orjson reads big ones, a float
    assert reasons[3] == "amount: expected a finite number, got inf"
    assert records[3]["txn_id"] == "t-1"
    assert reasons[4].startswith("not JSON: ") and records[4] is None
    # beyond int64 orjson reads a float, which rounds to -2**63: not taken as an integer
    assert reasons[5] == "customer_age: -9.223372036854776e+18 is outside the int64 range"
    assert reasons[6].startswith("not JSON: unexpected character")
    # bytes that are not UTF-8 said "str is not valid UTF-8: surrogates not allowed"
    _, (why,) = checker.parse_batch([b"\xff\xfe not json"])
    assert why == "not JSON: not UTF-8 text (byte 0xff at 0: invalid start byte)"
    # 100,000 digits (beyond int()'s 4,300) in an integer column: named, with its id
    ((record,), (why,)) = checker.parse_batch(
        [b'{"txn_id":"t-5","amount":5,"customer_age":40,"hour":' + b"1" * 100_000 + b"}"]
    )
    assert why == "hour: inf is outside the int64 range" and record["txn_id"] == "t-5"
    assert all(len(c) == 0 for c in inputs.values())


@pytest.mark.parametrize("hour", [3, 0, 3.0, 10.0, -0.0, 0.0])
def test_the_scorer_takes_the_integers_json_lines_staging_takes(
    checker: RecordChecker, hour: Any
) -> None:
    """``3.0`` in an integer column was scored though JSON Lines staging refuses it: the
    records scored must obey the rules the training data obeyed."""
    import io

    import pyarrow as pa
    import pyarrow.json as pj

    from trainyard.staging.sources import arrow_type

    (col,) = [c for c in checker.contract.columns if c.name == "hour"]
    schema = pa.schema([pa.field("hour", arrow_type(col.type))])
    line = orjson.dumps({"hour": hour})
    try:
        pj.read_json(io.BytesIO(line), parse_options=pj.ParseOptions(explicit_schema=schema))
        staged = True
    except pa.ArrowInvalid:
        staged = False
    _, (reason,) = checker.parse_batch([orjson.dumps({**GOOD, "hour": hour})])
    assert (reason is None) == staged == isinstance(hour, int), (line, reason)


def test_a_cut_dead_letter_says_how_big_the_record_was() -> None:
    from trainyard.streaming.scorer import MAX_DEAD_VALUE_BYTES, dead_letter

    big = b'{"id": "' + b"x" * 100_000 + b'"}'
    doc = orjson.loads(dead_letter(None, "1-0", "id: longer than 32 characters", big).value)
    assert len(doc["value"]) == MAX_DEAD_VALUE_BYTES and doc["value_bytes"] == len(big)
    small = orjson.loads(dead_letter("k", "1-0", "why", b"{}").value)
    assert small == {"id": "k", "source": "1-0", "reason": "why", "value": "{}"}


def test_record_shape(checker: RecordChecker) -> None:
    missing = {k: v for k, v in GOOD.items() if k != "hour"}
    assert checker.check(missing) == "hour: missing (the key and every feature are required)"
    assert checker.check([1, 2]) == "not a JSON object (list)"
    assert checker.parse(b"{not json")[1].startswith("not JSON: ")
    assert checker.parse(b"")[1] == "empty: no record in the entry"
    assert checker.parse_batch([b"", b"{"])[1][0] == "empty: no record in the entry"
    record, reason = checker.parse(orjson.dumps(GOOD))
    assert reason is None
    cols = checker.columns([record, {**GOOD, "amount": 1.0}])
    assert list(cols) == ["amount", "hour", "customer_age"]
    assert cols["amount"].dtype.name == "float32" and cols["amount"].tolist() == [12.5, 1.0]


def test_image_datasets_are_refused_naming_the_feature() -> None:
    path = ROOT / "data_contracts" / "digits.yaml"
    with pytest.raises(ConfigError, match=r"stream scoring takes table records.*'image'"):
        RecordChecker(parse_contract_text(path.read_text(), path))


def test_scores_of_binary_multiclass_and_plain_outputs() -> None:
    s, c = scores_of({"probabilities": [[0.9, 0.1], [0.2, 0.8]], "class_id": [0, 1]}, 2)
    assert s == pytest.approx([0.1, 0.8]) and c == [0, 1]
    s, c = scores_of({"probabilities": [[0.1, 0.7, 0.2]], "class_id": [1]}, 1)
    assert s == pytest.approx([0.7]) and c == [1]
    s, c = scores_of({"value": [[3.5], [1.0]]}, 2)
    assert s == [3.5, 1.0] and c == [None, None]


@pytest.mark.parametrize(
    "outputs",
    [
        {"probabilities": [[0.25, 0.75], [1.0, 0.0], [0.5, 0.5]], "class_id": [1, 0, 0]},
        {"probabilities": [[0, 1], [1, 0], [0.5, 0.5]], "class_id": [1, 0, 0]},  # ints
        {"probabilities": [[0.2, 0.8], [0.9, 0.1], [0.5, 0.5]], "class_id": [1.0, 0, 0]},
        {"probabilities": [[0.2, 0.8], [0.9, 0.1], [0.5, 0.5]], "class_id": [True, 0, 0]},
        {"probabilities": [0.2, 0.8, 0.9, 0.1, 0.5, 0.5], "class_id": [1, 0, 0]},  # flat
    ],
)
def test_scores_of_two_classes_as_numpy_gives_them(outputs: dict[str, Any]) -> None:
    """The list fast path for two classes gives numpy's values and types exactly."""
    p = np.asarray(outputs["probabilities"], dtype=np.float64).reshape(3, -1)
    want = (p[:, 1].tolist(), np.asarray(outputs["class_id"], dtype=np.int64).tolist())
    got = scores_of(outputs, 3)
    assert got == want
    assert [type(x) for x in got[0]] == [float] * 3 and [type(x) for x in got[1]] == [int] * 3


# --------------------------------------------------------------------------- Kafka


def test_kafka_client_settings_are_manual_commit_group_members() -> None:
    c = kafka_consumer_config("b1:9092,b2:9092", "g", "me")
    assert c["group.id"] == "g" and c["bootstrap.servers"] == "b1:9092,b2:9092"
    assert c["enable.auto.commit"] is False and c["enable.auto.offset.store"] is False
    assert c["auto.offset.reset"] == "earliest"
    p = kafka_producer_config("b1:9092", "me")
    assert p["enable.idempotence"] is True and p["acks"] == "all"


def test_next_offsets_commit_one_past_the_highest_per_partition() -> None:
    done = [
        Message("t/0/5", b"", partition=0, offset=5),
        Message("t/1/9", b"", partition=1, offset=9),
        Message("t/0/7", b"", partition=0, offset=7),
        Message("t/0/6", b"", partition=0, offset=6),
    ]
    assert next_offsets(done) == {0: 8, 1: 10}
    with pytest.raises(StreamError, match="message 1-0: no Kafka partition/offset"):
        next_offsets([Message("1-0", b"")])


class _FakeKafkaMessage:
    """The accessor surface of ``confluent_kafka.Message`` (not constructible in Python)."""

    def __init__(self, key: bytes | None, value: bytes, partition: int, offset: int) -> None:
        self._k, self._v, self._p, self._o = key, value, partition, offset

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes:
        return self._v

    def topic(self) -> str:
        return "txn.in"

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o


@pytest.mark.parametrize("broker", ["refused", "silent"])
def test_kafka_engine_without_a_broker(broker: str) -> None:
    """Real confluent-kafka clients; nothing listens on the port (refused), or a peer takes
    the connection and never answers (silent): nothing is delivered, and no call waits
    longer than its own bound (a read its ``block_ms``, a commit ``delivery_timeout_s``)."""
    import socket
    import time

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    if broker == "refused":
        listener.close()  # closed again: connection refused
    engine = KafkaStreams(f"127.0.0.1:{port}", STREAMS, consumer="t", delivery_timeout_s=1.0)
    try:
        m = engine.message(_FakeKafkaMessage(b"t-1", b'{"a": 1}', 3, 41))
        assert m == Message("txn.in/3/41", b'{"a": 1}', key="t-1", partition=3, offset=41)
        began = time.monotonic()
        assert engine.read(10, 100) == []  # no broker: nothing, no exception
        assert engine.claim(1000, 10) == []  # rebalancing hands over uncommitted offsets
        assert time.monotonic() - began < 1.5
        began = time.monotonic()
        with pytest.raises(StreamError, match=r"not delivered within 1s.*nothing committed"):
            engine.commit([Output.of("t-1", {"id": "t-1", "score": 0.5})], [], [m])
        assert time.monotonic() - began < 2.5
    finally:
        engine.close()
        listener.close()


# --------------------------------------------------------------------------- Deployment


def _pipeline(stream: dict[str, Any] | None) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": "transactions",
            "dataset": "transactions",
            "start_date": "2026-11-01",
            "source": {"url": "x/{ds}.csv", "format": "csv"},
            "training": {"model": "mlp"},
            "serving": {"model_name": "transactions"},
            "scoring": {"stream": stream} if stream else {},
        }
    )


KAFKA = {
    "engine": "kafka",
    "input": "txn.in",
    "output": "txn.scores",
    "dead_letter": "txn.dead",
    "bootstrap_servers": "kafka.data.svc:9092",
    "partitions": 6,
}


def test_scorer_deployment_is_restricted_on_the_cpu_pool_scaled_by_partitions() -> None:
    profile = k8s.load_cluster_profile(ROOT / "deploy" / "cluster_profile.yaml")
    dep = scorer_deployment(profile, _pipeline(KAFKA))
    assert isinstance(dep, k.V1Deployment)
    assert k8s.validate_object(dep) == []
    assert dep.metadata.name == scorer_name("transactions") == "scorer-transactions"
    assert dep.spec.replicas == 6
    assert dep.spec.strategy.rolling_update.max_surge == 0
    pod = dep.spec.template.spec
    (c,) = pod.containers
    assert c.command == ["python", "-m", "trainyard", "score-stream"]
    assert c.args[:2] == ["--pipeline", "transactions"]
    assert c.image == profile.images.steps
    assert c.security_context.read_only_root_filesystem is True
    assert c.security_context.capabilities.drop == ["ALL"]
    assert pod.security_context.run_as_non_root is True
    assert pod.node_selector == (dict(profile.cpu_pool.node_labels) or None)
    env = {e.name: e.value for e in c.env}
    assert env["TRAINYARD_SERVING_HOST"] == f"serving-transactions.{profile.namespace}.svc"
    # the scorer's command line is one the CLI accepts
    from trainyard.streaming.score_stream import cli_main

    assert cli_main([*c.args, "--help"]) == 0
    # a changed config rolls the pods
    other = _pipeline({**KAFKA, "partitions": 3})
    assert (
        scorer_deployment(profile, other).spec.template.metadata.annotations
        != dep.spec.template.metadata.annotations
    )


def test_scorer_deployment_refuses_what_cannot_run_on_a_cluster() -> None:
    profile = k8s.load_cluster_profile(ROOT / "deploy" / "cluster_profile.yaml")
    with pytest.raises(ConfigError, match=r"has no scoring\.stream"):
        scorer_deployment(profile, _pipeline(None))
    local = {"input": "a", "output": "b", "dead_letter": "c"}
    with pytest.raises(ConfigError, match="project's own server on this machine"):
        scorer_deployment(profile, _pipeline(local))
    remote = scorer_deployment(profile, _pipeline({**local, "url": "redis://redis.data:6379/0"}))
    assert k8s.validate_object(remote) == [] and remote.spec.replicas == 1


def test_render_scorer_step() -> None:
    from trainyard.pods import render_objects

    profile = k8s.load_cluster_profile(ROOT / "deploy" / "cluster_profile.yaml")
    (dep,) = render_objects(profile, _pipeline(KAFKA), "scorer")
    assert dep.metadata.name == "scorer-transactions"
    assert render_objects(profile, _pipeline(None), "all", snapshot="s", version=1)


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        ({"engine": "kafka", "input": "a", "output": "b", "dead_letter": "c"}, "bootstrap_servers"),
        ({"input": "a", "output": "a", "dead_letter": "c"}, "three different streams"),
        ({"input": "a b", "output": "b", "dead_letter": "c"}, "'a b': use 1 to 200 of"),
        (
            {"input": "a", "output": "b", "dead_letter": "c", "bootstrap_servers": "k:9092"},
            "bootstrap_servers is for engine kafka",
        ),
    ],
)
def test_stream_config_errors(stream: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _pipeline(stream)


def test_kubernetes_runner_creates_then_rolls_the_scorer_after_a_deploy() -> None:
    from kubernetes.client.exceptions import ApiException

    from trainyard.k8s.apply import ensure_scorer
    from trainyard.k8s.objects import VERSION_ANNOTATION

    class Apps:
        """The AppsV1Api calls ensure_scorer makes, against a dict."""

        def __init__(self) -> None:
            self.objects: dict[str, Any] = {}
            self.patches: list[dict[str, Any]] = []

        def read_namespaced_deployment(self, name: str, ns: str) -> Any:
            if name not in self.objects:
                raise ApiException(status=404)
            return self.objects[name]

        def create_namespaced_deployment(self, ns: str, body: Any) -> Any:
            self.objects[body.metadata.name] = body
            return body

        def patch_namespaced_deployment(self, name: str, ns: str, body: Any) -> Any:
            self.patches.append(body)
            return self.objects[name]

    profile = k8s.load_cluster_profile(ROOT / "deploy" / "cluster_profile.yaml")
    apps = Apps()
    cfg = _pipeline(KAFKA)
    assert ensure_scorer(apps, profile, cfg, 2) == (
        "scorer Deployment scorer-transactions created (6 replicas)"
    )
    created = apps.objects["scorer-transactions"]
    assert k8s.validate_object(created) == []
    assert created.spec.template.metadata.annotations[VERSION_ANNOTATION] == "2"
    assert ensure_scorer(apps, profile, cfg, 3).endswith("rolled (6 replicas)")
    (patch,) = apps.patches
    assert patch["spec"]["replicas"] == 6
    assert patch["spec"]["template"].metadata.annotations[VERSION_ANNOTATION] == "3"


HOSTILE_KEYS = ["t-1", 'q"uote', "back\\slash", "new\nline", "tab\t\x00nul", "ünï😀", '","']


def test_encode_scores_writes_what_orjson_writes() -> None:
    """Each score document is byte for byte what orjson.dumps writes for it, for every
    control character, quote, backslash and non-ASCII key and every awkward float."""
    scores = [0.5, 1e-05, 0.999999999, 0.0, 1.0, 3.25e-300, 0.1]
    classes: list[int | None] = [1, 0, 1, 0, 1, None, 7]
    sources = [f"1795-{i}" for i in range(len(scores))]
    outs = encode_scores(HOSTILE_KEYS, sources, scores, classes, 12)
    for o, key, s, c, src in zip(outs, HOSTILE_KEYS, scores, classes, sources, strict=True):
        assert o.key == key
        doc = {"id": key, "score": s, "class_id": c, "version": 12, "source": src}
        assert orjson.loads(o.value) == doc
        assert list(orjson.loads(o.value)) == list(doc)
    rng = random.Random(7)
    keys = HOSTILE_KEYS + [chr(c) for c in range(0x80)] + ["", "x" * 5000, "\\u00e9"]
    for _ in range(300):
        chars = (rng.choice([rng.randrange(0x20), rng.randrange(0x20, 0x110000)]) for _ in "12345")
        keys.append("".join(chr(c) for c in chars if not 0xD800 <= c < 0xE000))
    floats = [0.5, 1e-05, 0.1 + 0.2, 5e-324, 1e16, 1e22, 123456789.0, -0.0, 1.7976931348623157e308]
    floats += [float("nan"), float("inf"), -float("inf"), 3.7e-44]
    scores = [rng.choice(floats) if rng.random() < 0.2 else rng.random() for _ in keys]
    classes = [rng.choice([None, 0, 1, -3, 2**62]) for _ in keys]
    sources = [f"{rng.randrange(1 << 45)}-{i}" if i % 3 else f"t/{i}/é" for i, _ in enumerate(keys)]
    for version in (1, 0, 2**40):
        outputs = encode_scores(keys, sources, scores, classes, version)
        docs = zip(keys, scores, classes, sources, strict=True)
        assert [o.value for o in outputs] == [
            orjson.dumps({"id": k, "score": s, "class_id": c, "version": version, "source": src})
            for k, s, c, src in docs
        ]


def test_encode_scores_non_finite_and_per_row_versions() -> None:
    # a key column that is not a string (an int64 id): numbers, as orjson writes them
    outs = encode_scores([7, 2**40], ["1-0", "1-1"], [0.5, 0.25], [1, 0], 3)
    assert [o.value for o in outs] == [
        orjson.dumps({"id": k, "score": s, "class_id": c, "version": 3, "source": src})
        for k, s, c, src in [(7, 0.5, 1, "1-0"), (2**40, 0.25, 0, "1-1")]
    ]
    outs = encode_scores(["a", "b"], ["1-0", "1-1"], [float("nan"), 0.5], [None, 1], 3)
    assert orjson.loads(outs[0].value)["score"] is None
    assert orjson.loads(outs[1].value) == {
        "id": "b", "score": 0.5, "class_id": 1, "version": 3, "source": "1-1"
    }  # fmt: skip
    outs = encode_scores(["a", "b"], ["1-0", "1-1"], [0.25, 0.5], [0, 1], [3, 4])
    assert [orjson.loads(o.value)["version"] for o in outs] == [3, 4]


@pytest.mark.parametrize(
    ("scoring", "message"),
    [
        ({"claim_idle_s": float("inf")}, "claim_idle_s"),
        ({"request_timeout_s": float("inf")}, "request_timeout_s"),
        ({"request_timeout_s": float("nan")}, "request_timeout_s"),
        ({"claim_idle_s": 10**9}, "claim_idle_s"),
        # fewer than 2 would dead-letter a record the scorer never tried alone
        ({"max_deliveries": 1}, "max_deliveries"),
    ],
)
def test_scoring_times_and_counts_must_be_sane(scoring: dict[str, Any], message: str) -> None:
    raw = _pipeline(None).model_dump(mode="json")
    raw["scoring"].update(scoring)
    with pytest.raises(ValueError, match=message):
        PipelineConfig.model_validate(raw)


@pytest.mark.parametrize(
    "flags",
    [
        ["--report-s", "0"],
        ["--report-s", "-1"],
        ["--report-s", "nan"],
        ["--max-records", "-5"],
        ["--exit-when-idle", "nan"],
        ["--exit-when-idle", "inf"],
    ],
)
def test_score_stream_refuses_bad_flags(flags: list[str], capsys: pytest.CaptureFixture) -> None:
    from trainyard.streaming.score_stream import cli_main

    assert cli_main(["--pipeline", "transactions", *flags]) == 2
    assert flags[0] in capsys.readouterr().err


def test_redis_errors_hide_the_password_and_name_a_bad_url() -> None:
    from trainyard.streaming.engines import RedisStreams

    with pytest.raises(StreamError) as e:
        RedisStreams("redis://:secretpw@127.0.0.1:1/0", STREAMS, deadline_s=2)
    assert "secretpw" not in str(e.value) and "redis://***@127.0.0.1:1/0" in str(e.value)
    with pytest.raises(StreamError, match="redis URL 'garbage'"):
        RedisStreams("garbage", STREAMS)


def test_model_unreachable_names_the_server_a_restarted_scorer_waits_for() -> None:
    """Found by a cold user: ``score-stream --restart`` said only "scorer running" while
    the model server was down; it now warns, saying what the scorer reads meanwhile."""
    from tests.support.ports import free_port
    from trainyard.config import load_pipeline

    cfg = load_pipeline("digits")
    port = free_port()  # nothing listens there
    down = cfg.model_copy(update={"serving": cfg.serving.model_copy(update={"port": port})})
    why = model_unreachable(down, timeout_s=2)
    assert why is not None and why.startswith(f"model server {cfg.serving.host}:{port}: ")
    assert "Connection refused" in why or "ConnectionRefusedError" in why
    # found by another: the warning said "reading nothing" of a scorer that reads a window
    window = 2 * cfg.scoring.max_in_flight + 1
    assert waiting_for_the_model(cfg) == (
        f"the scorer reads at most {window * cfg.scoring.batch_size} records ({window} "
        f"batches of {cfg.scoring.batch_size}), waits for the server and leaves the rest "
        "in the stream"
    )


def test_the_status_rate_is_the_current_one_not_the_lifetime_average() -> None:
    """Found by a cold user: ``records_per_s`` was the average since the start, so an idle
    scorer reported a rate that decayed slowly instead of 0."""
    import time

    from trainyard.streaming.scorer import Stats

    stats = Stats(started=time.time() - 10, scored=1000)
    first = stats.doc()
    assert 99 <= first["records_per_s"] <= 100 and 99 <= first["average_records_per_s"] <= 100
    time.sleep(0.2)
    idle = stats.doc()  # nothing scored since the last report
    assert idle["records_per_s"] == 0 and idle["average_records_per_s"] > 90
    time.sleep(0.2)
    stats.scored += 200
    busy = stats.doc()
    assert busy["records_per_s"] > 500 and busy["average_records_per_s"] < 130


def test_a_dead_letter_keeps_bytes_that_are_not_utf8() -> None:
    """Found by a cold user: a record with invalid UTF-8 was dead-lettered with U+FFFD in
    place of its bytes, so the record could not be recovered."""
    import base64

    from trainyard.streaming.scorer import MAX_DEAD_VALUE_BYTES, dead_letter

    raw = b'{"txn_id": "utf\xff\xfe", "amount": 1}'
    doc = orjson.loads(dead_letter(None, "1-0", "not UTF-8", raw).value)
    assert base64.b64decode(doc["value_base64"]) == raw and "\ufffd" in doc["value"]
    # valid UTF-8 cut in the middle of a character is not taken for invalid
    cut = b'{"v": "' + "é".encode() * MAX_DEAD_VALUE_BYTES + b'"}'
    doc = orjson.loads(dead_letter("k", "1-0", "too big", cut).value)
    assert "value_base64" not in doc and doc["value_bytes"] == len(cut)
    assert doc["value"].endswith("é") and "\ufffd" not in doc["value"]
