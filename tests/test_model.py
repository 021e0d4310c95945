"""One real training step for several timm families, bf16 autocast on CPU, and the model builder's errors."""
from __future__ import annotations

import pytest
import torch

from runner.config import get_default_config
from runner.engine import build_trainer
from runner.errors import UserError
from runner.model import build_model
from tests.utils import merge_pairs


def tiny_cfg(**overrides):
    """A frozen config for a tiny synthetic run."""
    cfg = get_default_config()
    cfg.DATA.NAME = "synthetic"
    cfg.DATA.SYNTHETIC_SIZE = 16
    cfg.DATA.BATCH_SIZE = 8
    cfg.DATA.IMG_SIZE = 32
    cfg.OUTPUT_DIR = "/nonexistent-not-written"
    merge_pairs(cfg, [x for pair in overrides.items() for x in pair])
    cfg.freeze()
    return cfg


FAMILIES = ["resnet10t", "efficientnet_b0", "mobilenetv3_small_050", "convnext_atto", "vit_tiny_patch16_224",
            "regnetx_002"]


@pytest.mark.parametrize("name", FAMILIES)
def test_one_step_per_family(name):
    trainer = build_trainer(tiny_cfg(**{"MODEL.NAME": name}), hooks=[])
    stepper = trainer.stepper
    before = [p.detach().clone() for p in stepper.bare.parameters()]
    trainer.data.train.set_epoch(0)
    x, y = next(iter(trainer.data.train))
    assert x.shape == (8, 3, 32, 32)
    assert stepper.train_batch(x, y, last=True)
    assert torch.isfinite(stepper.loss_sum)
    assert any(not torch.equal(a, b) for a, b in zip(before, stepper.bare.parameters(), strict=True))
    assert trainer.step == 1


def test_bf16_autocast_on_cpu():
    trainer = build_trainer(tiny_cfg(**{"MODEL.NAME": "resnet10t", "AMP.ENABLED": True}), hooks=[])
    stepper = trainer.stepper
    trainer.data.train.set_epoch(0)
    x, y = next(iter(trainer.data.train))
    with stepper.autocast():
        assert stepper.model(x).dtype == torch.bfloat16
    assert not stepper.scaler.is_enabled()  # a GradScaler only for float16 on CUDA
    assert stepper.train_batch(x, y, last=True) and torch.isfinite(stepper.loss_sum)
    assert next(stepper.bare.parameters()).dtype == torch.float32


def test_vit_gets_img_size_from_data():
    model = build_model(tiny_cfg(**{"MODEL.NAME": "vit_tiny_patch16_224", "DATA.IMG_SIZE": 48}))
    assert model(torch.randn(1, 3, 48, 48)).shape == (1, 10)


def test_unknown_model_suggests():
    with pytest.raises(UserError, match="did you mean.*resnet18"):
        build_model(tiny_cfg(**{"MODEL.NAME": "resnet-18"}))


def test_local_checkpoint_loads_with_new_head(tmp_path):
    src = build_model(tiny_cfg(**{"MODEL.NAME": "resnet10t", "MODEL.NUM_CLASSES": 5}))
    torch.save(src.state_dict(), tmp_path / "w.pth")
    cfg = tiny_cfg(**{"MODEL.NAME": "resnet10t", "MODEL.CHECKPOINT": str(tmp_path / "w.pth")})
    model = build_model(cfg)
    assert torch.equal(model.conv1[0].weight, src.conv1[0].weight)
    assert model.fc.out_features == 10
