"""MLflow as a sink (LOG.MLFLOW_URI, LOG.MLFLOW_EXPERIMENT): one MLflow run per OUTPUT_DIR, continued across resumes.

A `file:` folder (or a plain path) or a `sqlite:///` file needs no server (MLflow keeps its file store in
maintenance and asks for an opt-in, given here for those: the user named one); an `http(s)://` server works as
well. The run's config.yaml and results.json are its artifacts (beside a sqlite file: its folder's mlartifacts/).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import tempfile
import time
import urllib.parse
import warnings
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from runner.errors import UserError, one_line
from runner.rundir import layout
from runner.sinks.base import SinkContext
from runner.sinks.tracker import TrackerSink, flat_config, group_name, logged_rows, run_name

log = logging.getLogger("runner")

# The first contact (check) gives up in seconds: a server that does not answer, or a database that cannot be
# opened, is a user mistake said at once. The user's own values of these variables win.
_FIRST_CONTACT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
# While the run logs, a server that stalls a while is waited for, but not for MLflow's minutes of retries
_WHILE_LOGGING = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")  # the SQLAlchemy stores MLflow opens (scheme[+driver])


@functools.cache
def _user_set() -> frozenset[str]:
    """The HTTP variables the user set (their values win), as found before this module first sets any."""
    return frozenset(k for k in _FIRST_CONTACT if k in os.environ)


def _settle() -> None:
    """This process's MLflow settings, made when the sink is checked or built (importing this module sets
    nothing): the logging HTTP limits (a user's own values kept), and MLflow's chatter off the console."""
    _user_set()  # the user's values, known before any of ours is set
    for key, value in _WHILE_LOGGING.items():
        os.environ.setdefault(key, value)
    # MLflow reports its database migrations at INFO on stderr, and its SQLAlchemy use warns of deprecations:
    # a run's console carries only its own lines
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"mlflow(\.|$)")


# MLflow's limits per log_batch call
_METRICS_PER_BATCH = 1000
_PARAMS_PER_BATCH = 100
_clients: dict[str, MlflowClient] = {}


def client(uri: str) -> MlflowClient:
    """One client per URI for the process (the start check opens the store; the run reuses it)."""
    if uri not in _clients:
        if local_store(uri)[0] == "folder":
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        _clients[uri] = MlflowClient(tracking_uri=uri)
    return _clients[uri]


def scheme(uri: str) -> str:
    """The URI's scheme without a driver (postgresql+psycopg2 -> postgresql); '' for a plain path."""
    found = urllib.parse.urlparse(uri).scheme
    return "" if len(found) == 1 else found.split("+")[0].lower()  # one letter: a Windows drive


def local_store(uri: str) -> tuple[str, Path | None]:
    """('sqlite', the database file) or ('folder', the file store's folder) for a store on this machine;
    ('database' or 'server', None) otherwise (an in-memory sqlite counts as a database)."""
    kind = scheme(uri)
    if kind == "sqlite":
        path = uri.split(":///", 1)[1] if ":///" in uri else ""
        path = path.split("?", 1)[0]
        return ("sqlite", Path(path)) if path and path != ":memory:" else ("database", None)
    if kind in _DATABASES:
        return "database", None
    if kind in ("", "file"):
        from mlflow.utils.file_utils import local_file_uri_to_path

        return "folder", Path(local_file_uri_to_path(uri))
    return "server", None


def writable_folder(folder: Path) -> None:
    """Refuse (OSError) a folder that neither is nor can become a folder this process writes files into."""
    folder = folder.absolute()
    existing = next(p for p in (folder, *folder.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        raise NotADirectoryError(f"{existing} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):  # the real test: permissions, read-only mounts, root alike
            pass
    except OSError as e:
        raise PermissionError(f"the folder {existing} is not writable ({e.strerror or e})") from None


def check_local(uri: str) -> None:
    """A store on this machine: its folder is writable, a sqlite file opens as a database (one try: MLflow's
    own first open retries for 100 s, and prints a warning per try)."""
    kind, path = local_store(uri)
    if kind == "folder":
        if path.exists() and not path.is_dir():
            raise NotADirectoryError(f"{path} is a file, not a folder")
        writable_folder(path)
    elif kind == "sqlite":
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a folder, not a database file")
        writable_folder(path.parent)
    if kind in ("sqlite", "database"):
        import sqlalchemy

        engine = sqlalchemy.create_engine(uri)
        try:
            with engine.connect() as connection:
                sqlalchemy.inspect(connection).get_table_names()
        finally:
            engine.dispose()


@contextlib.contextmanager
def first_contact():
    """HTTP requests that give up in seconds, and MLflow's warnings kept off the console, for the check."""
    saved = {k: os.environ.get(k) for k in _FIRST_CONTACT}
    os.environ.update({k: v for k, v in _FIRST_CONTACT.items() if k not in _user_set()})
    mlflow_log = logging.getLogger("mlflow")
    level = mlflow_log.level
    mlflow_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        mlflow_log.setLevel(level)
        os.environ.update({k: v for k, v in saved.items() if v is not None})


def check(cfg) -> None:
    """Open the store now: a URI that cannot be opened is a user mistake (exit 2), before the run claims anything."""
    uri = cfg.LOG.MLFLOW_URI
    _settle()
    try:
        with first_contact():
            check_local(uri)
            client(uri).search_experiments(max_results=1)
    except Exception as e:  # sqlalchemy, OS and HTTP errors alike
        _clients.pop(uri, None)
        raise UserError(f"LOG.MLFLOW_URI {uri!r} cannot be opened ({type(e).__name__}: "
                        f"{one_line(str(e)).splitlines()[0][:200]}); give a file:/folder, a sqlite:////path.db "
                        "in a writable folder, or an http(s):// MLflow server that answers") from None


def experiment_name(out: Path) -> str:
    """The default experiment: OUTPUT_DIR's parent folder (a sweep's folder: its points together); a run right
    in output/ (the default OUTPUT_DIRs of top-level configs) gets its own folder's name, not 'output'."""
    parent = group_name(out)
    return Path(out).resolve().name if parent == "output" else parent


def artifact_root(uri: str) -> str | None:
    """Where a new experiment keeps artifacts: beside a sqlite file, in its folder's mlartifacts/ (MLflow's
    default is ./mlartifacts of whatever folder the run started in); None: the store's own default."""
    kind, path = local_store(uri)
    return (path.resolve().parent / "mlartifacts").as_uri() if kind == "sqlite" else None


class MlflowSink(TrackerSink):
    """One MLflow run: every scalar at its step, the config as parameters, the results at the end."""

    name = "mlflow"
    label = "MLflow"
    artifact_warned = False  # set on the first artifact that cannot be logged

    def same_store(self, earlier: dict) -> bool:
        """The run id in trackers.json is only meaningful in the store it was made in."""
        return earlier.get("uri") == self.cfg.LOG.MLFLOW_URI

    def start(self, earlier: dict) -> dict:
        """A new run in the experiment, or `earlier`'s run set running again; the config as its parameters."""
        self.client = client(self.cfg.LOG.MLFLOW_URI)
        if earlier:
            self.run_id = earlier["id"]
            self.client.update_run(self.run_id, status="RUNNING")
            logged = self.client.get_run(self.run_id).data.params
            # the store says what it holds (every row logs `epoch`): a kill between a send and trackers.json's
            # update, or during the checkpoint's save, leaves it apart from trackers.json's step
            held = max((m.step for m in self.client.get_metric_history(self.run_id, "epoch")), default=0)
            self.send([row for row in logged_rows(self.out, self.resume_step) if row[0] > held])
            self.sent = max(held, self.resume_step)
        else:
            tags = {"runner.output_dir": str(self.out.resolve()), **{k: str(v) for k, v in self.params.items()}}
            run = self.client.create_run(self._experiment(), run_name=run_name(self.out), tags=tags)
            self.run_id, logged = run.info.run_id, {}
        # MLflow never changes a logged parameter: a resume with a new resume-safe value keeps the first one
        params = [Param(k, str(v)) for k, v in flat_config(self.cfg).items() if k not in logged]
        for i in range(0, len(params), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + _PARAMS_PER_BATCH])
        experiment = self.client.get_experiment(self.client.get_run(self.run_id).info.experiment_id).name
        log.info("MLflow: experiment %r, run %s at %s", experiment, self.run_id, self.cfg.LOG.MLFLOW_URI)
        self.artifact(layout.CONFIG)
        return {"id": self.run_id, "uri": self.cfg.LOG.MLFLOW_URI}

    def artifact(self, name: str) -> None:
        """OUTPUT_DIR/<name> as a run artifact; a failure warns once (for all artifacts) and the run logs on."""
        try:
            self.client.log_artifact(self.run_id, str(self.out / name))
        except Exception as e:  # the artifact store is not the tracking store: metrics still go in
            if not self.artifact_warned:
                self.artifact_warned = True
                log.warning("MLflow: logging the artifact %s failed (%s: %s); the run goes on, its metrics are "
                            "still logged", name, type(e).__name__, one_line(str(e)).strip()[:200])

    def _experiment(self) -> str:
        """The id of LOG.MLFLOW_EXPERIMENT (default: experiment_name), made when missing."""
        name = self.cfg.LOG.MLFLOW_EXPERIMENT or experiment_name(self.out)
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=artifact_root(self.cfg.LOG.MLFLOW_URI))
        except Exception:  # another point of the sweep made it first
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def send(self, rows: list[tuple[int, int, dict]]) -> None:
        """Every scalar of the rows, and the epoch, at its step."""
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for step, epoch, scalars in rows
                   for k, v in [*scalars.items(), ("epoch", epoch)]]
        for i in range(0, len(metrics), _METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + _METRICS_PER_BATCH])

    def summary(self, results: dict) -> None:
        """The best values (no curve of their own) at the last step; the final val/* are their curves' last
        points already, so logging them again would give that step twice. Every result is a tag as well."""
        now = int(time.time() * 1000)
        best = [Metric(k, float(v), now, self.sent) for k, v in results.items()
                if k.startswith("best/") and isinstance(v, (int, float))]
        tags = [RunTag(f"result.{k}", str(v)) for k, v in results.items()]
        self.client.log_batch(self.run_id, metrics=best, tags=tags)

    def end(self, done: bool) -> None:
        """results.json as an artifact and FINISHED when the run completed; KILLED when it stopped (a resume sets
        it running again)."""
        if done and layout.path(self.out, layout.RESULTS).is_file():
            self.artifact(layout.RESULTS)
        self.client.set_terminated(self.run_id, status="FINISHED" if done else "KILLED")


def open_sink(ctx: SinkContext) -> MlflowSink | None:
    """The MLflow sink of this run (its process settings made first); None when its run cannot start."""
    _settle()
    return MlflowSink.open(ctx)
