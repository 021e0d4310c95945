"""A run's weights out, for the tools people load them with: a Hugging Face folder (timm's `local-dir:`), one
safetensors file, ONNX (a dynamic batch axis) or a torch.export program (.pt2).

Every export is written into a temporary folder beside --output, loaded back there by its own consumer (timm,
safetensors into a fresh timm model, onnxruntime, torch.export.load) and compared with the checkpoint's model on
the run's validation images; only an export that agrees is renamed to --output. Everything runs on the CPU in
float32: the export is the weights, not the run's precision.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from runner.errors import UserError
from runner.rundir.layout import BEST, CHECKPOINTS, LAST, checkpoints
from runner.rundir.marker import is_our_run

log = logging.getLogger("runner")

FORMATS = ("hf", "safetensors", "onnx", "torch-export")
WEIGHTS_FILE = "model.safetensors"  # the name timm's local-dir: and the Hub look for first
CONFIG_FILE = "config.json"  # timm's Hub config: architecture, classes, label names, preprocessing
ONNX_FILE = "model.onnx"
ONNX_ONE_FILE_BYTES = 1_800_000_000  # below protobuf's 2 GiB message limit, with room for the graph
PROGRAM_FILE = "model.pt2"
INPUT_NAME, OUTPUT_NAME = "input", "logits"  # the ONNX graph's names
REQUIRES = {"hf": ("safetensors", "huggingface_hub"), "safetensors": ("safetensors",),
            "onnx": ("onnx", "onnxscript", "onnxruntime"), "torch-export": ()}
# largest |logit difference| accepted, relative to the largest |logit| of the checkpoint (at least 1): float32
# kernels that sum in another order (ONNX Runtime's) differ by ~1e-6 of that; a wrong weight by far more
TOLERANCE = 1e-3


class ExportFailed(Exception):
    """The exporter failed, or its output does not classify the validation images as the checkpoint does; exit
    code 1 (not a user mistake: the model or the exporter is at fault)."""

    exit_code = 1


@dataclass
class Source:
    """The checkpoint to export: its file, the run's config, the weights taken and what they are."""

    checkpoint: Path
    cfg: object
    weights: dict[str, torch.Tensor]
    kind: str  # "EMA" or "raw"
    step: int | None
    names: list[str] = field(default_factory=list)


@dataclass
class Agreement:
    """How the exported model's logits compare with the checkpoint's on the same images."""

    images: int
    max_diff: float
    agree: int
    largest: float  # the largest |logit| of the checkpoint's model
    unexplained: int  # top-1 disagreements on images whose margin exceeds twice the largest difference

    @property
    def ok(self) -> bool:
        """True when the difference is within TOLERANCE and no disagreement is more than a near-tie."""
        return self.max_diff <= TOLERANCE * max(1.0, self.largest) and self.unexplained == 0


@dataclass
class Result:
    """What export() wrote and how it was verified."""

    output: Path
    files: list[str]
    source: Source
    agreement: Agreement
    usage: list[str]


# ---------------------------------------------------------------------------------------------------------
# The input: a run folder or a checkpoint, its config and weights
# ---------------------------------------------------------------------------------------------------------
def find_checkpoint(path: str) -> Path:
    """The checkpoint a RUN_DIR_OR_CHECKPOINT names: a run's best.pth, else its last.pth, or the file itself."""
    p = Path(path).expanduser()
    if not p.exists():
        raise UserError(f"{path} does not exist; give a run folder (a tools/train.py OUTPUT_DIR) or a checkpoint "
                        ".pth file")
    if p.is_file():
        return p
    if p.name == CHECKPOINTS and is_our_run(p.parent):
        p = p.parent  # the run's checkpoints/ folder: the run itself was meant
    if not is_our_run(p):
        raise UserError(f"{path} is a folder but not a run folder of tools/train.py (no run marker in it); give a "
                        f"run's OUTPUT_DIR or a checkpoint file such as OUTPUT_DIR/{CHECKPOINTS}/{BEST}")
    for name in (BEST, LAST):
        if (checkpoints(p) / name).is_file():
            return checkpoints(p) / name
    raise UserError(f"run {path} has no checkpoint yet ({CHECKPOINTS}/{BEST} or {LAST}); train it first, or give "
                    "a checkpoint file")


