"""MLflow as a sink (LOG.MLFLOW_URI, LOG.MLFLOW_EXPERIMENT): one MLflow run per OUTPUT_DIR, continued across resumes.

A `file:` folder or a `sqlite:///` file needs no server (MLflow keeps its file store in maintenance and asks
for an opt-in, given here for `file:` URIs: the user named one); an `http(s)://` server works as well.
"""
from __future__ import annotations

import logging
import os
import time
import warnings

from runner.errors import UserError, one_line

# An unreachable server is found in seconds, not after MLflow's minutes of retries (the user's values win)
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")

from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from runner.trackers import Tracker as BaseTracker  # noqa: E402
from runner.trackers import flat_config, group_name, logged_rows, run_name  # noqa: E402

# MLflow reports its database migrations at INFO on stderr, and its SQLAlchemy use warns of deprecations:
# a run's console carries only its own lines
for _name in ("mlflow", "alembic"):
    logging.getLogger(_name).setLevel(logging.WARNING)
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"mlflow(\.|$)")

# MLflow's limits per log_batch call
_METRICS_PER_BATCH = 1000
_PARAMS_PER_BATCH = 100
_clients: dict[str, MlflowClient] = {}


def client(uri: str) -> MlflowClient:
    """One client per URI for the process (the start check opens the store; the run reuses it)."""
    if uri not in _clients:
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        _clients[uri] = MlflowClient(tracking_uri=uri)
    return _clients[uri]


def check(cfg) -> None:
    """Open the store now: a URI that cannot be opened is a user mistake (exit 2), before the run claims anything."""
    uri = cfg.LOG.MLFLOW_URI
    try:
        client(uri).search_experiments(max_results=1)
    except Exception as e:  # sqlalchemy, OS and HTTP errors alike
        _clients.pop(uri, None)
        raise UserError(f"LOG.MLFLOW_URI {uri!r} cannot be opened ({type(e).__name__}: "
                        f"{one_line(str(e)).splitlines()[0][:200]}); give a file:/folder, a sqlite:////path.db "
                        "whose folder exists, or an http(s):// MLflow server that answers") from None


class Tracker(BaseTracker):
    """One MLflow run: every scalar at its step, the config as parameters, the results at the end."""

    name = "mlflow"
    label = "MLflow"

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
        return {"id": self.run_id, "uri": self.cfg.LOG.MLFLOW_URI}

    def _experiment(self) -> str:
        """The id of LOG.MLFLOW_EXPERIMENT (default: OUTPUT_DIR's parent folder), made when missing."""
        name = self.cfg.LOG.MLFLOW_EXPERIMENT or group_name(self.out)
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
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
        """FINISHED when the run completed; KILLED when it stopped (a resume sets it running again)."""
        self.client.set_terminated(self.run_id, status="FINISHED" if done else "KILLED")
