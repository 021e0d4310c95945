"""TensorBoard as a sink (LOG.TENSORBOARD): the scalars as curves in OUTPUT_DIR's event file, the run's keys
in the HParams tab. torch's SummaryWriter is imported only when the sink opens."""
from __future__ import annotations

import functools
from pathlib import Path

from runner.sinks.base import Sink, SinkContext

# Scalars kept in metrics.jsonl but not plotted: a count is not a curve worth a chart
NOT_PLOTTED = ("/count",)

# Resume-safe keys that the HParams tab still shows: a run may be extended with a new value, but the value
# changes what the run learned (the other resume-safe keys only observe it: logging, workers, checkpoints)
LENGTH_KEYS = frozenset(["TRAIN.EPOCHS", "TRAIN.MAX_STEPS"])


def _observe_only(key: str) -> bool:
    """True for a key that never changes what a run learns (runner.config.RESUME_SAFE_KEYS, less the length)."""
    from runner.config import RESUME_SAFE_KEYS

    return key in RESUME_SAFE_KEYS and key not in LENGTH_KEYS


def run_hparams(cfg, keys: list[str]) -> dict:
    """The config keys shown in TensorBoard's HParams tab, with the run's values.

    The keys set on the command line (a sweep's swept keys), in order, even where a value equals the default:
    TensorBoard builds its table from one run's key list, so every point of a sweep must write the same one.
    Without such keys (a plain run), the keys that differ from the defaults; without those, MODEL.NAME.
    """
    from runner.config import changed_from_defaults

    chosen = [k for k in dict.fromkeys(keys) if not _observe_only(k)]  # keys load_config already checked
    if not chosen:
        chosen = [k for k in changed_from_defaults(cfg) if not _observe_only(k)] or ["MODEL.NAME"]
    return {k: _hparam_value(functools.reduce(getattr, k.split("."), cfg)) for k in chosen}


def _hparam_value(value) -> int | float | str:
    """A value TensorBoard's HParams can hold: numbers as they are, everything else as text."""
    if isinstance(value, bool):  # torch's summary.hparams would store a bool as the number 0 or 1
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def _name_session(summary, run_dir: Path):
    """The session-start summary with a group name that begins with the run's own folder name.

    TensorBoard's HParams table shows a session by its run path under --logdir, cut to a few characters
    (`sweeps/lr_x_mo...` for every point of a sweep); a group name is shown instead. The parent path after
    the folder name keeps two runs of one name in different folders apart (one group would average them).
    """
    from tensorboard.plugins.hparams import plugin_data_pb2

    value = summary.value[0]
    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
    if data.WhichOneof("data") == "session_start_info":
        data.session_start_info.group_name = f"{run_dir.name} ({run_dir.parent})"
        value.metadata.plugin_data.content = data.SerializeToString()
    return summary


class TensorBoardSink(Sink):
    """Every scalar but counts at its step; the HParams summaries when the run completed."""

    def __init__(self, ctx: SinkContext):
        """Open the event file, dropping what a killed run wrote past the resume step."""
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(ctx.out)
        # purge_step drops events a killed run wrote after its last checkpoint, or before its first one
        self.tb = SummaryWriter(str(self.dir), purge_step=ctx.resume_step + 1)

    def write(self, step: int, epoch: int, scalars: dict[str, float]) -> None:
        """Each plotted scalar at `step`."""
        for k, v in scalars.items():
            if not k.endswith(NOT_PLOTTED):
                self.tb.add_scalar(k, v, step)

    def image(self, tag: str, image, step: int) -> None:
        """A PIL image in the Images tab at `step`."""
        import numpy as np

        self.tb.add_image(tag, np.asarray(image.convert("RGB")), step, dataformats="HWC")

    def flush(self) -> None:
        """Put every scalar written so far into the event file."""
        self.tb.flush()

    def finish(self, hparams: dict, metrics: dict) -> None:
        """The run's keys (see run_hparams) for TensorBoard's HParams tab, with the val scalars as its metrics.

        Written into the run's own event file: the tab then shows each metric's last value from the run's
        `val/*` curves. SummaryWriter.add_hparams is not used because it writes a one-point `hparam/*` chart
        per metric (crowding the Scalars page) into a sub-run of its own (a second event file, a second run
        in TensorBoard). Instead the summaries it would write go through the writer's public `file_writer`
        (a FileWriter, whose add_summary takes a ready Summary). The best values (`best/*`, no curve of
        their own) stay in results.json and the sweep table.
        """
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        hp = {k: _hparam_value(v) for k, v in hparams.items()} or {"config": "defaults"}
        tags = {k: v for k, v in metrics.items() if not k.startswith("best/") and not k.endswith(NOT_PLOTTED)}
        for summary in hparams_summaries(hp, tags):  # the experiment, the session start and its end
            self.tb.file_writer.add_summary(_name_session(summary, self.dir))
        self.tb.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.tb.close()


open_sink = TensorBoardSink