def load_source(path: str, use_ema: bool = True) -> Source:
    """The checkpoint of `path`, its run's config and the weights to export (its EMA when it has one and
    `use_ema`)."""
    from runner.weights.files import read_weights_file, state_dict_of

    ckpt = find_checkpoint(path)
    obj = read_weights_file(str(ckpt), f"checkpoint {ckpt}")
    cfg = _export_config(_config_text(obj, ckpt), ckpt)
    ema = obj.get("ema") if use_ema else None
    weights = ema if isinstance(ema, dict) and ema else obj  # a checkpoint's "model" entry, or a plain state_dict
    names = [str(n) for n in obj.get("class_names") or []]
    step = obj.get("step") if isinstance(obj.get("step"), int) else None
    tensors = state_dict_of(weights, f"checkpoint {ckpt}")[0]
    return Source(ckpt, cfg, tensors, "EMA" if weights is ema else "raw", step, names)


def _config_text(obj: dict, ckpt: Path) -> str:
    """The run's config as YAML: the checkpoint's own, else its run folder's stored config."""
    from runner.rundir.reader import stored_config

    if isinstance(obj.get("config"), str):
        return obj["config"]
    run = ckpt.resolve().parent.parent
    text = stored_config(run) if ckpt.resolve().parent.name == CHECKPOINTS else None
    if text is None:
        raise UserError(f"checkpoint {ckpt} holds no config and is not in a run folder: export a checkpoint "
                        f"written by tools/train.py (OUTPUT_DIR/{CHECKPOINTS}/*.pth) or the run folder itself")
    return text


def _export_config(text: str, ckpt: Path):
    """The run's config for building the bare model and the val loader on the CPU (weights come from `ckpt`)."""
    from runner.config import config_from_yaml_text
    from runner.weights.preprocess import resolve

    # a config that stored "auto" (none written by tools/train.py does) takes the values training would resolve
    cfg = resolve(config_from_yaml_text(text, f"the config of {ckpt}")).clone()
    cfg.defrost()
    cfg.MODEL.CHECKPOINT, cfg.MODEL.PRETRAINED, cfg.MODEL.COMPILE, cfg.DEVICE = "", False, False, "cpu"
    cfg.freeze()
    return cfg


def build_model(source: Source) -> nn.Module:
    """The run's timm model with the source's weights, in eval mode on the CPU."""
    from runner.model import create_sized

    model = create_sized(source.cfg)
    try:
        model.load_state_dict(source.weights, strict=True)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        raise UserError(f"checkpoint {source.checkpoint} does not fit MODEL.NAME {source.cfg.MODEL.NAME} of its "
                        f"own config ({first[1].strip() if len(first) > 1 else first[0][:160]})") from None
    return model.eval()


# ---------------------------------------------------------------------------------------------------------
# The validation images and the comparison
# ---------------------------------------------------------------------------------------------------------
def val_images(cfg, count: int) -> tuple[torch.Tensor, list[str]]:
    """The first `count` images of the run's val split (its eval transform, as tools/eval.py builds it), and the
    data's class names."""
    from runner.data import build_data
    from runner.distributed import Dist

    data = build_data(cfg, Dist(0, 1, 0, torch.device("cpu")))
    batches, taken = [], 0
    data.val.set_epoch(0, 0)
    for x, _ in data.val:
        batches.append(x.detach().to("cpu", torch.float32).contiguous())
        taken += len(x)
        if taken >= count:
            break
    if not batches:
        raise UserError(f"the val split of DATA.NAME {cfg.DATA.NAME} is empty: nothing to verify the export on")
    return torch.cat(batches)[:count], list(data.class_names)


def logits_of(run: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor, batch: int) -> torch.Tensor:
    """`run` over the images in batches of `batch` (the last one smaller: the batch axis must be dynamic)."""
    with torch.inference_mode():
        return torch.cat([run(images[i:i + batch]).float() for i in range(0, len(images), batch)])


