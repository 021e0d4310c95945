"""Knowledge distillation (DISTILL.*): the loss against its formula, a digits student taught by a digits teacher
(no teacher tensor in its checkpoints, a kill + resume equal to a run left alone), and the one-line refusals."""
from __future__ import annotations

import signal
import sys

import pytest
import torch
import torch.nn.functional as F

from runner.config import get_default_config, validate
from runner.distill import distillation_loss
from runner.model import build_model
from tests.engine.test_resume import Launch, assert_same_run
from tests.utils import TRAIN, assert_user_error, merge_pairs, run_tool

DIGITS = ["--cfg", "configs/digits/resnet18.yaml", "DATA.NUM_WORKERS", "0"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> str:
    """A teacher checkpoint trained by the digits config (its test_resnet, 3 epochs: about 97% val/top1)."""
    out = tmp_path_factory.mktemp("teacher")
    proc = run_tool(TRAIN, DIGITS + ["TRAIN.EPOCHS", "3", "LOG.PERIOD", "100", "OUTPUT_DIR", str(out)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return str(out / "checkpoints" / "last.pth")


def cfg_with(**overrides):
    """A validated, frozen digits-like config (16 px, resnet10t student) with `overrides`."""
    cfg = get_default_config()
    merge_pairs(cfg, ["MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", 16, "OUTPUT_DIR", "/nonexistent"])
    merge_pairs(cfg, [x for pair in overrides.items() for x in pair])
    validate(cfg, check_files=False)
    cfg.freeze()
    return cfg


@pytest.mark.parametrize("alpha, temperature", [(0.0, 1.0), (1.0, 1.0), (0.3, 4.0)])
def test_loss_is_the_formula(tmp_path, alpha, temperature):
    weights = tmp_path / "teacher.pth"
    torch.manual_seed(0)
    teacher = build_model(cfg_with(**{"MODEL.NAME": "test_resnet"})).eval()
    torch.save(teacher.state_dict(), weights)
    cfg = cfg_with(**{"DISTILL.TEACHER": "test_resnet", "DISTILL.CHECKPOINT": str(weights),
                      "DISTILL.ALPHA": alpha, "DISTILL.TEMPERATURE": temperature})
    student = build_model(cfg)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    loss_fn = distillation_loss(cfg, student, criterion, torch.device("cpu"))
    x, y = torch.randn(6, 3, 16, 16), torch.randint(0, 10, (6,))
    got = loss_fn(x, y)
    s, t = student(x), teacher(x).detach()
    kd = (F.softmax(t / temperature, -1) * (F.log_softmax(t / temperature, -1) - F.log_softmax(s / temperature, -1)))
    want = (1 - alpha) * criterion(s, y) + alpha * temperature**2 * kd.sum(-1).mean()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    got.backward()
    assert all(p.grad is not None for p in student.parameters() if p.requires_grad)


def test_no_teacher_means_no_distillation():
    assert distillation_loss(cfg_with(), build_model(cfg_with()), torch.nn.CrossEntropyLoss(), torch.device("cpu")) \
        is None


def student_argv(teacher: str, out) -> list[str]:
    """The resnet10t student on digits, taught by `teacher`; every step logged, EMA on (it is saved too)."""
    return [sys.executable, TRAIN, *DIGITS, "MODEL.NAME", "resnet10t", "TRAIN.EPOCHS", "2", "TRAIN.EMA", "true",
            "TRAIN.EMA_DECAY", "0.9", "LOG.PERIOD", "1", "DISTILL.TEACHER", "test_resnet", "DISTILL.CHECKPOINT",
            teacher, "DISTILL.ALPHA", "0.7", "DISTILL.TEMPERATURE", "2", "OUTPUT_DIR", str(out)]


@pytest.mark.slow
def test_student_resumes_exactly_and_saves_no_teacher(teacher, tmp_path):
    ref, out, logs = tmp_path / "ref", tmp_path / "out", tmp_path
    left_alone = Launch(student_argv(teacher, ref), logs, "ref")
    assert left_alone.finish() == 0, left_alone.stderr[-2000:]
    assert "distilling from test_resnet" in left_alone.stdout
    first = Launch(student_argv(teacher, out), logs, "first")
    first.wait_step(15)
    first.p.send_signal(signal.SIGTERM)
    assert first.finish(60) == 75, first.stderr[-2000:]
    second = Launch(student_argv(teacher, out), logs, "second")
    assert second.finish() == 0, second.stderr[-2000:]
    assert "resumed from" in second.stdout
    assert_same_run(out, ref)
    saved = torch.load(out / "checkpoints" / "last.pth", map_location="cpu", weights_only=True)
    student_keys = set(build_model(cfg_with()).state_dict())
    assert set(saved["model"]) == student_keys  # the student's tensors, and no teacher's
    assert set(saved["ema"]) <= {f"module.{k}" for k in student_keys} | student_keys


def test_teacher_that_does_not_fit_is_one_line(teacher, tmp_path):
    proc = run_tool(TRAIN, DIGITS + ["DISTILL.TEACHER", "resnet18", "DISTILL.CHECKPOINT", teacher,
                                     "OUTPUT_DIR", str(tmp_path / "o")])
    assert_user_error(proc, f"DISTILL.CHECKPOINT {teacher} does not fit DISTILL.TEACHER resnet18",
                      "saved by a run with MODEL.NAME test_resnet", "set DISTILL.TEACHER test_resnet")
    proc = run_tool(TRAIN, DIGITS + ["DISTILL.TEACHER", "test_resnet", "DISTILL.CHECKPOINT", teacher,
                                     "DATA.NAME", "synthetic", "DATA.SYNTHETIC_SIZE", "64", "MODEL.NUM_CLASSES", "5",
                                     "OUTPUT_DIR", str(tmp_path / "o")])
    line = assert_user_error(proc, "does not fit DISTILL.TEACHER test_resnet with MODEL.NUM_CLASSES 5",
                             "a teacher must predict this run's 5 classes")
    assert "use those" not in line  # the student's MODEL.NUM_CLASSES must not follow the teacher's


@pytest.mark.parametrize("args, fragments", [
    (["DISTILL.TEACHER", "test_resnet", "DISTILL.CHECKPOINT", "/nowhere/t.pth"],
     ["DISTILL.CHECKPOINT '/nowhere/t.pth' is not a file"]),
    (["DISTILL.TEACHER", "test_resnet"], ["needs DISTILL.CHECKPOINT"]),
    (["DISTILL.CHECKPOINT", "x.pth"], ["DISTILL.TEACHER is empty"]),
    (["DISTILL.ALPHA", "1.5"], ["DISTILL.ALPHA must be in [0, 1]"]),
    (["DISTILL.TEMPERATURE", "0"], ["DISTILL.TEMPERATURE must be > 0"]),
    (["DISTILL.TEACHER", "resnet_nope", "DISTILL.CHECKPOINT", "configs/digits/resnet18.yaml"],
     ["DISTILL.TEACHER 'resnet_nope' is not a timm model"]),
])
def test_bad_distill_settings_are_one_line(tmp_path, args, fragments, in_process):
    # the teacher's model is made after the claim: that refusal in a process of its own, the rest in this one
    call = run_tool if "resnet_nope" in args else in_process
    assert_user_error(call(TRAIN, DIGITS + args + ["OUTPUT_DIR", str(tmp_path / "o")]), *fragments)
