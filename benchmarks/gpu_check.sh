#!/usr/bin/env bash
# The GPU checks of the performance issue and of issue 50 (collectives, host syncs), as one script sized for a short
# loan of a GPU machine; each stage has its own time limit:
#   tests           the two-phase depth attention against the reference on CUDA (`pytest -m gpu`: eager, through
#                   the fused kernels, and traced eager and compiled whole; fp32 and bf16 autocast);
#   bench-eager     step time and peak memory in bf16 at d_model 1024 x 16 layers, side by side (bench_step.py);
#   bench-compiled  the same with --compile (the fused depth kernels through Triton);
#   train           `attnres train` of the baseline and Block N=8 (bf16-mixed, compiled), tokens/s side by side
#                   (benchmarks/train_side_by_side.py);
#   host-syncs      a run with 4 micro-batches a step under torch.cuda.set_sync_debug_mode("warn"): no host sync in
#                   any micro-batch, one read per optimizer step (benchmarks/check_host_syncs.py, issue 50);
#   bench-whole     compiled Block N=8 as it trains on GPU (each sublayer, the fused kernels) beside block8-whole (the
#                   whole model, its depth attention traced, as runtime.compile trains on CPU);
#   parallel        only with 2 or more GPUs (else skipped, with a line): over NCCL, one gradient reduction and one
#                   loss all-reduce per step under accumulation (DDP and FSDP, collectives counted per micro-batch),
#                   and bf16 FSDP (sublayers gathered in bf16) against bf16 DDP (tests/attnres/test_parallel.py).
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]          # logs and JSON into OUT_DIR (default: gpu-check/)
#   ONLY="host-syncs parallel" bash benchmarks/gpu_check.sh OUT   # only the stages named
#
# The first four stages' limits add up to 650 s (they take less); host-syncs (120 s at most), bench-whole (180 s) and
# parallel (360 s, with 2 GPUs) come last, so a 10-minute command cut short loses them first: run those alone with ONLY.
#
# Needs torch (CUDA), pytest, pyyaml, lightning, pandas and pyarrow (not optuna or submitit). Runs from a plain
# checkout: PYTHONPATH points at it, nothing is installed. A slow stage does not take the others with it.
# To try the script itself on a machine without a GPU:
#   DEVICE=cpu SIZES=64x4 BATCH=2 SEQ=64 TRAIN_MODEL="model.d_model=64 model.n_layer=4 model.seq_len=64" \
#   TRAIN_TOKENS=40000 HOST_SYNC_ARGS="model.d_model=32 model.n_head=2 model.seq_len=64" bash benchmarks/gpu_check.sh
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
train_model=${TRAIN_MODEL:-model.d_model=1024 model.n_layer=16 model.n_head=16 model.seq_len=1024}
train_tokens=${TRAIN_TOKENS:-2000000}
status=0

stage() {  # stage NAME LIMIT_S COMMAND...: run, log to OUT/NAME.log, remember a failure
    local name=$1 limit=$2
    shift 2
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then echo "== $name: not in ONLY"; return; fi
    echo "== $name (limit ${limit}s)"
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || { echo "== $name: exit $rc"; status=1; }
}

"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU visible")' | tee "$out/env.log"
if [ "$device" = cuda ]; then
    stage tests 240 "$python" -m pytest -q -m gpu -p no:cacheprovider tests/attnres/test_model.py tests/attnres/test_train.py
fi
bench=(benchmarks/bench_step.py --device "$device" --dtype bf16 --sizes "$sizes" --batch "$batch" --seq-len "$seq")
stage bench-eager 80 "$python" "${bench[@]}" --variants baseline,full,block4,block8 --repeats 20 \
    --json "$out/bench-eager.json"
stage bench-compiled 180 "$python" "${bench[@]}" --variants baseline,block8 --repeats 20 --compile \
    --json "$out/bench-compiled.json"
accelerator=gpu
[ "$device" = cuda ] || accelerator=cpu
# shellcheck disable=SC2086  # train_model is a list of overrides
stage train 150 "$python" benchmarks/train_side_by_side.py --variants baseline,block8 --accelerator $accelerator \
    $train_model train.batch_size="$batch" train.tokens="$train_tokens" runtime.compile=true
stage host-syncs 120 "$python" benchmarks/check_host_syncs.py --device "$device" --json "$out/host-syncs.json" \
    ${HOST_SYNC_ARGS:-}
# its own stage: a cold compile of the whole graph that ran past the limit would take the others' results with it
stage bench-whole 180 "$python" "${bench[@]}" --variants baseline,block8,block8-whole --repeats 20 --compile \
    --json "$out/bench-whole.json"
gpus=0
[ "$device" = cuda ] && gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())')
if [ "$gpus" -ge 2 ]; then
    stage parallel 360 env ATTNRES_TEST_ACCELERATOR=gpu "$python" -m pytest -q -m slow -p no:cacheprovider \
        tests/attnres/test_parallel.py -k "once_per_optimizer_step or bf16_fsdp"
else
    echo "== parallel: skipped ($gpus GPU(s) visible; it needs 2)"
fi
exit $status
