"""Hostile input to ``kvlab eval --dry-run`` and ``kvlab report``: ``error: ...`` naming the value and exit
status 2, no traceback; a result file is never silently replaced; a failed model load is recorded."""

from __future__ import annotations

import json

import pytest

from kvlab.cli import main
from kvlab.eval.config import EvalConfig
from kvlab.eval.io import read_result


def dry(tmp_path, *argv):
    return main(["eval", "--dry-run", "--quick", "--out-dir", str(tmp_path), *argv])


def err_of(capsys):
    return " ".join(capsys.readouterr().err.split())  # rich wraps long lines


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--label", ""], "label"),
        (["--contexts", "256,256"], "contexts"),
        (["--window-residuals", "16,16"], "window_residuals"),
        (["--seed", "99999999999999999999"], "seed"),
        (["--seed", "-1"], "`seed` (--seed) must be an int >= 0, got -1"),  # ran; kvlab tasks --seed -1 refused it
        (["--model", ""], "--model) must name a hub id or a folder (or be None: the bundled model), got ''"),
        (["--model", "   "], "got ' '"),
        # one number, not a list: it read "`new_tokens` (--new-tokens) must hold positive integers, got 0"
        (["--new-tokens", "0"], "`new_tokens` (--new-tokens) must be an integer >= 1, got 0"),
        (["--repeat", "0"], "`repeat` (--repeat) must be an integer >= 1, got 0"),
    ],
)
def test_dry_run_bad_values_are_named(tmp_path, capsys, argv, fragment):
    assert dry(tmp_path, *argv) == 2
    err = err_of(capsys)
    assert "error:" in err and fragment in err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_out_dir_that_is_a_file(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    for out_dir, said in ((afile, "is a file; pass a folder"), (afile / "sub", f": {afile} is a file, not a folder")):
        assert main(["eval", "--dry-run", "--quick", "--label", "x", "--out-dir", str(out_dir)]) == 2
        err = err_of(capsys)
        assert f"error: --out-dir {out_dir}" in err and said in err and "Errno" not in err
    assert afile.read_text() == "keep me"


def test_out_dir_in_a_missing_folder_is_refused(tmp_path, capsys, monkeypatch):
    """An explicit --out-dir is made only in a folder that exists (one rule with kvlab report --html, tasks,
    paging, inspect, bench and figures): a typo'd parent is refused, exit 2, and no folder is made; it made
    every missing folder of the path. A new folder in one that exists, and the default results/, are made."""
    deep = tmp_path / "missing" / "deep"
    assert main(["eval", "--dry-run", "--quick", "--label", "x", "--out-dir", str(deep)]) == 2
    assert f"error: --out-dir {deep}: folder {deep.parent} does not exist" in err_of(capsys)
    assert list(tmp_path.iterdir()) == []
    assert main(["eval", "--dry-run", "--quick", "--label", "x", "--out-dir", str(tmp_path / "new")]) == 0
    assert (tmp_path / "new" / "x.json").is_file()
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--dry-run", "--quick", "--label", "x"]) == 0  # the default, made on a first run
    assert (tmp_path / "results" / "x.json").is_file()


def test_label_whose_file_is_a_directory_is_refused_even_with_force(tmp_path, capsys):
    (tmp_path / "plan.json").mkdir()
    assert dry(tmp_path, "--label", "plan", "--force") == 2
    assert "directory" in err_of(capsys)


def test_seed_range_matches_torch():
    EvalConfig(seed=0)
    EvalConfig(seed=2**64 - 1)
    for seed in (2**64, True, 1.5, -1):
        with pytest.raises(ValueError, match="seed"):
            EvalConfig(seed=seed)


def test_model_without_weights_is_refused_before_any_file(tmp_path, capsys):
    """A model folder that cannot be loaded is bad input, found before the result file (exit 2, as in kvlab lab,
    inspect and bench); it was exit 1 with a result recording the load failure."""
    model_dir = tmp_path / "empty-model"
    model_dir.mkdir()
    out = tmp_path / "res"
    assert main(["eval", "--quick", "--model", str(model_dir), "--label", "m", "--out-dir", str(out)]) == 2
    assert f"error: model directory '{model_dir}' has no config.json" in err_of(capsys)
    assert not out.exists()


def test_a_load_failure_is_recorded_and_reported(tmp_path, capsys, monkeypatch):
    def fail_to_load(*a, **k):
        raise OSError("weights could not be read")

    monkeypatch.setattr("kvlab.models.load_model", fail_to_load)
    out = tmp_path / "res"
    assert main(["eval", "--quick", "--label", "m", "--out-dir", str(out)]) == 1
    assert "could not load the model" in err_of(capsys)
    result = json.loads((out / "m.json").read_text())
    assert result["status"] == "failed" and result["failures"][0]["stage"] == "load_model"
    assert main(["report", str(out / "m.json")]) == 0
    printed = capsys.readouterr().out
    assert "failed at load_model" in " ".join(printed.split()) and "ctx None" not in printed


def test_model_with_config_but_no_weights_names_the_directory_and_what_is_missing(tmp_path, capsys):
    from kvlab.models import reference_model_path

    model_dir = tmp_path / "config-only"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((reference_model_path() / "config.json").read_text())
    out = tmp_path / "res"
    assert main(["eval", "--quick", "--model", str(model_dir), "--label", "m", "--out-dir", str(out)]) == 2
    err = err_of(capsys)
    assert str(model_dir) in err and "no weights (*.safetensors or pytorch_model.bin)" in err, err
    assert "no tokenizer files" in err and "sentencepiece" not in err and "backend tokenizer" not in err
    assert not out.exists()


def test_report_on_a_directory_or_undecodable_file(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "directory" in err_of(capsys)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="bin.json"):
        read_result(binary)
    assert main(["report", str(binary)]) == 2
    assert "bin.json" in err_of(capsys)


def test_report_html_onto_a_directory_is_refused_even_with_force(tmp_path, capsys):
    assert dry(tmp_path, "--label", "plan") == 0
    capsys.readouterr()
    target = tmp_path / "report"
    target.mkdir()
    assert main(["report", str(tmp_path / "plan.json"), "--html", str(target), "--force"]) == 2
    assert "directory" in err_of(capsys)
    assert target.is_dir()


def test_threads_refusal_names_no_python_none(tmp_path, capsys):
    """--threads 0 said "must be a positive integer or None": None is no value a user can type."""
    from kvlab.cli import main

    assert main(["eval", "--dry-run", "--out-dir", str(tmp_path), "--threads", "0"]) == 2
    err = capsys.readouterr().err
    assert "(--threads) must be a positive integer, got 0" in err and "None" not in err


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--threads", "0"], "--threads"),
        (["--residual", "100"], "--residual"),
        (["--recall-span", "1"], "--recall-span"),
    ],
)
def test_config_errors_name_the_flag(tmp_path, capsys, argv, flag):
    from kvlab.cli import main

    assert main(["eval", "--dry-run", "--out-dir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert f"({flag})" in err and not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "candidates, argv, flag",
    [
        ("dynamic,hqq-4", ["--group-size", "64"], "--group-size 64"),
        ("dynamic,kivi-4", ["--hqq-group-size", "32"], "--hqq-group-size 32"),
        ("dynamic,fp8-e4m3", ["--residual", "64"], "--residual 64"),
        ("dynamic,fp8-e4m3", ["--window-residuals", "16,32"], "--window-residuals 16,32"),
        ("dynamic,hqq-4", ["--kivi-attention", "fused"], "--kivi-attention fused"),
    ],
)
def test_a_cache_flag_no_candidate_takes_is_refused(tmp_path, capsys, candidates, argv, flag):
    """A setting that would be ignored (no candidate takes it) is an error naming the flag and its value."""
    assert dry(tmp_path, "--candidates", candidates, *argv) == 2
    err = err_of(capsys)
    assert f"error: {flag} applies to no candidate" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "candidates, argv",
    [
        ("dynamic,kivi-4", ["--group-size", "64", "--residual", "128"]),
        ("dynamic,hqq-4", ["--hqq-group-size", "32", "--residual", "64", "--window-residuals", "32"]),
        ("dynamic,fp8-e4m3", ["--window-residuals", "none"]),  # none turns the window matrix off: nothing ignored
    ],
)
def test_cache_flags_some_candidate_takes_are_accepted(tmp_path, candidates, argv):
    assert dry(tmp_path, "--candidates", candidates, "--label", "ok", *argv) == 0