def compare(reference: torch.Tensor, exported: torch.Tensor) -> Agreement:
    """The largest |difference| of two logit tables and their top-1 agreement."""
    if exported.shape != reference.shape:
        raise ExportFailed(f"the exported model gives logits of shape {list(exported.shape)}, the checkpoint "
                                 f"{list(reference.shape)}")
    diff = float((exported - reference).abs().max()) if reference.numel() else 0.0
    same = reference.argmax(1) == exported.argmax(1)
    top2 = reference.topk(min(2, reference.shape[1]), dim=1).values
    margin = top2[:, 0] - top2[:, -1]
    unexplained = int((~same & (margin > 2 * diff)).sum())
    if diff != diff:  # NaN
        diff, unexplained = float("inf"), len(reference)
    return Agreement(len(reference), diff, int(same.sum()), float(reference.abs().max()), unexplained)


# ---------------------------------------------------------------------------------------------------------
# The formats: write one, load it back by its own consumer
# ---------------------------------------------------------------------------------------------------------
def data_config(cfg) -> dict:
    """The preprocessing of the run's evaluation, in timm's data-config terms (pretrained_cfg's fields)."""
    from runner.data.folder.dataset import eval_interpolation
    from runner.data.sources import source

    c, side = cfg.MODEL.IN_CHANS, cfg.EVAL.IMG_SIZE or cfg.DATA.IMG_SIZE
    mean, std = [float(m) for m in cfg.DATA.MEAN], [float(s) for s in cfg.DATA.STD]
    if len(mean) != c:  # as the in-memory sources adapt them (runner/data/memory.py)
        mean, std = [sum(mean) / len(mean)] * c, [sum(std) / len(std)] * c
    # in-memory data (digits, synthetic) is resized whole: no crop
    crop = (cfg.EVAL.CROP_PCT or cfg.AUG.CROP_PCT) if source(cfg.DATA.NAME).files else 1.0
    return {"input_size": (c, side, side), "mean": tuple(mean), "std": tuple(std), "crop_pct": float(crop),
            "interpolation": eval_interpolation(cfg), "crop_mode": "center"}


def write_config(model: nn.Module, out: Path, cfg, names: list[str]) -> None:
    """config.json as timm writes it for the Hub (timm.models.save_for_hf): the run's preprocessing and labels."""
    from timm.models._hub import save_config_for_hf

    path = out / CONFIG_FILE
    save_config_for_hf(model, str(path), model_config={"label_names": names}, data_config=data_config(cfg))
    config = json.loads(path.read_text())
    for key in ("tag", "license"):  # those of timm's published weights for the architecture, not of these
        config["pretrained_cfg"].pop(key, None)
    path.write_text(json.dumps(config, indent=2) + "\n")


def write_hf(model: nn.Module, out: Path, cfg, names: list[str]) -> list[str]:
    """model.safetensors and config.json: what timm.create_model('local-dir:OUT', pretrained=True) loads."""
    from timm.models import save_for_hf

    save_for_hf(model, str(out), safe_serialization=True)
    write_config(model, out, cfg, names)
    return [WEIGHTS_FILE, CONFIG_FILE]


def write_safetensors(model: nn.Module, out: Path, cfg, names: list[str]) -> list[str]:
    """The state_dict as one model.safetensors."""
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / WEIGHTS_FILE))
    return [WEIGHTS_FILE]


@contextlib.contextmanager
def quiet() -> Iterator[io.StringIO]:
    """Hold the exporters' prints and warnings (a finished export says only its own lines); yields their text."""
    held = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(held), contextlib.redirect_stderr(held):
        warnings.simplefilter("ignore")
        yield held


