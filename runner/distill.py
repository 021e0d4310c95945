"""Knowledge distillation (DISTILL.*): a frozen teacher from a local file, and timm's logit distillation task.

The loss is timm's LogitDistillationTask: (1 - ALPHA) x the run's training loss + ALPHA x T^2 x
KL(teacher || student) of the logits softened by T (Hinton et al.; DeiT's soft distillation). The teacher runs
on the very input the student sees (after mixup), under the same autocast, without gradients, in eval mode. It
is not part of the student: nothing of it is saved, so a checkpoint holds the student alone, and a resumed run
is exact because the teacher is a fixed function of its input.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn as nn

from runner.model import create_sized
from runner.weights.files import load_weights

log = logging.getLogger("runner")

KEYS = ("DISTILL.CHECKPOINT", "DISTILL.TEACHER")  # how the errors name the file and the model


def build_teacher(cfg, device: torch.device) -> nn.Module:
    """DISTILL.TEACHER with the weights of DISTILL.CHECKPOINT (the file's `model` entry: the trained weights, not
    the EMA), on `device`, frozen and in eval mode; exactly fitting weights or a one-line UserError."""
    teacher = create_sized(cfg, cfg.DISTILL.TEACHER, key="DISTILL.TEACHER")
    load_weights(teacher, cfg.DISTILL.CHECKPOINT, allow_new_head=False, keys=KEYS)
    teacher.to(device)
    if cfg.MODEL.CHANNELS_LAST:  # the batches arrive channels_last for the student
        teacher.to(memory_format=torch.channels_last)
    teacher.eval().requires_grad_(False)
    return teacher


def distillation_loss(cfg, student: nn.Module, criterion: Callable, device: torch.device) -> Callable | None:
    """(inputs, targets) -> the distillation loss through `student` (as it runs: DDP, compiled), or None when
    DISTILL.TEACHER is empty."""
    if not cfg.DISTILL.TEACHER:
        return None
    from timm.task import DistillationTeacher, LogitDistillationTask

    teacher = build_teacher(cfg, device)
    alpha, temperature = cfg.DISTILL.ALPHA, cfg.DISTILL.TEMPERATURE
    task = LogitDistillationTask(student, DistillationTeacher(teacher), criterion=criterion,
                                 task_loss_weight=1.0 - alpha, distill_loss_weight=alpha,
                                 temperature=temperature, device=device, verbose=False)
    # timm re-normalizes the input from the student's pretrained_cfg mean/std to the teacher's; here both models
    # take the batches as DATA.MEAN/STD normalized them (a teacher trained by this runner on this data)
    task.student_mean = task.student_std = None
    params = sum(p.numel() for p in teacher.parameters())
    log.info("distilling from %s (%s, %.2f M parameters): ALPHA %g, TEMPERATURE %g", cfg.DISTILL.TEACHER,
             cfg.DISTILL.CHECKPOINT, params / 1e6, alpha, temperature)
    return lambda x, y: task(x, y)["loss"]
