#!/usr/bin/env bash
# The GPU table in one command: resnet50, 224 px, bf16, channels_last, batch 256, synthetic data on the GPU;
# img/s of the runner (tools/benchmark.py) and of the raw loop (benchmarks/raw_loop.py), eager and compiled,
# with MFU against the device's dense bf16 peak and the runner/raw ratio. Each pair alternates ROUNDS times
# (runner first, then raw first, ...); the table shows medians.
#
#   benchmarks/gpu.sh              # on a GPU box, from anywhere; needs only this repo and its packages
#   benchmarks/gpu.sh --tiny       # the same pipeline on a tiny model (the CPU path when there is no GPU)
#
# Compiled runs: the first step (compile_s) compiles from an empty inductor cache, and WARMUP further steps
# let asynchronous compilation and cuDNN autotuning finish before the timed ones.
# Environment: PYTHON (default python, which must import torch), ROUNDS (3), STEPS (50), WARMUP (10),
# INFER (20), MODEL (resnet50), SIZE (224), BATCH (256), COMPILE_MODE (default), OUT (a new temporary folder;
# every run's output is kept there).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
# Where the project is not pip-installed (a bare GPU box with only torch and timm), import it from here.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

has_cuda=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))")
if [[ "${1:-}" == "--tiny" || "$has_cuda" == "0" ]]; then
    [[ "$has_cuda" == "0" ]] && echo "no CUDA device: running the tiny CPU check of this script, not the GPU table"
    DEV=cpu MODEL=${MODEL:-resnet10t} SIZE=${SIZE:-32} BATCH=${BATCH:-8} STEPS=${STEPS:-2} WARMUP=${WARMUP:-3}
    INFER=${INFER:-2} ROUNDS=${ROUNDS:-1}
    [[ "$has_cuda" == "1" ]] && DEV=cuda
else
    DEV=cuda MODEL=${MODEL:-resnet50} SIZE=${SIZE:-224} BATCH=${BATCH:-256} STEPS=${STEPS:-50}
    WARMUP=${WARMUP:-10} INFER=${INFER:-20} ROUNDS=${ROUNDS:-3}
fi
COMPILE_MODE=${COMPILE_MODE:-default}
OUT=${OUT:-$(mktemp -d -t gpu-bench-XXXXXX)}
mkdir -p "$OUT"
DATASET=$((BATCH * 8))

peak=$("$PY" -c "
import torch
from runner.bench import peak_tflops
print(peak_tflops(torch.cuda.get_device_name(0), 'bf16') or 0 if torch.cuda.is_available() else 0)")

runner_cmd() {  # $1: compile 0|1
    "$PY" tools/benchmark.py DEVICE "$DEV" DATA.NAME synthetic MODEL.NAME "$MODEL" DATA.IMG_SIZE "$SIZE" \
        DATA.BATCH_SIZE "$BATCH" DATA.EVAL_BATCH_SIZE "$BATCH" DATA.SYNTHETIC_SIZE "$DATASET" \
        AMP.ENABLED True AMP.DTYPE bfloat16 MODEL.CHANNELS_LAST True MODEL.COMPILE "$([[ $1 == 1 ]] && echo True || echo False)" \
        MODEL.COMPILE_MODE "$COMPILE_MODE" --steps "$STEPS" --warmup "$WARMUP" --infer-batches "$INFER"
}

raw_cmd() {  # $1: compile 0|1
    local extra=()
    [[ $1 == 1 ]] && extra+=(--compile)
    [[ "$peak" != "0" ]] && extra+=(--peak-tflops "$peak")
    "$PY" benchmarks/raw_loop.py --device "$DEV" --model "$MODEL" --img-size "$SIZE" --batch-size "$BATCH" \
        --eval-batch-size "$BATCH" --dataset-size "$DATASET" --amp --channels-last --nesterov --steps "$STEPS" \
        --warmup "$WARMUP" --infer-batches "$INFER" "${extra[@]}"
}

for compile in 0 1; do
    for ((r = 1; r <= ROUNDS; r++)); do
        order=(runner raw)
        ((r % 2 == 0)) && order=(raw runner)
        for who in "${order[@]}"; do
            echo "== $who compile=$compile round $r/$ROUNDS" >&2
            # a fresh inductor cache per run: compile_s is a cold compile, and no run reuses another's kernels
            TORCHINDUCTOR_CACHE_DIR="$OUT/inductor-$who-$compile-$r" \
                "${who}_cmd" "$compile" > "$OUT/$who-$compile-$r.log" 2>&1 \
                || { echo "failed: see $OUT/$who-$compile-$r.log" >&2
                     tail -20 "$OUT/$who-$compile-$r.log" >&2; exit 1; }
            tail -n 1 "$OUT/$who-$compile-$r.log" > "$OUT/$who-$compile-$r.json"
        done
    done
done

"$PY" - "$OUT" "$peak" <<'EOF'
import glob, json, statistics, sys
out, peak = sys.argv[1], float(sys.argv[2])
rows = {}
for who in ("runner", "raw"):
    for c in ("0", "1"):
        rows[who, c] = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{who}-{c}-*.json"))]
def med(rs, k):
    vals = [r[k] for r in rs if r.get(k) is not None]
    return statistics.median(vals) if vals else None
first = rows["runner", "0"][0]
print(f"\n{first['model']} {first['img_size']}px batch {first['batch_size']} {first['precision']} "
      f"channels_last on {first['device_name']}; medians of {len(rows['runner', '0'])} alternations; "
      f"dense bf16 peak {peak or 'unknown'} TFLOP/s")
print(f"{'':18}{'train img/s':>12}{'step ms':>9}{'infer img/s':>12}{'TFLOP/s':>9}{'mfu':>7}{'mem MB':>8}"
      f"{'compile s':>10}{'vs raw':>8}")
for c, mode in (("0", "eager"), ("1", "compiled")):
    for who in ("runner", "raw"):
        rs = rows[who, c]
        f = lambda v, p: "-" if v is None else f"{v:.{p}f}"
        ratio = med(rs, "train_img_per_s") / med(rows["raw", c], "train_img_per_s")
        mfu = med(rs, "train_img_per_s") * first["train_gflops_per_img"] / 1e3 / peak if peak else None
        print(f"{who + ' ' + mode:18}{f(med(rs, 'train_img_per_s'), 0):>12}{f(med(rs, 'step_ms'), 1):>9}"
              f"{f(med(rs, 'infer_img_per_s'), 0):>12}{f(med(rs, 'achieved_tflops'), 1):>9}{f(mfu, 3):>7}"
              f"{f(med(rs, 'peak_mem_mb'), 0):>8}{f(med(rs, 'compile_s'), 1):>10}{ratio:>8.3f}")
need = 5000 * first["train_gflops_per_img"] / 1e3
print(f"train GFLOPs/img (fwd+bwd, FlopCounterMode) {first['train_gflops_per_img']:.2f}: 5,000 img/s needs "
      f"{need:.0f} TFLOP/s" + (f" = mfu {need / peak:.3f}" if peak else ""))
print(json.dumps({f"{w}_{'compiled' if c == '1' else 'eager'}": rs for (w, c), rs in rows.items()}))
EOF
echo "every run's output: $OUT" >&2
