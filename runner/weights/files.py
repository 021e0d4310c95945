"""Weights from a file (MODEL.CHECKPOINT, a teacher, eval/predict/export): a runner checkpoint (whole or sharded),
a plain state_dict or a .safetensors file, checked against the model tensor by tensor; what a file that is no
weights file is, said in one line."""
from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn as nn

from runner.checkpoint import NotADict, describe, is_torch_archive, load_file, load_reason, read_sharded, zip_entries
from runner.errors import UserError
from runner.rundir.layout import BEST, CHECKPOINTS

log = logging.getLogger("runner")

STATE_KEYS = ("model", "state_dict", "model_state_dict")  # where runner, Lightning-style and other files keep weights


def load_weights(model: nn.Module, path: str, allow_new_head: bool = False,
                 keys: tuple[str, str] = ("MODEL.CHECKPOINT", "MODEL.NAME")) -> dict:
    """Load weights from a runner checkpoint, a plain state_dict or a .safetensors file; returns the other fields.

    Every tensor must fit the model (names and shapes). With `allow_new_head` (training only) a classifier of
    another size, or none, is left new, and an input conv for another MODEL.IN_CHANS is adapted as timm adapts
    pretrained weights; both are logged. Anything else that does not fit is one UserError naming it.
    `keys`: the config keys of the file and of the model, as the errors name them.
    """
    where = f"{keys[0]} {path}"
    sd, meta = state_dict_of(read_weights_file(path, where), where)
    own = model.state_dict()
    wrong = [k for k, v in sd.items() if k in own and own[k].shape != v.shape]
    missing = [k for k in own if k not in sd and not k.endswith("num_batches_tracked")]  # BN tolerates those
    unexpected = [k for k in sd if k not in own]
    skipped = []
    if allow_new_head:
        wrong = [k for k in wrong if not _adapt_first_conv(model, sd, own, k, where)]
        head = _classifier_keys(model, own)
        skipped = [f"{k} {_shape(sd[k])} (the model's: {_shape(own[k])})" for k in wrong if k in head]
        skipped += [f"{k} (not in the file)" for k in missing if k in head]
        for k in wrong:
            if k in head:
                del sd[k]
        wrong, missing = [k for k in wrong if k not in head], [k for k in missing if k not in head]
    if wrong or missing or unexpected or not set(sd) & set(own):
        raise UserError(_misfit(where, model, own, sd, wrong, missing, unexpected, meta, keys[1]))
    if skipped:
        log.warning("%s: classifier left new for MODEL.NUM_CLASSES %d, skipped: %s", where,
                    _num_classes(model), "; ".join(skipped))
    from runner import fsdp

    if fsdp.sharded_modules(model):  # a sharded model (the run's end's copy of it under fsdp)
        fsdp.load_whole(model, sd)
    else:
        model.load_state_dict(sd, strict=False)
    log.info("weights loaded from %s (%d tensors)", path, len(sd))
    return meta


def read_weights_file(path: str, where: str) -> dict:
    """The dict a weights file holds; a UserError saying what the file is when it holds none."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{where} is a folder, not a weights file; name a .pth file in it (e.g. "
                        f"{p / CHECKPOINTS / BEST})")
    if not p.is_file():
        raise UserError(f"{where} does not exist; give a local weights file (.pth or .safetensors)")
    kind = _sniff(p)
    if kind == "safetensors":
        return _read_safetensors(p, where)
    if kind is not None:
        raise UserError(f"{where} is {kind}, not a weights file; give a .pth written by torch.save "
                        "(a runner checkpoint or a state_dict) or a .safetensors file")
    try:
        return read_sharded(load_file(p), p)  # a sharded checkpoint's model comes whole from its folder
    except NotADict as e:
        raise UserError(f"{where} holds a {e.found}, not a state_dict (a dict of tensors) nor a "
                        "runner checkpoint") from None
    except Exception as e:  # noqa: BLE001 - torch raises many types for a file it cannot read
        raise UserError(f"{where} cannot be read as weights ({load_reason(e) or describe(e)})") from None


def _sniff(p: Path) -> str | None:
    """What a file that torch.load cannot read is ('an empty file', 'a PNG image', ...), or None to let it try."""
    size = p.stat().st_size
    if size == 0:
        return "an empty file (0 bytes)"
    with open(p, "rb") as f:
        head = f.read(512)
    for magic, what in ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
                        (b"\x1f\x8b", "a gzip file"), (b"%PDF", "a PDF document")):
        if head.startswith(magic):
            return what
    if len(head) > 9 and head[8:9] == b"{" and 8 < int.from_bytes(head[:8], "little") < size:
        return "safetensors"
    if head.startswith(b"PK\x03\x04"):
        names = zip_entries(p)
        if names is None or is_torch_archive(names):
            return None  # a torch file (one cut short, most likely, when it does not open: torch.load says so)
        return f"a zip archive but not a torch file (it holds {', '.join(names[:3]) or 'nothing'})"
    if b"\0" not in head:
        return _sniff_text(p, head)
    return None


def _sniff_text(p: Path, head: bytes) -> str | None:
    """What a text file given as weights is (a config, a Git LFS pointer), or None when it is not text."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return None
    first = " ".join(text.split())[:40]
    hint = " (a config? configs go after --cfg)" if p.suffix in (".yaml", ".yml") else ""
    if text.startswith("version https://git-lfs"):
        hint = " (a Git LFS pointer: fetch the file itself with git lfs pull)"
    return f"a text file beginning '{first}'{hint}"


