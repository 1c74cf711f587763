"""Compare two ``kvlab eval`` result files field for field, timings aside: what "the same run" means when the code
that ran it changed but the measurement must not have.

    python -m tests.eval_compare BEFORE.json AFTER.json [--text BEFORE.txt AFTER.txt]

Left out: wall-clock times and everything computed from them (``*_ms``, latency ratios, timing spread and
contention, ``elapsed_s``), the run's identity (label, creation time, command line, process id) and the machine's
load (``provenance.hardware``). Everything else — every quality number, byte count, row, failure, gate verdict and
the decision — must be equal. A gate verdict that rests on latency (``gates.latency_ratio``, and ``eligible`` and
the decision through it) differs between two runs of one code when a ratio lies near its gate; such a difference
is reported under its own heading, not hidden. Exit 0 when nothing but timings differ, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

# keys whose values are wall-clock times, or computed from them, anywhere in the result
TIMING_KEYS = {
    "median_ms",
    "min_ms",
    "timings_ms",
    "ms_per_token",
    "timing_spread",
    "timing_contention",
    "latency_trusted",
    "latency_ratio",
    "latency_ratio_min",
    "latency_ratio_max",
    "latency_ratio_unpaired",
    "decode_latency_ratio",
    "prefill_ms",
    "decode_ms",
    "fill_ms",
    "long_context_ms",
    "elapsed_s",
    "latency_warning",
}
# the run's identity and the machine's state: never equal between two runs
RUN_KEYS = {"label", "created_utc", "command", "argv", "running_in", "hardware"}
# where the checkout that ran it lies (the bundled model's folder)
IGNORED_PATHS = {"provenance.model.path"}
# verdicts that can rest on a latency ratio
LATENCY_VERDICTS = re.compile(
    r"(gates\.latency_ratio|\.eligible|eligible_|decision|selected_candidate|per_candidate)"
)


def differences(before: object, after: object, path: str = "") -> list[str]:
    """``"<path>: <before> != <after>"`` for every value that differs, timing and run keys left out."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        verdicts = path.endswith("gates")  # a gate's verdict is compared even where its metric is a time
        for key in sorted(set(before) | set(after), key=str):
            where = f"{path}.{key}" if path else str(key)
            if (key in TIMING_KEYS and not verdicts) or key in RUN_KEYS or where in IGNORED_PATHS:
                continue
            if key not in before or key not in after:
                out.append(f"{where}: only in {'after' if key not in before else 'before'}")
            else:
                out += differences(before[key], after[key], where)
        return out
    if isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            return [f"{path}: {len(before)} entries before, {len(after)} after"]
        return [d for i, (b, a) in enumerate(zip(before, after)) for d in differences(b, a, f"{path}[{i}]")]
    return [] if before == after else [f"{path}: {before!r} != {after!r}"]


_TIME_TEXT = re.compile(r"\d+(\.\d+)?\s*(ms|s|x|×)\b|\d+\.\d+")


def text_differences(before: str, after: str) -> list[str]:
    """Lines of two ``kvlab eval`` text outputs that differ once every decimal number is blanked (timings,
    ratios), warning lines about timings left out."""

    def lines(text: str) -> list[str]:
        keep = [ln for ln in text.splitlines() if "timed calls" not in ln and "elapsed" not in ln]
        return [_TIME_TEXT.sub("#", ln) for ln in keep]

    b, a = lines(before), lines(after)
    return [f"line {i}: {x!r} != {y!r}" for i, (x, y) in enumerate(zip(b, a)) if x != y] + (
        [f"{len(b)} lines before, {len(a)} after"] if len(b) != len(a) else []
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument(
        "--text", nargs=2, metavar=("BEFORE_TXT", "AFTER_TXT"), help="also compare the text outputs"
    )
    args = p.parse_args(argv)
    with open(args.before) as b, open(args.after) as a:
        diffs = differences(json.load(b), json.load(a))
    latency = [d for d in diffs if LATENCY_VERDICTS.search(d.split(":")[0])]
    other = [d for d in diffs if d not in latency]
    for title, found in (("differences", other), ("latency-dependent verdicts that differ", latency)):
        print(f"{title}: {len(found)}")
        for d in found:
            print("  " + d)
    if args.text:
        with open(args.text[0]) as b, open(args.text[1]) as a:
            text = text_differences(b.read(), a.read())
        print(f"text lines that differ (numbers blanked): {len(text)}")
        for d in text:
            print("  " + d)
    return 1 if other else 0


if __name__ == "__main__":
    sys.exit(main())
