"""``python -m trainyard score-stream``: score a pipeline's stream, supervise, or restart.

``--pipeline P`` runs the scorer in this process (:mod:`~trainyard.streaming.scorer`);
``--supervise`` runs it as a child that is started again when it dies
(:mod:`~trainyard.streaming.supervisor`); ``--restart`` starts (or restarts) the
pipeline's detached, supervised scorer as the deploy step does
(:mod:`~trainyard.streaming.local_scorer`).
"""

from __future__ import annotations

import http.client
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from trainyard.argtypes import ArgumentParser, positive_float, positive_int
from trainyard.config import PipelineConfig, load_pipeline
from trainyard.settings import serving_endpoint
from trainyard.streaming.local_scorer import (
    LOG_FILE,
    local_scorer_pids_text,
    scorer_dir,
    start_local_scorer,
)
from trainyard.streaming.model_endpoint import ModelEndpoint
from trainyard.streaming.scorer import build_scorer
from trainyard.streaming.supervisor import STALE_AFTER_REPORTS, supervise, supervisor_gone

log = logging.getLogger("trainyard.streaming")


def model_unreachable(cfg: PipelineConfig, timeout_s: float = 5.0) -> str | None:
    """Why the pipeline's model server cannot score now (down, or no version served), or None."""
    where = serving_endpoint(cfg)
    endpoint = ModelEndpoint(where.host, where.port, cfg.serving.model_name, timeout_s=timeout_s)
    try:
        endpoint.resolve()
    except (OSError, http.client.HTTPException, LookupError) as e:
        return f"model server {where.address}: {type(e).__name__}: {e}"
    finally:
        endpoint.close()
    return None


def waiting_for_the_model(cfg: PipelineConfig) -> str:
    """What a scorer does while its model server does not answer (back-pressure)."""
    sc = cfg.scoring
    batches = 2 * sc.max_in_flight + 1
    return (
        f"the scorer reads at most {batches * sc.batch_size} records ({batches} batches of "
        f"{sc.batch_size}), waits for the server and leaves the rest in the stream"
    )


def cli_main(argv: list[str]) -> int:
    """``python -m trainyard score-stream --pipeline P [...]``.

    Returns:
        0 when stopped (SIGTERM) or done; 1 when it gave up (``--exit-when-idle`` with the
        model server failing: what it read stays pending) or its supervisor died, and on a
        trainyard error (the message names it).
    """
    parser = ArgumentParser(
        prog="python -m trainyard score-stream",
        description="Score a pipeline's input stream with its served champion.",
    )
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--consumer", help="member name in the group (default host-pid)")
    parser.add_argument("--status-file", type=Path, help="write progress and lag here (JSON)")
    parser.add_argument(
        "--report-s", type=positive_float, default=5.0, help="report every N seconds"
    )
    parser.add_argument("--max-records", type=positive_int, help="stop after reading N records")
    parser.add_argument(
        "--exit-when-idle",
        type=positive_float,
        metavar="S",
        help="stop after S seconds with nothing read and nothing in flight (exit 0); "
        "with batches in flight, after S seconds with nothing read or scored while the "
        "model server fails: exit 1, what was read left pending for the next scorer",
    )
    parser.add_argument(
        "--supervise",
        action="store_true",
        help="run the scorer as a child process, restarting it when it dies",
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        help="start or restart the pipeline's supervised scorer in the background, as the "
        "deploy step does (a running scorer keeps the contract and config it started with)",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if args.restart:
        pid = start_local_scorer(args.pipeline)
        pids = local_scorer_pids_text(args.pipeline, pid)
        print(f"scorer running ({pids}); log {scorer_dir(args.pipeline) / LOG_FILE}")
        cfg = load_pipeline(args.pipeline)
        if why := model_unreachable(cfg):
            print(f"warning: {why}: {waiting_for_the_model(cfg)}", file=sys.stderr)
        return 0
    if args.supervise:
        child = [a for a in argv if a != "--supervise"]
        cmd = [sys.executable, "-m", "trainyard", "score-stream", *child]
        stale = STALE_AFTER_REPORTS * args.report_s
        return supervise(cmd, status_file=args.status_file, stale_after_s=stale)
    scorer = build_scorer(args.pipeline, args.consumer, args.status_file, args.report_s)

    def _term(signum: int, _frame: Any) -> None:
        if why := supervisor_gone():  # PR_SET_PDEATHSIG: nobody asked it to stop
            log.error("signal %d: %s; finishing what is in flight, then exiting", signum, why)
            scorer.fail(why)
            return
        log.info("signal %d: finishing what is in flight, then exiting", signum)
        scorer.stop.set()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    if why := supervisor_gone():  # it died before the death signal was set up
        log.error("%s", why)
        scorer.fail(why)
    log.info(
        "scoring %s: %s %s -> %s (dead letters %s), group %s as %s, model %s at %s:%d",
        args.pipeline,
        scorer.engine.name,
        scorer.engine.streams.input,
        scorer.engine.streams.output,
        scorer.engine.streams.dead_letter,
        scorer.engine.streams.group,
        scorer.engine.consumer,
        scorer.endpoint.model,
        scorer.endpoint.host,
        scorer.endpoint.port,
    )
    try:
        scorer.run(args.max_records, args.exit_when_idle)
    finally:
        scorer.engine.close()
    return 1 if scorer.error else 0