def _read_safetensors(p: Path, where: str) -> dict:
    """A .safetensors file's tensors (how timm and the Hugging Face hub ship weights)."""
    try:
        from safetensors.torch import load_file as load_safetensors

        return load_safetensors(str(p))
    except Exception as e:  # noqa: BLE001 - a damaged header raises the library's own error types
        raise UserError(f"{where} looks like a .safetensors file but cannot be read ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:120] if str(e) else ''})") from None


def state_dict_of(obj: dict, where: str) -> tuple[dict, dict]:
    """(the tensors, every other field) of a checkpoint dict; the wrappers' key prefixes removed."""
    key = next((k for k in STATE_KEYS if k in obj), None)
    sd = obj[key] if key is not None else obj
    if not isinstance(sd, dict):
        raise UserError(f"{where}: its '{key}' entry holds a {type(sd).__name__}, not a dict of tensors")
    from timm.models import clean_state_dict  # DDP's module. and torch.compile's _orig_mod., in either order

    tensors = {k: v for k, v in clean_state_dict(sd).items() if isinstance(v, torch.Tensor)}
    if not tensors:
        keys = ", ".join(map(str, list(sd)[:5])) or "none"
        raise UserError(f"{where} holds no tensors (its keys: {keys}): not model weights; give a runner "
                        "checkpoint or a file written by torch.save(model.state_dict(), path)")
    meta = {k: v for k, v in obj.items() if k != key} if key is not None else {}
    return tensors, meta


def _classifier_keys(model: nn.Module, own: dict) -> set[str]:
    """The model's classifier tensors (timm's pretrained_cfg names them), e.g. {fc.weight, fc.bias}."""
    names = getattr(model, "pretrained_cfg", {}).get("classifier") or ()
    names = (names,) if isinstance(names, str) else tuple(names)
    return {k for k in own if any(k.startswith(n + ".") for n in names)}


def _adapt_first_conv(model: nn.Module, sd: dict, own: dict, key: str, where: str) -> bool:
    """Adapt the input conv of a file saved for another MODEL.IN_CHANS (timm's rule); True when done."""
    first = getattr(model, "pretrained_cfg", {}).get("first_conv")
    firsts = (first,) if isinstance(first, str) else tuple(first or ())
    if key not in {f"{f}.weight" for f in firsts} or sd[key].shape[2:] != own[key].shape[2:]:
        return False
    if sd[key].shape[0] != own[key].shape[0]:
        return False
    from timm.models import adapt_input_conv

    was = sd[key].shape[1]
    sd[key] = adapt_input_conv(own[key].shape[1], sd[key])
    log.warning("%s: %s adapted from %d input channels to MODEL.IN_CHANS %d (as timm adapts pretrained weights)",
                where, key, was, own[key].shape[1])
    return True


def _shape(t: torch.Tensor) -> str:
    """[5, 512]"""
    return str(list(t.shape))


def _num_classes(model: nn.Module) -> int:
    """The model's number of outputs."""
    return int(getattr(model, "num_classes", 0))


def _misfit(where: str, model: nn.Module, own: dict, sd: dict, wrong: list, missing: list, unexpected: list,
            meta: dict, model_key: str = "MODEL.NAME") -> str:
    """One line: what in the file does not fit the model, and which run saved it when the file says."""
    name = getattr(model, "default_cfg", {}).get("architecture") or type(model).__name__
    parts = []
    if wrong:
        parts.append(f"{len(wrong)} tensors have other shapes than {name}'s "
                     f"({_first_few([f'{k} {_shape(sd[k])} vs {_shape(own[k])}' for k in wrong])})")
    if missing:
        parts.append(f"{len(missing)} of the model's tensors are missing ({_first_few(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} are not in {name} ({_first_few(unexpected)})")
    if not parts:
        parts.append(f"none of its {len(sd)} tensors belong to {name}")
    return (f"{where} does not fit {model_key} {name} with MODEL.NUM_CLASSES {_num_classes(model)}: "
            f"{'; '.join(parts)}{_saved_by(meta, model_key, _num_classes(model))}")


def _first_few(items: list[str], n: int = 2) -> str:
    """The first n items, then '...' when there are more."""
    return ", ".join(items[:n]) + (", ..." if len(items) > n else "")


def _saved_by(meta: dict, model_key: str = "MODEL.NAME", classes: int = 0) -> str:
    """'; it was saved by a run with MODEL.NAME x, MODEL.NUM_CLASSES n' from a runner checkpoint's config, and
    what to change: the MODEL settings for the model itself; for a teacher (`model_key` DISTILL.TEACHER) only
    its name, since a teacher must predict the student's `classes` classes."""
    import yaml

    try:
        model = yaml.safe_load(meta["config"])["MODEL"]
        saved = (f"; it was saved by a run with MODEL.NAME {model['NAME']}, MODEL.NUM_CLASSES {model['NUM_CLASSES']}"
                 f", MODEL.IN_CHANS {model['IN_CHANS']}")
    except Exception:  # noqa: BLE001 - not a runner checkpoint, or an older layout: nothing to add
        model, saved = None, ""
    if model_key == "MODEL.NAME":
        return saved + ": use those" if model else "; use the MODEL settings of the run that saved it"
    advice = f"{model_key} {model['NAME']}" if model and model["NAME"] else f"the {model_key} it was trained as"
    if model and model["NUM_CLASSES"] != classes:
        return f"{saved}: a teacher must predict this run's {classes} classes; give one trained for them"
    return f"{saved}: set {advice}"
