"""trainyard in the Airflow UI: an Airflow 3 plugin with pages per run and per pipeline.

* ``fastapi_apps``: an app mounted at ``/trainyard`` on Airflow's API server:

  ============================================  ===========================================
  ``/trainyard/runs/<dag_id>/<run_id>``          the run's story (HTML)
  ``/trainyard/pipelines/<dag_id>``              versions over time (HTML)
  ``/trainyard/datadocs/<dag_id>/<snap>/<f>``    a file of the snapshot's ``validation/``
  ``/trainyard/api/runs/<dag_id>/<run_id>``      the run's story (JSON)
  ``/trainyard/api/pipelines/<dag_id>``          the pipeline's story (JSON)
  ============================================  ===========================================

  Every route depends on Airflow's own ``requires_access_dag`` (read access to the DAG's
  runs, for the DAG id in the path): the JWT from the UI's cookie or a bearer token,
  checked by the configured auth manager. Anonymous requests get 401, unauthorised ones
  403. Files are served only from inside the snapshot's ``validation/`` folder under the
  volume root (``..``, absolute paths and links leading out answer 404).
* ``external_views``: the run page as a tab of every DAG run ("trainyard run"), the
  pipeline page as a tab of every DAG ("trainyard versions").
* ``listeners``: when a trainyard run ends, its note is set to the one-line summary
  (:func:`trainyard.runview.summary_line`). Airflow 3.3's Task SDK gives tasks no way to
  write a run's note (the execution API sets one only when triggering a new run), so the
  scheduler-side DAG run listener writes it, from the steps' XComs, in the scheduler's own
  session; a note a person wrote is never replaced.
* lineage: with OpenLineage on, its ``http`` transport gets a total deadline per event
  (:mod:`.lineage_transport`).

Nothing heavy is imported when the plugin loads (every Airflow process loads plugins): the
FastAPI app is built on its first request.
"""

# no ``from __future__ import annotations``: FastAPI reads the route functions' annotations,
# which name classes imported inside build_app()
import contextlib
import logging
import mimetypes
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

log = logging.getLogger("trainyard.orchestration.ui")

URL_PREFIX = "/trainyard"
NOTE_MARK = "trainyard: "
"""Notes this plugin writes start so; a run's note without it was written by a person."""
SERVED_SUFFIXES = {".html", ".json", ".css", ".js", ".png", ".svg", ".txt"}
PAGE_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
)
DOCS_CSP = "sandbox allow-scripts allow-popups"
"""Data Docs embed values from the data: served sandboxed (an opaque origin without
Airflow's cookies), their own scripts allowed so the page renders. No ``frame-ancestors``:
a sandboxed document's ``'self'`` matches no ancestor, and the page opens in the UI's
iframe."""


def confined_file(root: Path, base: Path, relative: str) -> Path:
    """The file ``base/relative`` if it really is inside ``base`` and the volume root.

    Args:
        root: The volume root.
        base: The folder files may come from (below ``root``).
        relative: The requested path below ``base`` (from the URL).

    Returns:
        The resolved file path.

    Raises:
        FileNotFoundError: If the path is empty, absolute, has ``.``/``..`` parts, does
            not exist, is not a regular file, or resolves (through links) outside ``base``
            or ``root``, or has a suffix that is not served.
    """
    parts = relative.split("/")
    if not relative or relative.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise FileNotFoundError(relative)
    if "\x00" in relative or "\\" in relative:
        raise FileNotFoundError(relative)
    real_root = root.resolve()
    try:
        real_base = base.resolve(strict=True)
        real = (base / relative).resolve(strict=True)
    except (OSError, RuntimeError) as e:
        raise FileNotFoundError(relative) from e
    if not real_base.is_relative_to(real_root) or not real.is_relative_to(real_base):
        raise FileNotFoundError(relative)
    if not real.is_file() or real.suffix.lower() not in SERVED_SUFFIXES:
        raise FileNotFoundError(relative)
    return real


def _dataset(pipeline: str, root: Path) -> str:
    from trainyard.config import load_pipeline
    from trainyard.errors import ConfigError
    from trainyard.runview import NotFound, _versions

    for meta in _versions(root, pipeline):
        if meta.get("dataset"):
            return str(meta["dataset"])
    try:
        return load_pipeline(pipeline).dataset
    except ConfigError:
        raise NotFound(f"unknown pipeline {pipeline!r}") from None


