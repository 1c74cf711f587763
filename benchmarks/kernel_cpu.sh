#!/usr/bin/env bash
# The CPU decode-kernel records the integer-kernel targets are judged on (docs/PERFORMANCE.md, "integer KIVI
# kernels >= 50% of copy bandwidth", "kivi2-int8 time <= 0.65x kivi4-int8"): a Llama-3-8B layer (32 query / 8 KV
# heads, head_dim 128) and SmolLM2-135M's (9 / 3, head_dim 64), 16k and 32k tokens, 1 and 2 threads, on the best
# instruction-set path of this CPU and on the AVX2 path forced (KVLAB_CPU_ISA=avx2; skipped where the CPU has no
# AVX512, the two being the same path there). Each record names the CPU (machine.cpu_id, machine.cpu_isa) and the
# path that ran; then docs/PERFORMANCE.md is regenerated. Run it on a quiet machine.
#
#   benchmarks/kernel_cpu.sh [options passed to every run]   e.g. --force (replace this CPU's records), --reps 21
set -euo pipefail
cd "$(dirname "$0")/.."
R=benchmarks/results
unmet=0
run() { # run FILE NOTE [kvlab bench kernel options]
  local out=$1 note=$2 rc=0; shift 2
  kvlab bench kernel --contexts 16384,32768 --out "$R/$out" \
    --note "${note}kernels timed interleaved, compare ratios inside one record; load at start: $(cut -d' ' -f1-3 /proc/loadavg)" \
    "$@" || rc=$?
  [ "$rc" -eq 1 ] && unmet=1 && return 0  # ran, a target not met: recorded
  return "$rc"
}
SMOL=(--q-heads 9 --kv-heads 3 --head-dim 64)
for t in 1 2; do
  s=$([ "$t" -eq 1 ] && echo thread || echo threads)
  run "kernel-cpu-llama3-8b-$t$s.json" "" --threads "$t" "$@"
  run "kernel-cpu-smollm2-135m-$t$s.json" "the layer shape of SmolLM2-135M; " "${SMOL[@]}" --threads "$t" "$@"
  if grep -qw avx512f /proc/cpuinfo; then
    KVLAB_CPU_ISA=avx2 run "kernel-cpu-llama3-8b-$t$s-avx2.json" "KVLAB_CPU_ISA=avx2: the AVX2 path forced; " \
      --threads "$t" "$@"
    KVLAB_CPU_ISA=avx2 run "kernel-cpu-smollm2-135m-$t$s-avx2.json" \
      "the layer shape of SmolLM2-135M; KVLAB_CPU_ISA=avx2: the AVX2 path forced; " "${SMOL[@]}" --threads "$t" "$@"
  fi
done
kvlab bench docs
exit "$unmet"
