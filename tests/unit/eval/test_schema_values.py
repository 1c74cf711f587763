"""Values, not only types, of an eval result given to ``kvlab report`` / ``kvlab figures --result``: NaN and
Infinity anywhere a number is read, fractions outside [0, 1], negative bytes and times, non-positive context
lengths, ``correct > trials``, no passkey depths, JSON nested too deeply or holding an over-long integer. Each is
one line ``<prog>: error: <file> ...`` naming the field and the value, exit status 2, nothing drawn; and the
atomic writer's errors name the destination, never its hidden temporary file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.eval.schema import validate_result
from kvlab.runtime.atomic import atomic_write_text

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("eval-*.json"))
EXAMPLE = ROOT / "docs" / "examples" / "eval-default-cpu-2026-12-01.json"  # rows[0] dynamic, rows[1] kivi-4


def _example() -> dict:
    return json.loads(EXAMPLE.read_text())


def _set(result: dict, path: str, value: object) -> dict:
    """``result`` with the dotted ``path`` (list indices as numbers) set to ``value``."""
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    target = result
    for k in keys[:-1]:
        target = target[k]
    target[keys[-1]] = value
    return result


NAN, INF = math.nan, math.inf

# (dotted path, bad value, the problem as printed)
BAD_VALUES = [
    ("rows.1.nll_delta", NAN, "rows[1].nll_delta: must be a finite number, got NaN"),
    ("rows.1.latency_ratio", INF, "rows[1].latency_ratio: must be a finite number >= 0, got Infinity"),
    ("rows.1.kl_mean", INF, "rows[1].kl_mean: must be a finite number >= 0, got Infinity"),
    ("rows.1.median_ms", NAN, "rows[1].median_ms: must be a finite number >= 0, got NaN"),
    ("rows.1.median_ms", -1.0, "rows[1].median_ms: must be a finite number >= 0, got -1.0"),
    ("rows.1.ms_per_token", -INF, "rows[1].ms_per_token: must be a finite number >= 0, got -Infinity"),
    ("rows.1.cache_bytes", INF, "rows[1].cache_bytes: must be a finite number >= 0, got Infinity"),
    ("rows.1.cache_bytes", -2048, "rows[1].cache_bytes: must be a finite number >= 0, got -2048"),
    ("rows.1.incremental_peak_bytes", -1, "rows[1].incremental_peak_bytes: must be a finite number >= 0, got -1"),
    ("rows.1.cache_bytes_ratio", NAN, "rows[1].cache_bytes_ratio: must be a finite number >= 0, got NaN"),
    ("rows.1.topk_overlap", NAN, "rows[1].topk_overlap: must be a fraction in [0, 1], got NaN"),
    ("rows.1.topk_overlap", 5.0, "rows[1].topk_overlap: must be a fraction in [0, 1], got 5.0"),
    ("rows.1.token_agreement_rate", -0.5, "rows[1].token_agreement_rate: must be a fraction in [0, 1], got -0.5"),
    ("rows.1.recall_accuracy", INF, "rows[1].recall_accuracy: must be a fraction in [0, 1], got Infinity"),
    ("rows.1.context_length", -256, "rows[1].context_length: must be an int >= 1, got -256"),
    ("rows.1.context_length", 0, "rows[1].context_length: must be an int >= 1, got 0"),
    ("gates.max_nll_delta", NAN, "gates.max_nll_delta: must be a finite number >= 0, got NaN"),
    ("gates.min_topk_overlap", INF, "gates.min_topk_overlap: must be a fraction in [0, 1], got Infinity"),
    ("gates.max_latency_ratio", 0, "gates.max_latency_ratio: must be a finite number > 0, got 0"),
    ("gates.max_kl_mean", NAN, "gates.max_kl_mean: must be a finite number >= 0, got NaN"),
    ("elapsed_s", INF, "elapsed_s: must be a finite number >= 0, got Infinity"),
    ("elapsed_s", -3.0, "elapsed_s: must be a finite number >= 0, got -3.0"),
    ("rows.0.passkey.ci95", [NAN, 1.0], "rows[0].passkey.ci95[0]: must be a fraction in [0, 1], got NaN"),
    ("rows.0.passkey.ci95", [0.9, 0.2], "rows[0].passkey.ci95: low 0.9 is above high 0.2"),
    ("rows.0.passkey.depths.0.ci95", [0.5, INF], "rows[0].passkey.depths[0].ci95[1]: must be a fraction in [0, 1], got Infinity"),
    ("rows.0.passkey.depths.0.correct", 50, "rows[0].passkey.depths[0].correct: 50 is more than rows[0].passkey.depths[0].trials 20"),
    ("rows.0.passkey.depths.0.correct", -1, "rows[0].passkey.depths[0].correct: must be an int >= 0, got -1"),
    ("rows.0.passkey.depths.0.trials", 0, "rows[0].passkey.depths[0].trials: must be an int >= 1, got 0"),
    ("rows.0.passkey.correct", 101, "rows[0].passkey.correct: 101 is more than rows[0].passkey.trials 100"),
    ("rows.0.passkey.depths.0.depth", NAN, "rows[0].passkey.depths[0].depth: must be a fraction in [0, 1], got NaN"),
    ("rows.0.passkey.depths", [], "rows[0].passkey.depths: must hold at least one depth, got []"),
    ("summary.selected_candidate.nll_delta", NAN, "summary.selected_candidate.nll_delta: must be a finite number, got NaN"),
    ("summary.selected_candidate.topk_overlap", 1.5, "summary.selected_candidate.topk_overlap: must be a fraction in [0, 1], got 1.5"),
    ("summary.eligible_candidate_count", -1, "summary.eligible_candidate_count: must be an int >= 0, got -1"),
    ("rows.1.recall.mean_nll", "x", 'rows[1].recall.mean_nll: must be a finite number, got "x"'),
    ("rows.1.recall.distances.0.distance_tokens", [], "rows[1].recall.distances[0].distance_tokens: must be an int >= 1, got []"),
    ("rows.1.recall.distances.0.accuracy_drop", {}, "rows[1].recall.distances[0].accuracy_drop: must be a finite number, got {}"),
    ("rows.1", None, "rows[1]: must be an object, got null"),
    ("rows.1.timing_spread", "x", 'rows[1].timing_spread: must be a finite number >= 0, got "x"'),
    ("rows.1.cache_counts", 3, "rows[1].cache_counts: must be an object, got 3"),
    ("rows.1.cache_counts", {"elements": "many"}, 'rows[1].cache_counts.elements: must be an int >= 0, got "many"'),
    ("summary.failed_candidates", "x", 'summary.failed_candidates: must be a list, got "x"'),
    ("summary.failed_candidates", [{"candidate": "kivi-2"}], "summary.failed_candidates[0]: lacks 'stage'"),
    ("command", 7, "command: must be a list, got 7"),
]  # fmt: skip
IDS = [f"{p}={v!r}" for p, v, _ in BAD_VALUES]


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_the_example_results_are_valid(example):
    assert validate_result(json.loads(example.read_text())) == []


@pytest.mark.parametrize("path, value, problem", BAD_VALUES, ids=IDS)
def test_bad_values_are_named_by_the_validator(path, value, problem):
    assert problem in validate_result(_set(_example(), path, value))


@pytest.mark.parametrize("path, value, problem", [*BAD_VALUES[:4], BAD_VALUES[-1]], ids=[*IDS[:4], IDS[-1]])
@pytest.mark.parametrize("mode", ["text", "json", "html"])
def test_report_refuses_a_bad_value_in_one_line(tmp_path, capsys, path, value, problem, mode):
    file = tmp_path / "r.json"
    file.write_text(json.dumps(_set(_example(), path, value)))  # NaN / Infinity, as Python's json writes them
    html = tmp_path / "r.html"
    argv = ["report", str(file), *({"text": [], "json": ["--json"], "html": ["--html", str(html)]}[mode])]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no table with "+nan ✓", no invalid JSON on stdout
    assert (
        err
        == f"kvlab report: error: {file} is not a valid kvlab eval result (nor a kvlab tasks result): {problem}\n"
    )
    assert not html.exists()


def test_no_passkey_depths_is_refused_before_any_figure_is_drawn(tmp_path, capsys):
    # used to leave 6 of 8 PNGs and no figures.json, then a TypeError traceback from the heatmap
    file = tmp_path / "r.json"
    file.write_text(json.dumps(_set(_example(), "rows.0.passkey.depths", [])))
    out = tmp_path / "figs"
    assert main(["figures", "--out", str(out), "--no-probe", "--no-append", "--result", str(file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rows[0].passkey.depths: must hold at least one depth, got []" in err, err
    assert not out.exists()
    assert main(["report", str(file), "--html", str(tmp_path / "r.html")]) == 2
    assert "rows[0].passkey.depths" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def _nested_result(depth: int) -> str:
    """The example result with an unchecked field nested ``depth`` lists deep (parsed, then refused)."""
    text = json.dumps(_example())
    return text.replace('"settings": {', '"junk": ' + "[" * depth + "]" * depth + ', "settings": {', 1)


BAD_JSON = [
    ("deep", "[" * 100_000 + "]" * 100_000, "its JSON nests too deeply to read"),
    ("deep-field", _nested_result(500), "its JSON nests 501 levels deep (a result nests 64 at most)"),
    ("long-int", '{"a": ' + "1" * 5000 + "}", "it holds an integer of 5,000 digits"),
    ("long-negative-int", '{"a": -' + "7" * 5000 + "}", "it holds an integer of 5,000 digits"),
]


@pytest.mark.parametrize("text, fragment", [b[1:] for b in BAD_JSON], ids=[b[0] for b in BAD_JSON])
@pytest.mark.parametrize("command", ["report", "report-html", "figures"])
def test_unreadable_json_is_named_by_file(tmp_path, capsys, text, fragment, command):
    file = tmp_path / "r.json"
    file.write_text(text)
    argv = {
        "report": ["report", str(file)],
        "report-html": ["report", str(file), "--html", str(tmp_path / "r.html")],
        "figures": [
            "figures",
            "--out",
            str(tmp_path / "figs"),
            "--no-probe",
            "--no-append",
            "--result",
            str(file),
        ],
    }[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    prog = "figures" if command == "figures" else "report"
    assert err.startswith(f"kvlab {prog}: error: {file} is not a kvlab eval result: {fragment}"), err
    assert err.count("\n") == 1 and "Traceback" not in err and "set_int_max_str_digits" not in err


# --- atomic writes: errors name the destination ------------------------------------------------------------


def _no_temp_files(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_atomic_write_into_a_missing_folder_names_the_destination(tmp_path):
    dest = tmp_path / "no-such-folder" / "r.json"
    with pytest.raises(FileNotFoundError) as info:
        atomic_write_text(dest, "x")
    assert info.value.filename == str(dest) and ".tmp" not in str(info.value), info.value
    assert str(info.value) == f"[Errno 2] No such file or directory: {str(dest)!r}"


def test_atomic_write_onto_a_directory_names_it_and_leaves_no_temp_file(tmp_path):
    dest = tmp_path / "r.json"
    dest.mkdir()
    with pytest.raises(IsADirectoryError) as info:
        atomic_write_text(dest, "x")
    assert info.value.filename == str(dest) and ".tmp" not in str(info.value), info.value
    assert _no_temp_files(tmp_path)


def test_atomic_write_keeps_an_error_of_write_itself(tmp_path):
    from kvlab.runtime.atomic import atomic_write

    def write(f):
        raise ValueError("bad object")

    with pytest.raises(ValueError, match="bad object"):
        atomic_write(tmp_path / "r.json", write)
    assert list(tmp_path.iterdir()) == []


def _refuse_temp_files(monkeypatch):
    """Make the folder take no files, as /proc does, whoever runs the test (root ignores permission bits)."""
    import tempfile

    def mkstemp(prefix="", suffix="", dir=None):
        raise FileNotFoundError(2, "No such file or directory", f"{dir}/{prefix}xi00b2yl{suffix}")

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def test_eval_out_dir_that_takes_no_file_is_a_clean_error(tmp_path, capsys, monkeypatch):
    _refuse_temp_files(monkeypatch)
    argv = ["eval", "--dry-run", "--quick", "--label", "x1", "--out-dir", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    dest = tmp_path / "x1.json"
    assert (
        err == f"kvlab eval: error: --out-dir {tmp_path}: cannot write {dest} (No such file or directory)\n"
    )


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_eval_out_dir_proc(capsys):
    assert main(["eval", "--dry-run", "--quick", "--label", "x1", "--out-dir", "/proc"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("kvlab eval: error: --out-dir /proc: cannot write /proc/x1.json (")
        and ".tmp" not in err
    )


def test_report_html_write_error_names_the_html_file(tmp_path, capsys, monkeypatch):
    _refuse_temp_files(monkeypatch)
    out = tmp_path / "r.html"
    assert main(["report", str(EXAMPLE), "--html", str(out)]) == 2
    err = capsys.readouterr().err  # refused before rendering, as tasks, paging and inspect refuse (output_problem)
    assert f"--html {out}: folder {tmp_path} takes no files" in err and ".tmp" not in err, err


def test_eval_result_write_error_during_a_run_is_a_clean_error(tmp_path, capsys, monkeypatch):
    import kvlab.commands.eval.run as eval_cmd

    dest = tmp_path / "x1.json"

    def run_real(args, cfg, result, path, err):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(eval_cmd, "_run_real", run_real)
    assert main(["eval", "--quick", "--label", "x1", "--out-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"kvlab eval: error: could not write the result {dest} (No space left on device)\n"
    )


def test_figures_out_folder_that_takes_no_file_is_a_clean_error(tmp_path, capsys, monkeypatch):
    # `kvlab figures --out /proc` used to end in a traceback naming the hidden temporary file
    _refuse_temp_files(monkeypatch)
    out = tmp_path / "figs"
    assert main(["figures", "--out", str(out), "--no-probe", "--no-append"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # refused before drawing (output_folder_problem), as report is
    assert err == f"kvlab figures: error: --out {out}: folder {tmp_path} takes no files (No such file or directory)"


@pytest.mark.parametrize(
    "argv", [["report", ""], ["figures", "--out", "{out}", "--no-probe", "--no-append", "--result", ""]]
)
def test_an_empty_result_path_is_refused_not_read_as_the_current_folder(tmp_path, capsys, argv):
    out = tmp_path / "figs"
    assert main([a.replace("{out}", str(out)) for a in argv]) == 2
    assert "a result file path is needed, got ''" in " ".join(capsys.readouterr().err.split())
    assert not out.exists()  # figures refused before drawing anything


@pytest.mark.parametrize("path, value, problem", BAD_VALUES[-10:-6], ids=IDS[-10:-6])
def test_sensitivity_verify_refuses_a_bad_row_in_one_line(tmp_path, capsys, path, value, problem):
    """The validator itself raised on these (a row that is not an object met the decision check: AttributeError; a
    recall mean NLL that is a string or a distance that is a list met the derived checks: TypeError), so every reader
    (kvlab report, figures --result, sensitivity verify) ended in a traceback."""
    file = tmp_path / "r.json"
    file.write_text(json.dumps(_set(_example(), path, value)))
    assert main(["sensitivity", "verify", str(file)]) == 2
    out, err = capsys.readouterr()
    assert not out and err == f"kvlab sensitivity verify: error: {file} is not a valid kvlab eval result: {problem}\n"


@pytest.mark.parametrize("path, value, problem", BAD_VALUES[-6:-1], ids=IDS[-6:-1])
def test_report_refuses_what_its_text_summary_reads(tmp_path, capsys, path, value, problem):
    """A timing spread that is a string (compared with a number: TypeError), FP8 counts that are not an object or
    not counts (summed: TypeError), failed candidates that are not a list of failures (indexed: TypeError) passed
    the validator and ended the text report in a traceback."""
    file = tmp_path / "r.json"
    file.write_text(json.dumps(_set(_example(), path, value)))
    assert main(["report", str(file)]) == 2
    out, err = capsys.readouterr()
    assert not out and f"(nor a kvlab tasks result): {problem}" in err and len(err.splitlines()) == 1, err
