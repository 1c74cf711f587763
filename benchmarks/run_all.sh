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
# `kvlab bench` exits 1 when it ran but something failed (a target not met): note it, run the rest, render the page
# and exit 1 at the end; exit 2 (bad input, a record that exists) stops the script
unmet=0
bench() { local rc=0; kvlab bench "$@" || rc=$?; [ "$rc" -eq 1 ] && unmet=1 && return 0; return "$rc"; }
bench decode --results-dir benchmarks/results --device "$DEVICE" --steps 32 --profile-context 4096 "$@"
bench memory --results-dir benchmarks/results --device "$DEVICE" "$@"
bench flush --results-dir benchmarks/results --device "$DEVICE" "$@"
bench kernel --results-dir benchmarks/results --device "$DEVICE" "$@"
bench paging --results-dir benchmarks/results "$@"
bench lab --results-dir benchmarks/results "$@"
kvlab bench docs
exit "$unmet"
