"""Plant known bugs in a temporary copy of kvlab and check that the eval's unit tests catch every one.

Each bug is a text patch of one file under ``src/kvlab``. The package is copied to a temporary directory, the patch
is applied to the copy only (the working tree is never touched), and the tests run in a fresh interpreter with the
copy first on ``PYTHONPATH``; the interpreter checks that ``kvlab`` was imported from the copy before pytest starts.
The unpatched copy runs first: every test must pass there, or no result means anything.

Usage::

    python scripts/check_planted_bugs.py               # every bug; exit 0 when each is caught
    python scripts/check_planted_bugs.py --only a,d    # some of them
    python scripts/check_planted_bugs.py --json        # machine-readable report

Exit status: 0 every planted bug made a test fail; 1 a bug survived or the unpatched copy failed; 2 a patch no
longer matches the code (update :data:`BUGS` together with the code it patches).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# the tests that must catch the bugs below
TESTS = (
    "tests/unit/eval/test_quality_metrics.py",
    "tests/unit/eval/test_gates_and_decision.py",
    "tests/unit/eval/test_eval_unit.py",
)


@dataclass(frozen=True, slots=True)
class Bug:
    key: str  # short name used by --only and in the report
    what: str  # the mistake, in words
    path: str  # file under src/kvlab/ that the patch edits
    old: str  # exact text that must occur once in that file
    new: str  # what replaces it


BUGS = (
    # the four bugs that once passed the whole suite
    Bug(
        "a",
        "NLL scored against the token after the right one",
        "eval/metrics.py",
        'F.cross_entropy(logits, target, reduction="sum")',
        'F.cross_entropy(logits, continuation[:, min(step + 1, n - 1)], reduction="sum")',
    ),
    Bug(
        "b",
        "NLL averaged over steps only (batch dropped)",
        "eval/metrics.py",
        '"mean_nll": nll_sum / (n * continuation.shape[0]),',
        '"mean_nll": nll_sum / n,',
    ),
    Bug(
        "c",
        "top-k overlap with the union instead of the intersection",
        "eval/metrics.py",
        "len(set(b) & set(c)) / k",
        "len(set(b) | set(c)) / k",
    ),
    Bug(
        "d",
        "NLL gate comparison flipped (>= instead of <=)",
        "eval/decision.py",
        "nll is not None and nll <= gates.max_nll_delta",
        "nll is not None and nll >= gates.max_nll_delta",
    ),
    # neighbours of those four: off-by-boundary gates, another batch mistake, the selection reversed
    Bug(
        "a2",
        "NLL scored on batch row 0 only",
        "eval/metrics.py",
        'F.cross_entropy(logits, target, reduction="sum")',
        'F.cross_entropy(logits[:1], target[:1], reduction="sum") * logits.shape[0]',
    ),
    Bug(
        "d2",
        "NLL gate strict (< instead of <=): a delta on the boundary fails",
        "eval/decision.py",
        "nll is not None and nll <= gates.max_nll_delta",
        "nll is not None and nll < gates.max_nll_delta",
    ),
    Bug(
        "d3",
        "top-k gate strict (> instead of >=)",
        "eval/decision.py",
        "topk is not None and topk >= gates.min_topk_overlap",
        "topk is not None and topk > gates.min_topk_overlap",
    ),
    Bug(
        "d4",
        "latency gate flipped",
        "eval/decision.py",
        '"latency_ratio": row["latency_ratio"] <= gates.max_latency_ratio',
        '"latency_ratio": row["latency_ratio"] >= gates.max_latency_ratio',
    ),
    Bug(
        "d5",
        "a row that saves no bytes passes the memory gate",
        "eval/decision.py",
        '"saves_memory": row["cache_bytes_saved"] > 0',
        '"saves_memory": row["cache_bytes_saved"] >= 0',
    ),
    Bug(
        "e",
        "decision selects the eligible row that saves the fewest bytes",
        "eval/decision.py",
        'most = max(r["cache_bytes_saved"] for r in eligible)',
        'most = min(r["cache_bytes_saved"] for r in eligible)',
    ),
    Bug(
        "f",
        "first divergence taken from the last row instead of the earliest over rows",
        "eval/metrics.py",
        '"first_divergence_index": min(diverged) if diverged else None,',
        '"first_divergence_index": diverged[-1] if diverged else None,',
    ),
)

# failed tests listed per bug in the text report
SHOWN = 8

# runs in the child interpreter: refuse to test anything but the copy, then run pytest
_CHILD = """
import sys
from pathlib import Path
import kvlab
copy = Path(sys.argv[1]).resolve()
if copy not in Path(kvlab.__file__).resolve().parents:
    print(f"kvlab was imported from {kvlab.__file__}, not from the copy under {copy}", file=sys.stderr)
    sys.exit(3)
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--junitxml=" + sys.argv[2], *sys.argv[3:]]))
"""


def failed_tests(junit_xml: Path) -> list[str]:
    """``file::test`` ids of the failed or errored test cases in a pytest JUnit XML report."""
    failed = []
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname', '')}::{case.get('name', '')}")
    return failed


def run_tests(src: Path, work: Path, tests: tuple[str, ...]) -> tuple[int, list[str], str]:
    """Run ``tests`` against the package under ``src``; returns (pytest exit code, failed test ids, output tail)."""
    junit = work / "junit.xml"
    junit.unlink(missing_ok=True)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(src), str(junit), *tests],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode == 3:
        raise RuntimeError(proc.stderr.strip())
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
    return proc.returncode, failed_tests(junit) if junit.exists() else [], tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated bug keys (default: all)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    bugs = BUGS
    if args.only:
        keys = args.only.split(",")
        unknown = sorted(set(keys) - {b.key for b in BUGS})
        if unknown:
            parser.error(f"unknown bug key(s) {unknown}; known: {[b.key for b in BUGS]}")
        bugs = tuple(b for b in BUGS if b.key in keys)

    with tempfile.TemporaryDirectory(prefix="kvlab-planted-") as tmp:
        work = Path(tmp)
        src = work / "src"
        shutil.copytree(REPO / "src" / "kvlab", src / "kvlab", ignore=shutil.ignore_patterns("__pycache__"))
        stale = [b for b in bugs if (src / "kvlab" / b.path).read_text().count(b.old) != 1]
        if stale:
            for b in stale:
                print(f"bug {b.key}: the text to patch no longer occurs exactly once in {b.path}: {b.old!r}")
            return 2

        code, failed, tail = run_tests(src, work, TESTS)
        report = {"tests": list(TESTS), "clean": {"exit_code": code, "failed": failed}, "bugs": []}
        ok = code == 0
        if not ok:
            print(f"the unpatched copy does not pass (exit {code}):\n{tail}", file=sys.stderr)
        for b in bugs:
            target = src / "kvlab" / b.path
            original = target.read_text()
            target.write_text(original.replace(b.old, b.new))
            try:
                code, failed, tail = run_tests(src, work, TESTS)
            finally:
                target.write_text(original)
            caught = bool(failed)
            ok = ok and caught
            report["bugs"].append(
                {
                    "key": b.key,
                    "what": b.what,
                    "path": b.path,
                    "caught": caught,
                    "exit_code": code,
                    "failed": failed,
                }
            )
            if not args.json:
                print(f"[{'caught' if caught else 'SURVIVED'}] {b.key}: {b.what} ({b.path})")
                for t in failed[:SHOWN]:
                    print(f"    {t}")
                if len(failed) > SHOWN:
                    print(f"    ... and {len(failed) - SHOWN} more (--json lists all)")
                if not caught:
                    print(f"    pytest exit {code}: {tail}")
    if args.json:
        print(json.dumps(report, indent=2))
    elif report["clean"]["exit_code"] == 0:
        print(
            f"unpatched copy: all tests pass; {sum(b['caught'] for b in report['bugs'])}/{len(bugs)} bugs caught"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
