"""Thin script: ``python benchmarks/bench_paging.py [--static-requests N] [--sim-requests N]`` prints
:func:`kvlab.bench.paging.run` as JSON (the same as ``kvlab bench paging --json``)."""

import argparse
import json
import sys

from kvlab.bench.paging import run

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--static-requests", type=int, default=1_000_000)
    ap.add_argument("--sim-requests", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals per engine step")
    a = ap.parse_args()
    result = run(static_requests=a.static_requests, sim_requests=a.sim_requests, rate_per_step=a.rate)
    print(json.dumps(result, indent=1))
    sys.exit(0 if result["meets_target"] else 1)
