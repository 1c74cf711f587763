"""The CPU targets of `kvlab bench kernel` records: the integer KIVI kernels' share of the copy bandwidth and KIVI-2's
time against KIVI-4's, each read beside the integer compute roof the record measured (``roof_us``,
``roof_fraction_of_copy``, ``fraction_of_roof``: :func:`kvlab.bench.kernel._roofed`), so a verdict says whether the
kernel or the machine's balance of compute and bandwidth stands in the way (Williams, Waterman and Patterson,
"Roofline", CACM 2009). Torch-free: ``kvlab bench docs`` re-evaluates stored records with it."""

from __future__ import annotations

CPU_FRACTION = 0.50  # integer KIVI kernels' GB/s over the copy bandwidth, CPU, at >= CPU_MIN_CONTEXT tokens
CPU_TWO_OVER_FOUR = 0.65  # kivi2-int8 time over kivi4-int8 time, CPU, at >= CPU_MIN_CONTEXT tokens
CPU_MIN_CONTEXT = 16384


def _roof_detail(rows: list[dict]) -> str:
    """Where the integer compute roof (``roof_fraction_of_copy``) keeps a kernel below :data:`CPU_FRACTION` at
    some context: "; the target is above this design's integer compute roof for kivi2-int8 at most 30% at 16384";
    else how close to its roof each kernel must run for the target and how close it ran ("; at this CPU's integer
    compute roof kivi4-int8 needs 44% of its roof at 16384 (ran at 28%)"); empty for records without the roof."""
    capped = [
        f"{n} at most {k['roof_fraction_of_copy']:.0%} at {r['context']}"
        for r in rows
        for n, k in r["kernels"].items()
        if k.get("roof_fraction_of_copy", 1.0) < CPU_FRACTION
    ]
    if capped:
        return "; the target is above this design's integer compute roof for " + ", ".join(capped)
    needs = [
        f"{n} needs {CPU_FRACTION / k['roof_fraction_of_copy']:.0%} of its roof at {r['context']} (ran at "
        f"{k['fraction_of_roof']:.0%})"
        for r in rows
        for n, k in r["kernels"].items()
        if k.get("roof_fraction_of_copy")
    ]
    return "; at this CPU's integer compute roof " + ", ".join(needs) if needs else ""


def _ratio_roof_detail(rows: list[dict]) -> str:
    """What the integer compute roof makes of the KIVI-2 / KIVI-4 time target: the two kernels' least times at the
    roof are their byte products' ratio (2-bit keys take one query digit, 4-bit keys two; values one product a code
    and row: ~0.67x for any GQA shape), so where that ratio is above :data:`CPU_TWO_OVER_FOUR` the target asks
    KIVI-2 to run closer to its roof than KIVI-4 does; only memory-bound kernels (their bytes, ~0.6x) meet it
    outright. Empty where a row lacks the roof."""
    at_roof = {
        r["context"]: r["kernels"]["kivi2-int8"]["roof_us"] / r["kernels"]["kivi4-int8"]["roof_us"]
        for r in rows
        if r["kernels"].get("kivi2-int8", {}).get("roof_us") and r["kernels"].get("kivi4-int8", {}).get("roof_us")
    }
    if not at_roof:
        return ""
    worst = max(at_roof.values())
    text = "; at the integer compute roof " + ", ".join(f"{v:.2f}x at {c}" for c, v in sorted(at_roof.items()))
    if worst > CPU_TWO_OVER_FOUR:
        text += (
            " (the byte products' ratio): above the target, which then needs kivi2-int8 closer to its roof than "
            "kivi4-int8, or both bound by memory"
        )
    return text


