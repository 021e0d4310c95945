"""Where scalars and log lines go: every destination of scalars is a Sink with one small interface.

Modules, imports running one way (each imports only those above it):
    logs         the console's and log.txt's handlers (every rank; log.txt on rank 0), Python's warnings too
    figures      pictures of results drawn with Pillow: the confusion matrix
    base         Sink (write, image, flush before a checkpoint, end_progress, finish when done, close), SinkContext
    jsonl        metrics.jsonl (cut at the resume step)
    tensorboard  TensorBoard's curves, images and HParams tab (purge_step on resume); run_hparams
    console      the training line: a progress bar's postfix on a terminal, a log line otherwise
    tracker      TrackerSink, what W&B and MLflow share: rows sent once a checkpoint covers them, the
                 tracker's run id in OUTPUT_DIR/trackers.json, a failure warns once and the run goes on
    wandb_sink   Weights & Biases (LOG.WANDB*)
    mlflow_sink  MLflow (LOG.MLFLOW_URI, LOG.MLFLOW_EXPERIMENT)
    catalog      SINKS: name -> module, in the order sinks open; check_sinks (before the claim), open_sinks
    writer       MetricWriter: the fan-out the engine's producers write through (rank 0)

A new destination (a tracker) is one module defining `open_sink(ctx) -> Sink | None` (and `check(cfg)` if
its store can be checked before OUTPUT_DIR is claimed), plus one line in catalog.SINKS.
"""
from runner.sinks.base import Sink, SinkContext
from runner.sinks.catalog import SINKS, Entry, check_sinks
from runner.sinks.logs import log_to_file, logging_setup, setup_logging
from runner.sinks.tensorboard import run_hparams
from runner.sinks.writer import MetricWriter

__all__ = ["SINKS", "Entry", "MetricWriter", "Sink", "SinkContext", "check_sinks", "log_to_file", "logging_setup",
           "run_hparams", "setup_logging"]
