"""The training engine: a small loop over the step, with a fixed, ordered list of hooks for the side duties.

Modules, imports running one way (each imports only those above it):
    step        TrainStep: micro-step, optimizer step, loss tracking on the device (no host sync)
    best        Best (the best evaluation by CHECKPOINT.BEST_METRIC), EarlyStopping (TRAIN.EARLY_STOP_*); no torch
    hooks       Hook, StopRun, RunState (what the hooks share); Profiler, MetricLogger (windows, sinks), Checkpointer
    evaluation  evaluate (top-1/top-5 over a split, the confusion matrix), Evaluator (epochs, EVAL.PERIOD_STEPS;
                best, early stopping)
    splits      SplitResults: best.pth on val and DATA.TEST_SPLIT once at the end (per-class results, the
                confusion matrices as results.json's splits, PNGs and TensorBoard images)
    signals     StopFlag, Preemption (SIGTERM/SIGUSR1/Ctrl-C agreed by every rank; PROFILE.ONLY), TimeLimit
    status      RunStatus (run.json, results.json, TensorBoard's hparams)
    watchdog    Watchdog (hangs: stacks, run.json hung, exit 76), relaying failures of any rank via the store
    loop        Trainer: epochs, batches, resume position, the step and the hooks in order
    claim       claiming OUTPUT_DIR under the run lock, finding and loading the checkpoint, the run's files
                (following runner.rundir's rules)
    build       build_trainer(cfg): the one place that reads the config to wire a run; train(cfg)

A new side duty is a Hook subclass added to build.run_hooks at the place its order requires.
"""
from runner.engine.build import AlreadyDone, autocast_for, build_trainer, configure_backends, train
from runner.engine.evaluation import evaluate
from runner.engine.hooks import Hook, StopRun
from runner.engine.loop import Trainer
from runner.engine.step import TrainStep

__all__ = ["AlreadyDone", "Hook", "StopRun", "TrainStep", "Trainer", "autocast_for", "build_trainer",
           "configure_backends", "evaluate", "train"]
