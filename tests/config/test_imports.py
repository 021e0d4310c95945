"""IMPORTS: the user's own code (a timm model, a data source, an LR schedule) imported by the tools' opening,
before validation; its mistakes in one line; env.txt names each file with its sha256; a resume refuses another
list and warns about an edited file."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from runner.config import imports
from runner.errors import UserError
from tests.utils import assert_user_error, read_jsonl, run_tool

# The user's repository: a tiny timm model, a data source (the digits under another name) and an LR schedule,
# each registered by the line its own library documents.
USER_MODULE = '''
"""The user's code: a model, a data source and a schedule, registered on import."""
import torch
from torch import nn
from timm.models import register_model

from runner.data.sources import register
from runner.optim import SCHEDULES, register_schedule


class TinyNet(nn.Module):
    def __init__(self, num_classes=10, in_chans=3, **kwargs):
        super().__init__()
        self.num_classes = num_classes
        self.conv = nn.Conv2d(in_chans, 8, 3, padding=1)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


@register_model
def user_tinynet(pretrained=False, **kwargs):
    kwargs = {k: v for k, v in kwargs.items() if k in ("num_classes", "in_chans")}
    return TinyNet(**kwargs)


def build(cfg, dist):
    from runner.data import digits

    return digits.build(cfg, dist)


def known_split(cfg):
    from runner.data import digits

    return digits.known_split(cfg)


