#!/usr/bin/env bash
# The GPU speed table in one command, written as $OUT/gpu_bench.json (every figure, machine-readable) and
# $OUT/gpu_bench.md (the tables docs/PERFORMANCE.md shows).
#
#   benchmarks/gpu.sh models     # resnet50 and vit_small_patch16_224, 224 px, batch 256, bf16, channels_last,
#                                # eager and compiled: the runner's step (tools/benchmark.py) against the raw loop
#                                # (benchmarks/raw_loop.py), alternated ROUNDS times (medians); MFU, step time, memory
#   benchmarks/gpu.sh data       # a synthetic JPEG folder made here (IMAGES photo-like files at ~500x375) read by
#                                # our loader: loader-only img/s and end-to-end resnet50 img/s for 1-16 workers,
#                                # against synthetic data on the GPU
#   benchmarks/gpu.sh all        # both (the default)
#   benchmarks/gpu.sh --dry-run  # the same pipeline on the CPU with tiny models and images, in seconds
#
# On the lent GPU machine (600 s a call; yacs's wheel from `benchmarks/gpu_suite.sh --prepare`, carried in .whl):
#   run(command="COMMIT=<sha> benchmarks/gpu.sh models", carry=[".whl"])   ~6-8 minutes
#   run(command="COMMIT=<sha> benchmarks/gpu.sh data", carry=[".whl"])     ~3-4 minutes
# MODELS="resnet50" splits the models part further. Environment: ROUNDS (2), STEPS (50), WARMUP (10), INFER (20),
# BATCH (256), SIZE (224), COMPILES ("0 1"), IMAGES (6000), WORKERS ("1 2 4 8 16"), COMPILE_MODE (default),
# COMMIT (when this checkout has no .git), OUT (a new temporary folder; every run's log is kept in OUT/runs).
set -euo pipefail
cd "$(dirname "$0")/.."
PART=all DRY=0
for arg in "$@"; do
    case "$arg" in
        models | data | all) PART=$arg ;;
        --dry-run | --tiny) DRY=1 ;;
        *) echo "usage: benchmarks/gpu.sh [models|data|all] [--dry-run]" >&2; exit 2 ;;
    esac
done
. benchmarks/gpu_env.sh
if [[ $DRY == 1 ]]; then
    DEV=cpu MODELS=${MODELS:-"resnet10t test_vit@160"} SIZE=${SIZE:-32} BATCH=${BATCH:-8} STEPS=${STEPS:-2}
    WARMUP=${WARMUP:-1} INFER=${INFER:-2} ROUNDS=${ROUNDS:-1} COMPILES=${COMPILES:-0} IMAGES=${IMAGES:-48}
    WORKERS=${WORKERS:-"0 2"} DATA_MODEL=${DATA_MODEL:-resnet10t} DSTEPS=${DSTEPS:-2} JPEG_W=64 JPEG_H=48
else
    DEV=cuda MODELS=${MODELS:-"resnet50 vit_small_patch16_224"} SIZE=${SIZE:-224} BATCH=${BATCH:-256}
    STEPS=${STEPS:-50} WARMUP=${WARMUP:-10} INFER=${INFER:-20} ROUNDS=${ROUNDS:-2} COMPILES=${COMPILES:-"0 1"}
    IMAGES=${IMAGES:-6000} WORKERS=${WORKERS:-"1 2 4 8 16"} DATA_MODEL=${DATA_MODEL:-resnet50} DSTEPS=${DSTEPS:-8}
    JPEG_W=500 JPEG_H=375
    "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
        || { echo "no CUDA device: use benchmarks/gpu.sh --dry-run for the CPU check of this script" >&2; exit 2; }
fi
COMPILE_MODE=${COMPILE_MODE:-default}
OUT=${OUT:-$(mktemp -d -t gpu-bench-XXXXXX)}
RUNS="$OUT/runs"
mkdir -p "$RUNS"
COMMON=(DEVICE "$DEV" AMP.ENABLED True AMP.DTYPE bfloat16 MODEL.CHANNELS_LAST True DATA.BATCH_SIZE "$BATCH"
        DATA.EVAL_BATCH_SIZE "$BATCH" MODEL.COMPILE_MODE "$COMPILE_MODE")