@cache
def build_app() -> Any:
    """The plugin's FastAPI app, every route behind Airflow's DAG authorisation.

    Returns:
        The FastAPI app (mounted by Airflow at :data:`URL_PREFIX`).
    """
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag
    from fastapi import Depends, FastAPI, HTTPException, Request
    from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

    from trainyard import runview
    from trainyard.errors import ConfigError
    from trainyard.layout import Layout
    from trainyard.serving.status import server_answer
    from trainyard.settings import get_settings

    app = FastAPI(title="trainyard", docs_url=None, redoc_url=None, openapi_url=None)
    read_runs = [Depends(requires_access_dag("GET", DagAccessEntity.RUN))]
    headers = {"Content-Security-Policy": PAGE_CSP, "X-Content-Type-Options": "nosniff"}

    def prefix(request: Request) -> str:
        return str(request.scope.get("root_path") or URL_PREFIX).rstrip("/")

    def story_of_run(dag_id: str, run_id: str) -> tuple[str, Path, dict[str, Any]]:
        if "\x00" in dag_id or "\x00" in run_id:  # no run has one; the database refuses it
            raise runview.NotFound(f"no run {run_id!r} of {dag_id!r}")
        root = get_settings().volume_root
        pipeline = runview.pipeline_of(dag_id)
        results = results_from_db(dag_id, run_id)
        return pipeline, root, runview.run_story(root, pipeline, run_id, results)

    @app.exception_handler(runview.NotFound)
    async def not_found(request: Request, exc: runview.NotFound) -> Any:
        if request.url.path.startswith(f"{prefix(request)}/api/"):
            return JSONResponse({"detail": str(exc)}, status_code=404)
        return HTMLResponse(runview.render_not_found(str(exc)), 404, headers=headers)

    @app.exception_handler(ConfigError)
    async def bad_input(_: Request, exc: ConfigError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.get("/runs/{dag_id}/{run_id}", dependencies=read_runs, response_class=HTMLResponse)
    def run_page(dag_id: str, run_id: str, request: Request) -> HTMLResponse:
        """The run's story (what Airflow knows of a run that recorded nothing)."""
        try:
            _, _, story = story_of_run(dag_id, run_id)
        except runview.NotFound:
            known = run_state_from_db(dag_id, run_id)
            if known is None:
                raise
            pipeline = runview.pipeline_of(dag_id)
            reason = runview.run_failure(get_settings().volume_root, pipeline, run_id, known[1])
            page = runview.render_unrecorded(pipeline, run_id, *known, reason)
            return HTMLResponse(page, headers=headers)
        if not story.get("summarised") and (known := run_state_from_db(dag_id, run_id)):
            story = {**story, "airflow_state": known[0], "failed": known[1]}
            story["failure"] = runview.run_failure(
                get_settings().volume_root, story["pipeline"], run_id, known[1]
            )
        base = prefix(request)
        snap = story.get("snapshot") or {}
        docs = (
            f"{base}/datadocs/{quote(dag_id, safe='')}/{quote(snap['id'], safe='')}"
            "/data_docs/index.html"
            if snap.get("data_docs")
            else None
        )
        story = {**story, "server": server_answer(story["pipeline"])}
        page = runview.render_run(story, docs, f"{base}/pipelines/{quote(dag_id, safe='')}")
        return HTMLResponse(page, headers=headers)

    @app.get("/pipelines/{dag_id}", dependencies=read_runs, response_class=HTMLResponse)
    def pipeline_page(dag_id: str, request: Request) -> HTMLResponse:
        """The pipeline's versions over time, and what its model server answers now."""
        pipeline = runview.pipeline_of(dag_id)
        story = runview.pipeline_story(get_settings().volume_root, pipeline)
        story["server"] = server_answer(pipeline)
        base = f"{prefix(request)}/runs/{quote(dag_id, safe='')}/"
        page = runview.render_pipeline(story, lambda run_id: base + quote(str(run_id), safe=""))
        return HTMLResponse(page, headers=headers)

    @app.get("/api/runs/{dag_id}/{run_id}", dependencies=read_runs)
    def run_api(dag_id: str, run_id: str) -> dict[str, Any]:
        """The run's story as JSON."""
        return story_of_run(dag_id, run_id)[2]

    @app.get("/api/pipelines/{dag_id}", dependencies=read_runs)
    def pipeline_api(dag_id: str) -> dict[str, Any]:
        """The pipeline's story as JSON, with what its model server answers now."""
        pipeline = runview.pipeline_of(dag_id)
        story = runview.pipeline_story(get_settings().volume_root, pipeline)
        return {**story, "server": server_answer(pipeline)}

    @app.get("/datadocs/{dag_id}/{snapshot_id}/{path:path}", dependencies=read_runs)
    def data_docs(dag_id: str, snapshot_id: str, path: str) -> FileResponse:
        """A file of a snapshot's validation report (Data Docs), from inside the volume."""
        root = get_settings().volume_root
        pipeline = runview.pipeline_of(dag_id)
        base = Layout(root).snapshot(_dataset(pipeline, root), snapshot_id) / "validation"
        try:
            target = confined_file(root, base, path)
        except FileNotFoundError:
            detail = f"no file {path!r} in snapshot {snapshot_id}'s report"
            raise HTTPException(404, detail) from None
        media = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        return FileResponse(
            target,
            media_type=media,
            headers={"Content-Security-Policy": DOCS_CSP, "X-Content-Type-Options": "nosniff"},
        )

    return app


class LazyApp:
    """An ASGI app that builds the real one (:func:`build_app`) on its first request."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Hand the request to the FastAPI app."""
        await build_app()(scope, receive, send)

    def __repr__(self) -> str:
        return "trainyard.orchestration.ui.LazyApp"


def results_of_run(dag_run: Any) -> dict[str, Any]:
    """The steps' results of a DAG run (their ``return_value`` XComs), by step name.

    Args:
        dag_run: The ORM DagRun, attached to the caller's session.

    Returns:
        Step name → result, for the steps that returned one.
    """
    from sqlalchemy.orm import object_session

    session = object_session(dag_run)
    if session is None:
        return {}
    return step_results(session, dag_run.dag_id, dag_run.run_id)


def run_state_from_db(dag_id: str, run_id: str) -> tuple[str, list[str]] | None:
    """A run's state and its failed tasks from Airflow's database; None for no such run."""
    if "\x00" in dag_id or "\x00" in run_id:
        return None
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalars(
            select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
        ).one_or_none()
        if run is None:
            return None
        return str(getattr(run.state, "value", run.state)), failed_tasks(run)


def results_from_db(dag_id: str, run_id: str) -> dict[str, Any]:
    """The steps' results of a run, read from Airflow's metadata database (API server).

    Args:
        dag_id: The DAG id.
        run_id: The run id.

    Returns:
        Step name → result (empty for an unknown run).
    """
    from airflow.utils.session import create_session

    with create_session() as session:
        return step_results(session, dag_id, run_id)


def step_results(session: Any, dag_id: str, run_id: str) -> dict[str, Any]:
    """Step name → the step task's ``return_value`` XCom, for the steps that returned one.

    Args:
        session: An Airflow metadata database session.
        dag_id: The DAG id.
        run_id: The run id.

    Returns:
        The results (dicts only).
    """
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    from trainyard.orchestration.graph import STEP_TASKS

    rows = session.scalars(
        select(XComModel).where(
            XComModel.dag_id == dag_id,
            XComModel.run_id == run_id,
            XComModel.key == "return_value",
            XComModel.map_index == -1,
            XComModel.task_id.in_(STEP_TASKS),
        )
    ).all()
    out = {}
    for row in rows:
        value = XComModel.deserialize_value(row)
        if isinstance(value, dict):
            out[row.task_id] = value
    return out


def note_for(dag_run: Any) -> str | None:
    """The note a finished trainyard run should carry, or None to leave it alone.

    Args:
        dag_run: The ORM DagRun.

    Returns:
        ``trainyard: <summary line>``; None for another DAG, or when a person wrote the
        note.
    """
    from trainyard.runview import DAG_PREFIX, NOTE_MAX, summary_line

    if not str(dag_run.dag_id).startswith(DAG_PREFIX):
        return None
    current = dag_run.note
    if current and not current.startswith(NOTE_MARK):
        return None
    from trainyard.runview import NotFound, approval_of, pipeline_of, run_failure
    from trainyard.settings import get_settings

    results = results_of_run(dag_run)
    failed = failed_tasks(dag_run)
    if not results and not failed:
        return None
    dry_run = bool((getattr(dag_run, "conf", None) or {}).get("dry_run"))
    reason = None
    root = get_settings().volume_root
    with contextlib.suppress(NotFound):
        pipeline = pipeline_of(str(dag_run.dag_id))
        answer = approval_of(root, pipeline, results)
        if answer is not None and answer.get("approved") is not None:
            results = {**results, "approve": answer}
        if failed:
            reason = run_failure(root, pipeline, dag_run.run_id, failed)
    return (NOTE_MARK + summary_line(results, failed, dry_run, reason))[:NOTE_MAX]


def failed_tasks(dag_run: Any) -> list[str]:
    """The run's tasks that failed themselves (not ``upstream_failed``), sorted.

    Args:
        dag_run: The ORM DagRun, attached to the caller's session.

    Returns:
        Task ids.
    """
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import select
    from sqlalchemy.orm import object_session

    session = object_session(dag_run)
    if session is None:
        return []
    rows = session.scalars(
        select(TaskInstance.task_id).where(
            TaskInstance.dag_id == dag_run.dag_id,
            TaskInstance.run_id == dag_run.run_id,
            TaskInstance.state == "failed",
        )
    ).all()
    return sorted(rows)


@contextlib.contextmanager
def _attached(dag_run: Any) -> Iterator[Any]:
    """The run attached to a session: the caller's, or a new one for a detached run.

    The scheduler's DagRun is attached to its session; ``airflow dags test`` hands the
    listener a detached one, whose note and task instances cannot be loaded there.
    """
    from sqlalchemy import inspect as sa_inspect
    from sqlalchemy import select

    if not sa_inspect(dag_run).detached:
        yield dag_run
        return
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        yield session.scalar(
            select(DagRun).where(DagRun.dag_id == dag_run.dag_id, DagRun.run_id == dag_run.run_id)
        )


class RunNoteListener:
    """Sets a finished trainyard run's note to its one-line summary (in the scheduler)."""

    @hookimpl
    def on_dag_run_success(self, dag_run: Any, msg: str) -> None:
        """A run succeeded: note what it did."""
        self._note(dag_run)

    @hookimpl
    def on_dag_run_failed(self, dag_run: Any, msg: str) -> None:
        """A run failed: note how far it got."""
        self._note(dag_run)

    @staticmethod
    def _note(dag_run: Any) -> None:
        try:
            with _attached(dag_run) as run:
                note = note_for(run) if run is not None else None
                if note:
                    run.note = note
                    log.info("run %s: note %s", run.run_id, note)
        except Exception:  # a note never breaks the scheduler
            log.exception("run %s: could not set the summary note", dag_run.run_id)


def _bound_lineage() -> None:
    """OpenLineage's HTTP transport with a total deadline (:mod:`.lineage_transport`).

    Only when lineage is on: its client is imported only then.
    """
    from airflow.providers.openlineage.conf import is_disabled

    if not is_disabled():
        from trainyard.orchestration.lineage_transport import install

        install()


_bound_lineage()


class TrainyardUIPlugin(AirflowPlugin):
    """The run and pipeline pages in Airflow's UI, and the summary note on each run."""

    name = "trainyard_ui"
    fastapi_apps = [{"app": LazyApp(), "url_prefix": URL_PREFIX, "name": "trainyard"}]
    external_views = [
        {
            "name": "trainyard run",
            "href": URL_PREFIX + "/runs/{DAG_ID}/{RUN_ID}",
            "destination": "dag_run",
            "url_route": "trainyard-run",
        },
        {
            "name": "trainyard versions",
            "href": URL_PREFIX + "/pipelines/{DAG_ID}",
            "destination": "dag",
            "url_route": "trainyard-versions",
        },
    ]
    listeners = [RunNoteListener()]
