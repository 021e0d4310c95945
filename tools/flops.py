"""Parameters, FLOPs per image and activation memory of the configured model at the configured size.

    python tools/flops.py --cfg configs/x.yaml [KEY VALUE ...]

Prints a small table, then one line of JSON. FLOPs are counted by torch's FlopCounterMode (2 x the
multiply-accumulates of matmuls, convolutions and attention), in float32, on random inputs.
"""
from __future__ import annotations

import json

from runner.process.startup import prepare

prepare()  # before torch loads: the CPU-thread choice is read by libgomp as torch loads

from runner.config import build_parser
from runner.errors import UserError, cli
from runner.preflight import config_command


@cli
def main(argv: list[str] | None = None) -> int:
    """Load the config, build the model as training would, measure it and print the figures."""
    parser = build_parser(description="Parameters, FLOPs and activation memory of the configured model.")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where to run the measuring passes (default: cpu; the counts are the same)")
    loaded = config_command(argv, parser, check_paths=False)  # reads no data, weights or OUTPUT_DIR
    if loaded is None:
        return 0
    cfg, info = loaded

    import torch

    from runner.bench.flops import model_stats
    from runner.model import build_model

    device = torch.device(info.args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but CUDA is not available here; use --device cpu (same figures)")
    # weights do not change the counts; skipping them avoids loading (or failing to find) a large file
    arch = cfg.clone()
    arch.defrost()
    arch.MODEL.PRETRAINED, arch.MODEL.CHECKPOINT = False, ""
    arch.freeze()
    model = build_model(arch).to(device)
    stats = {"model": cfg.MODEL.NAME, **model_stats(model, cfg.DATA.IMG_SIZE, cfg.MODEL.IN_CHANS, device)}
    print(format_stats(stats))
    print(json.dumps(stats))
    return 0


def format_stats(stats: dict) -> str:
    """The human-readable table printed above the JSON line."""
    size = stats["img_size"]
    rows = [
        ("model", stats["model"]),
        ("input", f"{stats['in_chans']} x {size} x {size}"),
        ("params", f"{stats['params'] / 1e6:.3f} M ({stats['trainable_params'] / 1e6:.3f} M trainable)"),
        ("forward", f"{stats['gflops_per_img']:.4g} GFLOPs / image"),
        ("train step", f"{stats['train_gflops_per_img']:.4g} GFLOPs / image (forward + backward)"),
        ("activations", f"{stats['act_mb_per_img']:.4g} MB / image (saved for backward, float32)"),
    ]
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in rows)


if __name__ == "__main__":
    main()