@pytest.mark.parametrize("value", ["0", "3", "512,512"])
def test_retrieval_contexts_errors_name_the_flag(tmp_path, capsys, value):
    assert dry(tmp_path, "--retrieval-contexts", value) == 2
    err = err_of(capsys)
    assert "--retrieval-contexts" in err and value.split(",")[0] in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["", ",", " "])
def test_an_empty_retrieval_contexts_is_refused_not_read_as_none(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as exc:  # argparse: "" is neither 'all', 'none' nor a list of contexts
        dry(tmp_path, "--retrieval-contexts", value)
    assert exc.value.code == 2
    err = err_of(capsys)
    assert "--retrieval-contexts" in err and "'none'" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["", ",", " "])
def test_an_empty_window_residuals_is_refused_not_read_as_none(tmp_path, capsys, value):
    # '' silently dropped the residual-window matrix (as --contexts '' is refused, 'none' says it)
    with pytest.raises(SystemExit) as exc:
        dry(tmp_path, "--window-residuals", value)
    assert exc.value.code == 2
    err = err_of(capsys)
    assert f"argument --window-residuals: expected 'none' or comma-separated residual windows, got {value!r}" in err
    assert list(tmp_path.iterdir()) == []


def test_window_residuals_none_turns_the_window_matrix_off(tmp_path):
    assert dry(tmp_path, "--window-residuals", "none", "--label", "nowin") == 0
    plan = json.loads((tmp_path / "nowin.json").read_text())
    assert plan["settings"]["window_residuals"] == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--passkey-trials", "5"],
        ["--passkey-depths", "0.5"],
        ["--recall-rows", "3"],
        ["--recall-fractions", "0.5"],
        ["--recall-span", "16"],
        ["--retrieval-contexts", "all"],
        ["--max-recall-drop", "0.1"],
        ["--max-passkey-drop", "0.1"],
        ["--workers", "2"],  # helpers only share the probes
    ],
)
def test_long_context_flags_with_no_long_context_are_refused_not_ignored(tmp_path, capsys, argv):
    assert dry(tmp_path, "--no-long-context", *argv) == 2
    err = err_of(capsys)
    assert argv[0] in err and argv[1] in err and "--no-long-context" in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_recall_span_no_context_can_hold_is_refused(tmp_path, capsys):
    # --quick's largest capacity context is 1024: a 1024-token span leaves no copy distance in any prompt
    assert dry(tmp_path, "--recall-span", "1024") == 2
    err = err_of(capsys)
    assert "--recall-span 1024" in err and "1024" in err, err
    assert list(tmp_path.iterdir()) == []
    assert dry(tmp_path, "--recall-span", "64") == 0  # one that fits is still accepted


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--max-nll-delta", "nan"),
        ("--min-topk-overlap", "1.5"),
        ("--max-latency-ratio", "0"),
        ("--max-recall-drop", "2"),
        ("--max-passkey-drop", "-1"),
        ("--max-kl-mean", "inf"),
    ],
)
def test_gate_errors_name_the_flag(tmp_path, capsys, flag, value):
    assert dry(tmp_path, f"{flag}={value}") == 2
    err = err_of(capsys)
    assert f"({flag})" in err and value in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_prompt_without_repeat_mode_is_refused_not_ignored(tmp_path, capsys):
    # the held-out mode (the default) never reads --prompt
    assert dry(tmp_path, "--prompt", "hi there") == 2
    err = err_of(capsys)
    assert "--prompt" in err and "--prompt-mode repeat" in err, err
    assert list(tmp_path.iterdir()) == []
    assert dry(tmp_path, "--prompt-mode", "repeat", "--prompt", "hi there") == 0


