"""The default run folder's name: output/<config label>[-<tag from the overrides>]."""
from __future__ import annotations

import hashlib
import os
import re
from typing import Any

from runner.config.compare import flatten
from runner.config.defaults import _C
from runner.config.keypath import inline_yaml
from runner.config.schema import RESUME_SAFE_KEYS

# how long a run trains: resume-safe, yet part of the default OUTPUT_DIR's name (and of TensorBoard's HParams)
RUN_LENGTH_KEYS = ("TRAIN.EPOCHS", "TRAIN.MAX_STEPS")


def default_output_dir(files: list[str], overrides: list[tuple[str, Any]], cwd: str | None = None) -> str:
    """output/<config label>[-<tag from the overrides>]; the same arguments in the same folder give the same one."""
    stem = config_label(files, cwd or os.getcwd())
    # a repeated key: the last value wins. The run's length is resume-safe (a preempted run may be given more
    # epochs) but names the folder, so that an epochs ablation gets one run per value
    latest = {k: v for k, v in overrides if k not in RESUME_SAFE_KEYS or k in RUN_LENGTH_KEYS}
    if not latest:
        return os.path.join("output", stem)
    parts = [f"{_short_key(k)}={_fmt_tag(v)}" for k, v in sorted(latest.items())]
    readable = "-".join(parts)
    tag = _sanitize(readable)
    # a hash keeps folders apart when sanitizing lost information, a value has '=' in it, or the tag is long
    if tag != readable or any("=" in _fmt_tag(v) for v in latest.values()) or len(tag) > 60:
        digest = hashlib.sha1(repr(sorted(latest.items())).encode()).hexdigest()[:8]
        kept = [p for i, p in enumerate(_sanitize(p) for p in parts) if len("-".join(parts[:i + 1])) <= 48]
        tag = "-".join(kept or [tag[:48]]) + f"-{digest}"
    return os.path.join("output", f"{stem}-{tag}")


def config_label(files: list[str], cwd: str) -> str:
    """digits/resnet18 for configs/digits/resnet18.yaml; name-<hash of the path> for a file outside configs/;
    several files: the first label, '__', the other names and a hash of every path."""
    if not files:
        return "default"
    configs = os.path.join(os.path.abspath(cwd), "configs")
    full = [os.path.normpath(os.path.join(cwd, os.path.expanduser(f))) for f in files]
    labels = []
    for path in full:
        rel = os.path.relpath(os.path.splitext(path)[0], configs)
        if rel.split(os.sep)[0] != os.pardir:
            labels.append("/".join(_sanitize(part) for part in rel.split(os.sep)))
        else:  # a name alone could be shared by files in different folders
            labels.append(f"{_sanitize(_stem(path))}-{_digest(path)}")
    if len(labels) == 1:
        return labels[0]
    return "__".join([labels[0]] + [_sanitize(_stem(p)) for p in full[1:]]) + f"-{_digest(' '.join(full))}"


def _stem(path: str) -> str:
    """The file name without its extension."""
    return os.path.splitext(os.path.basename(path))[0]


def _digest(text: str) -> str:
    """8 hex digits that tell different texts apart in folder names."""
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def _short_key(key: str) -> str:
    """The key's last part, lower-case, with its section when that part is not unique (model.name)."""
    last = key.split(".")[-1]
    same = [k for k in flatten(_C) if k.split(".")[-1] == last]
    return (last if len(same) == 1 else key).lower()


def _fmt_tag(value: Any) -> str:
    """A value as it reads in a folder name."""
    if isinstance(value, (tuple, list)):
        return ",".join(_fmt_tag(v) for v in value)
    return value if isinstance(value, str) else inline_yaml(value)


def _sanitize(text: str) -> str:
    """Only characters that are safe in a folder name on every system."""
    return re.sub(r"[^A-Za-z0-9._=-]", "_", text)
