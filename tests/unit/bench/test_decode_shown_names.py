"""``kvlab bench decode`` output spoke of ``kivi4-fused`` and ``hqq4`` where the rest of the product says
``kivi-4`` / ``hqq-4``. Those spellings are the keys of the stored records (``rows[].candidate``,
``candidates[].name``, ``profile``), which old records hold and the targets match on, so the records keep them;
what a user reads (the tables, attention paths, failures, profile and target lines) uses the registry's names."""

import json
import re
from pathlib import Path

from kvlab.bench import docs
from kvlab.bench.decode import evaluate_lead_targets, evaluate_target
from kvlab.bench.results import display_name as shown_name

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
LEGACY = re.compile(r"\b(?:kivi|hqq|quanto)[0-9]")  # kivi4-fused, hqq4, quanto4: a digit right after the family


def _record(name: str) -> dict:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def test_stored_records_keep_the_legacy_keys_and_still_read():
    result = _record("decode-cpu.json")["result"]
    keys = {r["candidate"] for r in result["rows"]}
    assert {"kivi4-fused", "hqq4"} <= keys  # what the committed records hold: renaming them would break reading
    assert evaluate_target(result)["status"] in ("met", "not met")  # judged on those keys


def test_the_rendered_decode_section_shows_registry_names():
    result = _record("decode-cpu.json")["result"]
    text = docs.render_decode(result)
    assert "`kivi-4-fused`" in text and "`hqq-4`" in text
    assert not LEGACY.search(text), LEGACY.findall(text)


def test_target_lines_show_registry_names():
    for name in ("decode-cpu.json", "decode-cpu-1thread.json"):
        result = _record(name)["result"]
        lines = [evaluate_target(result)["description"], *(v["description"] for v in evaluate_lead_targets(result))]
        assert lines[0].startswith("kivi-4-fused decode")
        assert not any(LEGACY.search(line) for line in lines), lines


def test_shown_name_spells_legacy_names_in_the_grammar_and_leaves_others():
    assert [shown_name(n) for n in ("kivi4-fused", "hqq4", "quanto4", "kivi4:dot=int8")] == [
        "kivi-4-fused",
        "hqq-4",
        "quanto-4",
        "kivi-4:dot=int8",
    ]
    for same in ("dynamic", "dynamic-ckernel", "fp8-e4m3-hadamard", "kivi-4", "not a cache!", ""):
        assert shown_name(same) == same


def test_the_integer_path_target_shows_the_registry_name():
    from kvlab.bench.decode import evaluate_int8_target

    (verdict,) = evaluate_int8_target(_record("decode-cpu-int8-1thread.json")["result"])
    assert verdict["description"].startswith("kivi-4:dot=int8 decode") and verdict["status"] != "not measured"