peak=$("$PY" -c "
import torch
from runner.bench.step import peak_tflops
print((peak_tflops(torch.cuda.get_device_name(0), 'bf16') or 0) if torch.cuda.is_available() else 0)")

record() {  # $1: name; the rest: the command. Its last JSON line goes to RUNS/name.json
    local name=$1
    shift
    echo "== $name" >&2
    "$@" > "$RUNS/$name.log" 2>&1 || { echo "failed: $RUNS/$name.log" >&2; tail -20 "$RUNS/$name.log" >&2; exit 1; }
    # the last line that is a JSON object: stderr shares the log, and another process's line may come last
    grep '^{' "$RUNS/$name.log" | tail -n 1 > "$RUNS/$name.json"
}

runner_cmd() {  # $1 model $2 size $3 compile 0|1
    "$PY" tools/benchmark.py "${COMMON[@]}" DATA.NAME synthetic MODEL.NAME "$1" DATA.IMG_SIZE "$2" \
        DATA.SYNTHETIC_SIZE $((BATCH * 8)) MODEL.COMPILE "$([[ $3 == 1 ]] && echo True || echo False)" \
        --steps "$STEPS" --warmup "$WARMUP" --infer-batches "$INFER"
}

raw_cmd() {  # $1 model $2 size $3 compile 0|1
    local extra=()
    [[ $3 == 1 ]] && extra+=(--compile)
    [[ "$peak" != "0" ]] && extra+=(--peak-tflops "$peak")
    "$PY" benchmarks/raw_loop.py --device "$DEV" --model "$1" --img-size "$2" --batch-size "$BATCH" \
        --eval-batch-size "$BATCH" --dataset-size $((BATCH * 8)) --amp --channels-last --nesterov \
        --steps "$STEPS" --warmup "$WARMUP" --infer-batches "$INFER" "${extra[@]}"
}

models_part() {  # runner and raw alternating (runner first, then raw first, ...); one inductor cache per model
    for spec in $MODELS; do
        local model=${spec%@*} size=$SIZE
        [[ $spec == *@* ]] && size=${spec#*@}
        for compile in $COMPILES; do
            for ((r = 1; r <= ROUNDS; r++)); do
                local order=(runner raw)
                ((r % 2 == 0)) && order=(raw runner)
                for who in "${order[@]}"; do
                    TORCHINDUCTOR_CACHE_DIR="$OUT/inductor-$model" record "model-$model-$compile-$who-$r" \
                        "${who}_cmd" "$model" "$size" "$compile"
                done
            done
        done
    done
}

data_part() {  # the JPEG folder, then the loader alone and end to end per worker count, and synthetic data
    local root="$OUT/jpegs"
    record "jpegs" "$PY" benchmarks/make_jpegs.py --root "$root" --images "$IMAGES" --width "$JPEG_W" \
        --height "$JPEG_H" --classes $((IMAGES < 1000 ? 4 : 100))
    local folder=(DATA.NAME folder DATA.ROOT "$root" DATA.IMG_SIZE "$SIZE" DATA.CHECK False MODEL.NUM_CLASSES 100)
    for w in $WORKERS; do
        record "loader-$w" "$PY" benchmarks/loader_speed.py "${COMMON[@]}" "${folder[@]}" DATA.NUM_WORKERS "$w" \
            --batches $((DSTEPS + 2)) --warmup 2
        record "e2e-folder-$w" "$PY" tools/benchmark.py "${COMMON[@]}" "${folder[@]}" MODEL.NAME "$DATA_MODEL" \
            DATA.NUM_WORKERS "$w" --steps "$DSTEPS" --warmup 2 --infer-batches 1
    done
    record "e2e-synthetic" "$PY" tools/benchmark.py "${COMMON[@]}" DATA.NAME synthetic MODEL.NAME "$DATA_MODEL" \
        DATA.IMG_SIZE "$SIZE" DATA.SYNTHETIC_SIZE $((BATCH * 8)) MODEL.NUM_CLASSES 100 --steps "$DSTEPS" \
        --warmup 2 --infer-batches 1
}

[[ $PART == models || $PART == all ]] && models_part
[[ $PART == data || $PART == all ]] && data_part
"$PY" benchmarks/gpu_report.py "$OUT" --peak "$peak" --commit "${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
echo "every run's output: $RUNS" >&2