def write_onnx(model: nn.Module, out: Path, cfg, names: list[str]) -> list[str]:
    """model.onnx (torch.onnx's dynamo exporter, a dynamic batch axis) and config.json."""
    sample = torch.zeros(2, *data_config(cfg)["input_size"])
    batch = torch.export.Dim("batch", min=1)
    # one file unless protobuf's 2 GiB limit forbids it: then the weights go to model.onnx.data beside it
    external = sum(t.numel() * t.element_size() for t in model.state_dict().values()) > ONNX_ONE_FILE_BYTES
    with quiet() as held:
        try:
            torch.onnx.export(model, (sample,), str(out / ONNX_FILE), input_names=[INPUT_NAME],
                              output_names=[OUTPUT_NAME], dynamic_shapes=({0: batch},), dynamo=True,
                              external_data=external, verbose=False)
        except Exception as e:  # noqa: BLE001 - the exporter raises its own types; say it in one line
            raise ExportFailed(f"torch.onnx.export failed for {cfg.MODEL.NAME}: {_first_line(e, held)}") from e
    write_config(model, out, cfg, names)
    return sorted(p.name for p in out.iterdir())


def write_torch_export(model: nn.Module, out: Path, cfg, names: list[str]) -> list[str]:
    """model.pt2 (torch.export.export with a dynamic batch, torch.export.save) and config.json."""
    sample = torch.zeros(2, *data_config(cfg)["input_size"])
    with quiet() as held:
        try:
            program = torch.export.export(model, (sample,), dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
            torch.export.save(program, str(out / PROGRAM_FILE))
        except Exception as e:  # noqa: BLE001 - torch.export raises many types for what it cannot trace
            raise ExportFailed(f"torch.export failed for {cfg.MODEL.NAME}: {_first_line(e, held)}") from e
    write_config(model, out, cfg, names)
    return [PROGRAM_FILE, CONFIG_FILE]


def _first_line(e: BaseException, held: io.StringIO) -> str:
    """The first line of an exporter's error (or of what it printed)."""
    text = str(e).strip() or held.getvalue().strip() or type(e).__name__
    return text.splitlines()[0][:200]


def load_hf(out: Path, model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The folder as timm loads it: create_model('local-dir:OUT', pretrained=True)."""
    import timm

    with quiet():
        loaded = timm.create_model(f"local-dir:{out}", pretrained=True)
    return loaded.eval()


def rebuild_args(model: nn.Module) -> dict:
    """The timm.create_model arguments that rebuild the model (timm records them at creation)."""
    from timm.models import get_model_args

    return dict(get_model_args(model))


def load_safetensors(out: Path, model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """A fresh timm model of the architecture with model.safetensors loaded into it (strict)."""
    import timm
    from safetensors.torch import load_file

    fresh = timm.create_model(model.pretrained_cfg["architecture"], **rebuild_args(model))
    fresh.load_state_dict(load_file(str(out / WEIGHTS_FILE)), strict=True)
    return fresh.eval()


def load_onnx(out: Path, model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """model.onnx in an ONNX Runtime CPU session."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: its warnings would reach the tool's stderr
    session = onnxruntime.InferenceSession(str(out / ONNX_FILE), options, providers=["CPUExecutionProvider"])
    return lambda x: torch.from_numpy(session.run([OUTPUT_NAME], {INPUT_NAME: x.numpy()})[0])


def load_torch_export(out: Path, model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """model.pt2 through torch.export.load, run as its module."""
    with quiet():
        return torch.export.load(str(out / PROGRAM_FILE)).module()


WRITERS = {"hf": write_hf, "safetensors": write_safetensors, "onnx": write_onnx,
           "torch-export": write_torch_export}
LOADERS = {"hf": load_hf, "safetensors": load_safetensors, "onnx": load_onnx, "torch-export": load_torch_export}


def usage(fmt: str, output: Path, model: nn.Module, cfg) -> list[str]:
    """How a user loads the export, one line each."""
    if fmt == "hf":
        return [f"load it: timm.create_model(\"local-dir:{output}\", pretrained=True) (or push the folder to the "
                "Hub and use hf-hub:ORG/NAME)"]
    if fmt == "safetensors":
        args = ", ".join(f"{k}={v!r}" for k, v in rebuild_args(model).items())
        return [f"rebuild it: model = timm.create_model(\"{model.pretrained_cfg['architecture']}\", {args}); "
                f"model.load_state_dict(safetensors.torch.load_file(\"{output / WEIGHTS_FILE}\"))"]
    pre = (f"input: float32 (N, {', '.join(map(str, data_config(cfg)['input_size']))}), preprocessed as "
           f"{output / CONFIG_FILE}'s pretrained_cfg says (mean, std, crop_pct, interpolation), as timm's "
           "resolve_data_config + create_transform read it")
    if fmt == "onnx":
        return [f"run it: onnxruntime.InferenceSession(\"{output / ONNX_FILE}\").run(None, {{\"{INPUT_NAME}\": x}}) "
                f"-> [{OUTPUT_NAME}]", pre]
    return [f"run it: torch.export.load(\"{output / PROGRAM_FILE}\").module()(x) -> logits", pre]


# ---------------------------------------------------------------------------------------------------------
# The output folder: written beside it, renamed into place once verified
# ---------------------------------------------------------------------------------------------------------
def check_output(output: str) -> Path:
    """--output as a path that is free: missing or an empty folder (never overwritten)."""
    out = Path(output).expanduser()
    if out.is_file() or (out.exists() and not out.is_dir()):
        raise UserError(f"--output {output} is a file; give a folder that does not exist yet (or an empty one)")
    if out.is_dir() and any(out.iterdir()):
        raise UserError(f"--output {output} is a folder that is not empty; an export never overwrites: give a "
                        "new folder")
    return out


@contextlib.contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A temporary folder beside `out`, renamed to `out` when the block succeeds and removed when it fails."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp's folder is private; the export is an ordinary folder
        try:
            os.rename(tmp, out)  # an empty folder at `out` is replaced; a non-empty one refuses
        except OSError as e:
            raise UserError(f"--output {out} appeared while exporting ({e.strerror}); nothing was "
                            "overwritten") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------
# The whole export
# ---------------------------------------------------------------------------------------------------------
def check_packages(fmt: str) -> None:
    """Refuse a format whose optional packages are not installed, before anything is loaded."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: unknown format; use one of {', '.join(FORMATS)}")
    missing = [name for name in REQUIRES[fmt] if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"--format {fmt} needs {', '.join(missing)}, not installed here: pip install -e "
                        "\".[export]\"")


def export(path: str, fmt: str, output: str, images: int = 256, use_ema: bool = True) -> Result:
    """Export the weights of `path` (a run folder or a checkpoint) as `fmt` into `output`, verified first."""
    if images < 1:
        raise UserError(f"--images {images}: give a number of validation images >= 1")
    check_packages(fmt)
    out = check_output(output)
    source = load_source(path, use_ema)
    model = build_model(source)
    x, data_names = val_images(source.cfg, images)
    from runner.data.build import eval_batch_size
    from runner.engine.splits import class_names

    source.names = class_names(source.names or data_names, int(model.num_classes))
    batch = eval_batch_size(source.cfg)
    reference = logits_of(model, x, batch)
    with staged(out) as tmp:
        files = WRITERS[fmt](model, tmp, source.cfg, source.names)
        agreement = compare(reference, logits_of(LOADERS[fmt](tmp, model), x, batch))
        if not agreement.ok:
            raise ExportFailed(f"the {fmt} export does not agree with {source.checkpoint}: "
                                     f"{describe(agreement)}; nothing was written to {out}")
    return Result(out, files, source, agreement, usage(fmt, out, model, source.cfg))


def describe(a: Agreement) -> str:
    """'max |logit difference| 1.2e-06, top-1 agreement 256/256 (100.00%)'."""
    return (f"max |logit difference| {a.max_diff:.3g}, top-1 agreement {a.agree}/{a.images} "
            f"({100.0 * a.agree / max(a.images, 1):.2f}%)")


def report(result: Result, fmt: str) -> list[str]:
    """The lines the tool prints when the export is done."""
    s = result.source
    step = f", step {s.step}" if s.step is not None else ""
    return [f"exported {s.kind} weights of {s.checkpoint}{step} as {fmt}: "
            f"{', '.join(str(result.output / f) for f in result.files)}",
            f"verified on {result.agreement.images} val images against the checkpoint: {describe(result.agreement)}",
            *result.usage]
