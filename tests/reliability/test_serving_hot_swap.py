"""Hot swap under continuous load from a second process: not one request may fail.

The server follows its model config file, as the deploy step drives it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.serving import IMAGE_SPEC, build_image_model
from trainyard.serving.client import ServingClient
from trainyard.serving.deploy import (
    ensure_local_server,
    publish_version,
    stop_local_server,
    unpublish_version,
    wait_available,
    wait_unloaded,
)
from trainyard.serving.model_config import set_served

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"

# The load generator: 3 threads, each with its own keep-alive connection, post single- and
# multi-row requests in both formats until the stop file appears. Every answer's class id
# tells which version served it (each version predicts one constant class). Timelines are
# per connection: requests on one connection are sequential, so its timeline shows the
# order in which the server switched; across threads a request begun before a swap may
# legitimately finish after another thread's first answer from the new version.
LOAD = r"""
import json, sys, threading, time
from pathlib import Path
import numpy as np
from trainyard.serving.client import ServingClient
from trainyard.serving.model_config import set_served

port, stop, out = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
lock = threading.Lock()
seen, failures, total = {}, [], [0]
timelines = {i: [] for i in range(3)}

def run(i):
    rng = np.random.default_rng(i)
    client = ServingClient("127.0.0.1", port, timeout=30)
    while not stop.exists():
        rows = int(rng.integers(1, 5))
        imgs = rng.random((rows, 8, 8, 1)).tolist()
        try:
            if i % 2:
                got = [r["class_id"] for r in client.predict("digits", instances=imgs)]
            else:
                got = client.predict("digits", inputs={"image": imgs})["class_id"]
            if len(got) != rows or len(set(got)) != 1:
                raise ValueError(f"unexpected answer {got}")
        except Exception as e:
            with lock:
                failures.append(f"{type(e).__name__}: {e}")
            client.close()
            continue
        with lock:
            total[0] += 1
            seen[got[0]] = seen.get(got[0], 0) + 1
            timeline = timelines[i]
            if not timeline or timeline[-1] != got[0]:
                timeline.append(got[0])

threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
for t in threads:
    t.start()
Path(str(out) + ".started").write_text("1")
for t in threads:
    t.join()
out.write_text(json.dumps({"seen": seen, "failures": failures[:20], "n_failures": len(failures),
                           "total": total[0], "timelines": list(timelines.values())}))
"""


@pytest.fixture
def server(tmp_path: Path):
    models = tmp_path / "models"
    for v in (1, 2, 3):
        build_image_model(models / str(v), seed=v, bias_class=v)
    root = tmp_path / "serving"
    publish_version(models / "1", root, "digits", 1, IMAGE_SPEC)
    set_served(root, "digits", [1], {"stable": 1})
    port = free_port()
    ensure_local_server(root, "127.0.0.1", port)
    yield models, root, port
    stop_local_server(root)


def test_hot_swap_and_rollback_under_load_fail_no_request(server, tmp_path: Path):
    models, root, port = server
    client = ServingClient("127.0.0.1", port)
    wait_available(client, "digits", 1, 60)
    stop, out = tmp_path / "stop", tmp_path / "load.json"
    env = {**os.environ, "PYTHONPATH": str(PLUGINS)}
    load = subprocess.Popen([sys.executable, "-c", LOAD, str(port), str(stop), str(out)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not Path(str(out) + ".started").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        publish_version(models / "2", root, "digits", 2, IMAGE_SPEC)
        set_served(root, "digits", [2], {"stable": 2})
        wait_available(client, "digits", 2, 60)
        states_after_swap = [(e["version"], e["state"]) for e in client.status("digits")]
        time.sleep(1.0)
        publish_version(models / "3", root, "digits", 3, IMAGE_SPEC)
        set_served(root, "digits", [3], {"stable": 3})
        wait_available(client, "digits", 3, 60)
        time.sleep(1.0)
        set_served(root, "digits", [2], {"stable": 2})  # rollback
        unpublish_version(root, "digits", 3)
        wait_unloaded(client, "digits", 3, 60)
        wait_available(client, "digits", 2, 60)
        time.sleep(1.0)
    finally:
        stop.write_text("stop")
        load.wait(timeout=60)
    result = json.loads(out.read_text())
    assert result["n_failures"] == 0, result["failures"]
    assert set(result["seen"]) == {"1", "2", "3"}, result
    for timeline in result["timelines"]:
        assert timeline == [1, 2, 3, 2], result
    assert result["total"] > 100, result
    assert states_after_swap == [("2", "AVAILABLE"), ("1", "END")]
    log = (root / f".server-{port}.log").read_text()
    for v in (1, 2, 3):
        assert f"model digits version {v} AVAILABLE" in log
    client.close()
