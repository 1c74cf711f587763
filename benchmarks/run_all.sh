#!/usr/bin/env bash
# Run every kvlab benchmark on this machine, save the records in benchmarks/results/ and regenerate
# docs/PERFORMANCE.md. Thin wrapper over `kvlab bench`; all logic lives in kvlab.bench.
#
#   benchmarks/run_all.sh [options passed to every benchmark]
#   e.g. benchmarks/run_all.sh --threads 2 --force --note "shared 2-core VM"
#
# DEVICE=cpu|cuda|auto (default auto) selects the device of decode, memory, flush and kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE="${DEVICE:-auto}"
kvlab bench decode --results-dir benchmarks/results --device "$DEVICE" --steps 32 --profile-context 4096 "$@"
kvlab bench memory --results-dir benchmarks/results --device "$DEVICE" "$@"
kvlab bench flush --results-dir benchmarks/results --device "$DEVICE" "$@"
kvlab bench kernel --results-dir benchmarks/results --device "$DEVICE" "$@"
kvlab bench paging --results-dir benchmarks/results "$@"
kvlab bench lab --results-dir benchmarks/results "$@"
kvlab bench docs
