#!/usr/bin/env bash
# The GPU benchmarks of issue 6 as one prepared script (CI has no GPU): decode ms/token up to 128k tokens, decode
# memory, and the kernel's GB/s against the copy bandwidth, all on CUDA, then PERFORMANCE.md.
# Sized to fit about ten minutes on one H200 (the bundled 4-layer model; the kernel on one Llama-3-8B layer).
#
#   benchmarks/run_gpu.sh [options passed to every benchmark, e.g. --force]
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'run_gpu.sh: no CUDA device')"
kvlab bench kernel --device cuda "$@"
kvlab bench decode --device cuda --contexts 4096,32768,131072 --steps 32 "$@"
kvlab bench memory --device cuda --contexts 4096,32768,131072 "$@"
kvlab bench docs
