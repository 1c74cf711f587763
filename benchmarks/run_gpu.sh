#!/usr/bin/env bash
# The GPU checks as one prepared script (CI has no GPU): the Triton and quantized-attention tests on CUDA, then the
# kernel's GB/s against the copy bandwidth (eager calls and CUDA-graph replays; the Llama-3-8B layer and the
# SmolLM2-135M layer), decode ms/token up to 128k tokens, decode memory, and a quick `kvlab eval` on CUDA.
# Sized to fit about seven minutes on one H200 (the bundled 4-layer model); each step has its own time limit, so
# a slow or broken step is recorded and the rest still run.
#
#   benchmarks/run_gpu.sh [options passed to every benchmark, e.g. --force]
#   OUT=dir (optional): the log of each step and the records are copied there too
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-}"
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'run_gpu.sh: no CUDA device')" || exit 2
# kvlab from this checkout, without installing into the image (its torch/triton stay untouched, no network needed)
python3 -c "import kvlab" 2>/dev/null || export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
kvlab() { python3 -m kvlab.cli "$@"; }
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader || true
unmet=0
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $OUT/NAME.log; exit 1 (a target not met) noted
    local name=$1 limit=$2 rc=0
    shift 2
    echo "== $name (limit ${limit}s)"
    local t0=$SECONDS
    if [ -n "$OUT" ]; then timeout "$limit" "$@" >"$OUT/$name.log" 2>&1 || rc=$?; tail -n 25 "$OUT/$name.log"
    else timeout "$limit" "$@" || rc=$?; fi
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
    [ "$rc" -eq 1 ] && unmet=1
    return 0
}
export -f kvlab
xdist=""
python3 -c "import xdist" 2>/dev/null && xdist="-n 8"
step tests 120 env TRITON_INTERPRET=0 python3 -m pytest -q -p no:cacheprovider $xdist \
    tests/unit/attention/test_triton_kivi.py tests/unit/attention/test_quantized_attention.py
step kernel-llama3 100 bash -c 'kvlab bench kernel --results-dir benchmarks/results --device cuda "$@"' _ "$@"
step kernel-smollm2 60 bash -c 'kvlab bench kernel --results-dir benchmarks/results --device cuda --q-heads 9 \
    --kv-heads 3 --head-dim 64 --out benchmarks/results/kernel-nvidia-h200-smollm2-135m.json "$@"' _ "$@"
step decode 100 bash -c 'kvlab bench decode --results-dir benchmarks/results --device cuda \
    --contexts 4096,32768,131072 --steps 32 "$@"' _ "$@"
step memory 50 bash -c 'kvlab bench memory --results-dir benchmarks/results --device cuda \
    --contexts 4096,32768,131072 "$@"' _ "$@"
step eval-quick 60 kvlab eval --quick --device cuda --out-dir /tmp/kvlab-gpu-eval --force
if [ -n "$OUT" ]; then
    tar czf "$OUT/gpu-results.tgz" benchmarks/results /tmp/kvlab-gpu-eval 2>/dev/null
fi
exit "$unmet"