def evaluate_cpu_targets(result: dict) -> list[dict]:
    """The CPU targets of a record with integer kernels (none otherwise, or off the CPU): every ``kivi<b>-int8``
    kernel at >= :data:`CPU_FRACTION` of the copy bandwidth at every context >= :data:`CPU_MIN_CONTEXT` (a kernel
    marked ``in_cache`` may read from the CPU's cache, which only flatters it: below the target it still counts as
    not met; at or above it, it is named but not counted, and the status is ``not measured`` unless another kernel
    fails: :mod:`kvlab.bench.cache_resident`), and ``kivi2-int8``'s time <= :data:`CPU_TWO_OVER_FOUR` x ``kivi4-int8``'s there (its bytes are ~0.6x)."""
    if result.get("device_type") != "cpu":
        return []
    rows = [r for r in result["rows"] if r["status"] == "ok" and r["context"] >= CPU_MIN_CONTEXT]
    rows = [r for r in rows if any(n.endswith("-int8") for n in r.get("kernels", {}))]
    if not rows:
        return []
    cpu = result.get("settings", {}).get("isa", "?")
    int8 = [(r["context"], n, k) for r in rows for n, k in r["kernels"].items() if n.endswith("-int8")]
    frac = {(c, n): k["fraction_of_copy"] for c, n, k in int8}
    # a figure helped by the cache can only overstate DRAM speed: below the target it still fails, at or above it
    # proves nothing (not counted)
    unproven = sorted((c, n) for c, n, k in int8 if k.get("in_cache") and k["fraction_of_copy"] >= CPU_FRACTION)
    cached = {(c, n) for c, n, k in int8 if k.get("in_cache")}
    shown = ", ".join(f"{n} {v:.0%}{' (in cache)' if (c, n) in cached else ''} at {c}" for (c, n), v in sorted(frac.items()))
    parts = [shown]
    if unproven:
        parts.append(f"not counted, in cache (not a DRAM figure): {', '.join(f'{n} at {c}' for c, n in unproven)}")
    counted = [v for key, v in frac.items() if key not in unproven]
    failed = any(v < CPU_FRACTION for v in counted)
    status = "not met" if failed else "met" if counted and not unproven else "not measured"
    out = [
        {
            "description": f"integer KIVI kernels >= {CPU_FRACTION:.0%} of copy bandwidth at >= "
            f"{CPU_MIN_CONTEXT} tokens (CPU)",
            "status": status,
            "detail": "; ".join([*parts, f"path {cpu}"]) + _roof_detail(rows),
        }
    ]
    ratio = {
        r["context"]: r["kernels"]["kivi2-int8"]["us"] / r["kernels"]["kivi4-int8"]["us"]
        for r in rows
        if {"kivi2-int8", "kivi4-int8"} <= set(r["kernels"])
    }
    if ratio:
        out.append(
            {
                "description": f"kivi2-int8 time <= {CPU_TWO_OVER_FOUR:.2f}x kivi4-int8 at >= {CPU_MIN_CONTEXT} "
                "tokens (CPU)",
                "status": "met" if all(v <= CPU_TWO_OVER_FOUR for v in ratio.values()) else "not met",
                "detail": ", ".join(f"{v:.2f}x at {c}" for c, v in sorted(ratio.items()))
                + f"; path {cpu}"
                + _ratio_roof_detail(rows),
            }
        )
    return out


def roof_sentence(roof: dict | None, row: dict) -> str:
    """The integer compute roof of a kernel record (``int_roof``, :func:`kvlab.bench.kernel.int_roof_record`) and,
    at ``row``'s context, each integer kernel's least time under it (its bytes at that time as a share of copy, or
    ``in cache`` for a kernel whose bytes fit the last-level cache); empty for records without one."""
    ks = [(n, k) for n, k in row["kernels"].items() if "roof_us" in k]
    if not roof or not ks:
        return ""
    share = {n: f"{k['roof_fraction_of_copy']:.0%} of copy{', in cache' if k.get('in_cache') else ''}" for n, k in ks}
    at = [f"`{n}` {k['roof_us']:,.0f} µs ({share[n]}; it ran at {k['fraction_of_roof']:.0%} of this roof)" for n, k in ks]
    n = roof["threads"]
    return (
        f" Integer compute roof, measured in this run: {roof['gmac_s']:,.0f} G byte products/s ({roof['path']}, "
        f"{n} thread{'s' if n != 1 else ''}); the least time at it, {row['context']} tokens: {', '.join(at)}."
    )