register("user_digits", __name__, in_process=True)
register_schedule("user_constant", SCHEDULES["constant"].build)
'''

RUN = ["MODEL.NAME", "user_tinynet", "DATA.NAME", "user_digits", "TRAIN.SCHEDULER", "user_constant",
       "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "64", "TRAIN.EPOCHS", "1", "TRAIN.MAX_STEPS", "1",
       "DATA.NUM_WORKERS", "0", "DEVICE", "cpu", "LOG.TENSORBOARD", "false", "TRAIN.WARMUP_EPOCHS", "0"]


def user_repo(tmp_path: Path, name: str = "user_code", text: str = USER_MODULE) -> tuple[Path, Path]:
    """The user's module and a config file naming it by path in IMPORTS."""
    module = tmp_path / f"{name}.py"
    module.write_text(text)
    config = tmp_path / "exp.yaml"
    config.write_text(f"IMPORTS: [{module}]\n")
    return module, config


# ---- fast: the opening's one-line mistakes ------------------------------------------------------------------
@pytest.mark.parametrize("entry, words", [
    ("no_such_module_xyz", "IMPORTS: no module named no_such_module_xyz (command line)"),
    ("./no_such_file.py", "IMPORTS: file ./no_such_file.py not found (command line"),
])
def test_a_missing_module_or_file_is_one_line_exit_2_nothing_written(tmp_path, entry, words):
    out = tmp_path / "run"
    r = run_tool("train.py", ["IMPORTS", f"[{entry}]", "OUTPUT_DIR", str(out)])
    assert_user_error(r, words)
    assert not out.exists()


def test_a_module_that_raises_is_its_last_line_exit_2(tmp_path):
    module, config = user_repo(tmp_path, "broken_code", "import json\nraise RuntimeError('no GPU driver here')\n")
    out = tmp_path / "run"
    r = run_tool("train.py", ["--cfg", str(config), "OUTPUT_DIR", str(out)])
    line = assert_user_error(r, f"IMPORTS: importing {module} failed ({config}:1)",
                             "RuntimeError: no GPU driver here")
    assert "Traceback" not in line and not out.exists()


def test_an_import_that_fails_inside_is_not_called_missing(tmp_path):
    _, config = user_repo(tmp_path, "needs_missing", "import no_such_dependency_xyz\n")
    r = run_tool("train.py", ["--cfg", str(config), "OUTPUT_DIR", str(tmp_path / "run")])
    assert_user_error(r, "failed", "ModuleNotFoundError: No module named 'no_such_dependency_xyz'")


def test_registrations_are_seen_by_validation(tmp_path):
    """TRAIN.SCHEDULER is checked by load_config: the user's schedule is known there (--print-config)."""
    _, config = user_repo(tmp_path)
    r = run_tool("train.py", ["--cfg", str(config), *RUN, "--print-config"])
    assert r.returncode == 0, r.stderr
    assert "SCHEDULER: user_constant" in r.stdout and "NAME: user_digits" in r.stdout
    r = run_tool("train.py", [*RUN, "--print-config"])  # without IMPORTS the same keys are refused
    assert_user_error(r, "TRAIN.SCHEDULER must be one of")


def test_entries_are_names_or_files(tmp_path, monkeypatch):
    monkeypatch.setattr(imports, "_RAN", {})
    with pytest.raises(UserError, match=r"^IMPORTS entries are module names or \.py file paths, got '' \(x\)$"):
        imports.import_user_code([""], "x")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(UserError, match="is not a .py file"):
        imports.import_user_code([str(tmp_path / "notes.txt")], "x")
    imports.import_user_code(["json"], "x")  # a module name: as `import json`
    (entry, path, digest), = imports.imported_files(["json"])
    assert entry == "json" and path.endswith("json/__init__.py")
    assert digest == hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_env_txt_lines_and_what_changed():
    from runner.rundir.envinfo import changed_imports, format_imports

    old = format_imports([("/a/x.py", "/a/x.py", "1" * 64), ("mod", "/l/mod/__init__.py", "2" * 64)])
    assert old.splitlines()[1:] == [f"  /a/x.py  /a/x.py  {'1' * 64}", f"  mod  /l/mod/__init__.py  {'2' * 64}"]
    text = "Python  3.11\n" + old + "GPUs: none visible\n"
    assert changed_imports(text, [("/a/x.py", "/a/x.py", "3" * 64), ("mod", "/l/mod/__init__.py", "2" * 64)]) == [
        "/a/x.py: sha256 111111111111 -> 333333333333"]
    assert changed_imports("", [("mod", "/l/mod/__init__.py", "4" * 64)]) == []  # a first start: nothing to say
    assert format_imports([]) == ""


# ---- slow: the user's model, source and schedule train through tools/train.py -------------------------------
@pytest.mark.slow
def test_users_code_trains_env_names_it_and_resume_rules(tmp_path):
    module, config = user_repo(tmp_path)
    out = tmp_path / "run"
    argv = ["--cfg", str(config), *RUN, "OUTPUT_DIR", str(out)]
    r = run_tool("train.py", argv)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert [row["step"] for row in read_jsonl(out / "metrics.jsonl") if "train/loss" in row] == [1]
    digest = hashlib.sha256(module.read_bytes()).hexdigest()
    env_text = (out / "env.txt").read_text()
    assert f"  {module}  {module.resolve()}  {digest}" in env_text.splitlines()
    # another list is refused like any run-changing key; nothing changes in the folder
    before = (out / "env.txt").read_bytes()
    other = tmp_path / "other.py"
    other.write_text("")
    r = run_tool("train.py", [*argv, "IMPORTS", f"[{module}, {other}]", "TRAIN.MAX_STEPS", "2"])
    assert_user_error(r, "IMPORTS")
    assert (out / "env.txt").read_bytes() == before
    # without the user's code this process knows none of its names: the stored config imports its own list
    # first, so the refusal is the list's, not 'TRAIN.SCHEDULER must be one of'
    r = run_tool("train.py", ["--cfg", str(config), "IMPORTS", "[]", "DEVICE", "cpu", "OUTPUT_DIR", str(out)])
    assert_user_error(r, f"IMPORTS: ('{module}',) -> ()", "TRAIN.SCHEDULER: 'user_constant' -> 'cosine'")
    # the same list with an edited file resumes, says so and records the new hash
    module.write_text(USER_MODULE + "\n# a fix\n")
    r = run_tool("train.py", [*argv, "TRAIN.MAX_STEPS", "2", "TRAIN.EXTEND", "true"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "IMPORTS: " in (out / "log.txt").read_text() and "changed since this run's last start" in r.stdout + r.stderr
    new = hashlib.sha256(module.read_bytes()).hexdigest()
    assert f"  {module}  {module.resolve()}  {new}" in (out / "env.txt").read_text().splitlines()



@pytest.mark.slow
def test_every_rank_imports_under_torchrun(tmp_path):
    """Each torchrun worker loads the config, so each imports the user's code: two processes train its model."""
    import subprocess

    from tests.utils import ROOT, TRAIN, env, torchrun

    _, config = user_repo(tmp_path)
    out = tmp_path / "run"
    argv = torchrun(["--standalone", "--nproc_per_node=2", TRAIN, "--cfg", str(config), *RUN, "DATA.BATCH_SIZE", "32",
                     "OUTPUT_DIR", str(out)])
    r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env(), timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "2 processes" in (out / "log.txt").read_text()
    assert [row["step"] for row in read_jsonl(out / "metrics.jsonl") if "train/loss" in row] == [1]
