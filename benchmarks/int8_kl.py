"""How much the CPU kernel's integer KIVI path changes a real model's predictions: KL(exact fused || int8 fused)
against KIVI's own KL(float cache || exact fused), on SmolLM2-135M (the named real model), teacher-forced.

    python benchmarks/int8_kl.py --out benchmarks/results/int8-kl-cpu.json [--context 2048] [--steps 32]

One prompt: docs/*.md concatenated, tokenized, the first ``--context`` tokens prefilled into three caches (``dynamic``,
and the KIVI cache twice), then ``--steps`` next tokens of the same text fed to all three; the KIVI caches decode
through the compiled kernel, the second one named ``<cache>:dot=int8`` (the integer path, a setting of the cache). Per step, KL of the
next-token distributions (nats), and their means. Target (issue "Decode attention at the memory limit on the CPU"):
the int8 path's KL to the exact path at most 10 % of KIVI's own KL to the float cache. Writes atomically and
refuses to overwrite an existing ``--out`` (pass ``--force``). Source of the method: docs/EVAL.md (KL of next-token
distributions against the float cache, teacher-forced).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import torch

from kvlab.attention import cpu_kernel, interface
from kvlab.caches.registry import make_cache
from kvlab.models import load_model
from kvlab.runtime.atomic import atomic_write_json
from kvlab.runtime.provenance import machine_info

FORMAT = "kvlab-int8-kl/1"
TARGET = 0.10


def _kl(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.exp() * (a - b)).sum())


def measure(model, ids: torch.Tensor, name: str, context: int, steps: int) -> dict:
    """KL per step of ``dynamic`` vs ``name`` (exact) and ``name`` exact vs int8, teacher-forced over ``ids``."""
    names = {"float": "dynamic", "exact": name, "int8": f"{name}:dot=int8"}
    caches = {c: make_cache(n, model.config) for c, n in names.items()}
    own, int8 = [], []
    with torch.inference_mode():
        for cache in caches.values():
            model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True)
        for s in range(steps):
            lp = {}
            for c, cache in caches.items():
                out = model(
                    input_ids=ids[:, context + s : context + s + 1], past_key_values=cache, use_cache=True
                )
                lp[c] = torch.log_softmax(out.logits[0, -1].double(), -1)
            own.append(_kl(lp["float"], lp["exact"]))
            int8.append(_kl(lp["exact"], lp["int8"]))
    mean_own, mean_int8 = sum(own) / steps, sum(int8) / steps
    return {
        "cache": name,
        "kl_float_exact": own,
        "kl_exact_int8": int8,
        "mean_kl_float_exact": mean_own,
        "mean_kl_exact_int8": mean_int8,
        "ratio": mean_int8 / mean_own,
        "key_score_path": {c: caches[c].attention_paths() for c in ("exact", "int8")},
        "met": mean_int8 <= TARGET * mean_own,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="record to write (JSON)")
    p.add_argument("--context", type=int, default=2048, help="prompt tokens prefilled (default 2048)")
    p.add_argument("--steps", type=int, default=32, help="teacher-forced decode steps (default 32)")
    p.add_argument("--caches", default="kivi-4-fused,kivi-2-fused", help="fused KIVI caches, comma-separated")
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    a = p.parse_args(argv)
    if a.context < 1 or a.steps < 1:
        p.error(f"--context and --steps must be >= 1, got {a.context} and {a.steps}")
    out = Path(a.out)
    if out.exists() and not a.force:
        p.error(f"{out} exists (pass --force to replace it)")
    torch.set_num_threads(1)
    model, tok = load_model("smollm2-135m", dtype="float32")
    interface.enable(model)
    docs = Path(__file__).resolve().parents[1] / "docs"
    text = "\n".join(f.read_text(encoding="utf-8") for f in sorted(docs.glob("*.md")))
    ids = tok(text, return_tensors="pt").input_ids[:, : a.context + a.steps]
    if ids.shape[1] < a.context + a.steps:
        p.error(f"docs/*.md holds {ids.shape[1]} tokens, fewer than --context + --steps")
    rows = [measure(model, ids, name, a.context, a.steps) for name in a.caches.split(",")]
    record = {
        "format": FORMAT,
        "created_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(),
        "command": " ".join(
            ["python", "benchmarks/int8_kl.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "model": "smollm2-135m (float32)",
        "prompt": "docs/*.md concatenated",
        "context": a.context,
        "steps": a.steps,
        "kernel": cpu_kernel.describe(),
        "int8_path": cpu_kernel.key_score_path(4, model.config.head_dim, "int8"),
        "target": f"KL(exact || int8) <= {TARGET:.0%} of KL(float || exact)",
        "rows": rows,
    }
    atomic_write_json(out, record)
    for r in rows:
        print(
            f"{r['cache']}: KL(float || exact) {r['mean_kl_float_exact']:.5f}, KL(exact || int8) "
            f"{r['mean_kl_exact_int8']:.6f} ({r['ratio']:.1%}; target <= {TARGET:.0%}: "
            f"{'met' if r['met'] else 'not met'})"
        )
    print(f"wrote {out}")
    return 0 if all(r["met"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