def test_an_empty_out_dir_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # '' used to mean the current folder
    assert main(["eval", "--dry-run", "--quick", "--out-dir", "", "--label", "q"]) == 2
    assert "--out-dir must name a folder, got ''" in err_of(capsys)
    assert list(tmp_path.iterdir()) == []


def test_top_k_beyond_the_vocabulary_is_refused_before_any_cell(tiny_qwen2):
    """--top-k 100000 on an 8,192-token vocabulary failed in the first cell ('selected index k out of range')."""
    from kvlab.eval.config import EvalConfig
    from kvlab.eval.model_info import check_against_model

    vocab = tiny_qwen2.config.vocab_size
    check_against_model(EvalConfig(top_k=vocab), tiny_qwen2)
    with pytest.raises(ValueError, match=rf"--top-k\) {vocab + 1} exceeds the model's vocabulary \({vocab}"):
        check_against_model(EvalConfig(top_k=vocab + 1), tiny_qwen2)


def test_cells_past_the_model_position_limit_are_warned(tiny_qwen2):
    """--contexts 99999 planned and ran without a word on a model trained to 2,048 positions."""
    from kvlab.eval.model_info import context_limit_warnings, model_max_positions

    limit = model_max_positions(tiny_qwen2)
    assert limit == tiny_qwen2.config.max_position_embeddings
    assert context_limit_warnings(EvalConfig(contexts=(512,), new_tokens=64, window_residuals=()), limit) == []
    (w,) = context_limit_warnings(EvalConfig(contexts=(512, limit), new_tokens=64, window_residuals=()), limit)
    assert f"{limit + 64:,}" in w and f"max_position_embeddings ({limit:,})" in w
