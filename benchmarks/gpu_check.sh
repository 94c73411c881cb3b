#!/usr/bin/env bash
# The GPU checks of the performance issue, as one script sized for a short loan of a GPU machine (~6 minutes on
# one H200 once Python is up): the two-phase depth attention against the reference on CUDA (eager and compiled,
# fp32 and bf16 autocast), then step time and peak memory in bf16 at d_model 1024, eager and compiled.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]          # logs and JSON into OUT_DIR (default: gpu-check/)
#
# Needs torch (CUDA), pytest and pyyaml; lightning and the rest are not imported. Runs from a plain checkout:
# PYTHONPATH points at it, nothing is installed. Each stage has its own time limit, so a slow compile does not
# take the others with it. DEVICE=cpu SIZES=64x2 BATCH=2 SEQ=64 tries the script itself on a machine without GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-check}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
device=${DEVICE:-cuda}
sizes=${SIZES:-1024x16}
batch=${BATCH:-16}
seq=${SEQ:-1024}
status=0

stage() {  # stage NAME LIMIT_S COMMAND...: run, log to OUT/NAME.log, remember a failure
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s)"
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || { echo "== $name: exit $rc"; status=1; }
}

"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU visible")' | tee "$out/env.log"
if [ "$device" = cuda ]; then
    stage tests 240 "$python" -m pytest -q -m gpu -p no:cacheprovider tests/test_model.py
fi
bench=(benchmarks/bench_step.py --device "$device" --dtype bf16 --sizes "$sizes" --batch "$batch" --seq-len "$seq")
stage bench-eager 120 "$python" "${bench[@]}" --variants baseline,full,block4,block8 --repeats 20 \
    --json "$out/bench-eager.json"
stage bench-compiled 300 "$python" "${bench[@]}" --variants baseline,block8 --repeats 20 --compile \
    --json "$out/bench-compiled.json"
exit $status
