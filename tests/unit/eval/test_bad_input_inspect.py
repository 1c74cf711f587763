"""Hostile input to ``kvlab inspect``: refused with exit status 2 and the flag named, before any work; never a
flag silently ignored or one result file written over another.
"""

from __future__ import annotations

import pytest

from kvlab.cli import main


def err_of(capsys):
    return " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("flag, value", [("--tokens", "4"), ("--offset", "3")])
def test_held_out_flags_with_a_prompt_are_refused(tmp_path, capsys, flag, value):
    prompt = "hello world this is a long prompt with many tokens in it"
    assert main(["inspect", "--prompt", prompt, flag, value, "--json", str(tmp_path / "r.json")]) == 2
    err = err_of(capsys)
    assert flag in err and "--prompt" in err
    assert list(tmp_path.iterdir()) == []


def test_json_and_figure_onto_one_path_are_refused(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["inspect", "--tokens", "16", "--json", str(out), "--figure", str(out)]) == 2
    assert "--figure" in err_of(capsys) and not out.exists()


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda p: p, "does not exist"),
        (lambda p: p.mkdir(), "has no config.json"),
        (lambda p: p.touch(), "is a file"),
    ],
    ids=["missing", "no-config", "a-file"],
)
def test_a_missing_model_directory_is_bad_input(tmp_path, capsys, make, said):
    model = tmp_path / "none"
    make(model)
    assert main(["inspect", "--model", str(model), "--tokens", "16"]) == 2
    err = err_of(capsys)
    assert err.startswith("kvlab inspect: error: ") and said in err


def test_a_cut_past_the_held_out_text_names_the_flags(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["inspect", "--offset", "99999999", "--tokens", "16", "--json", str(out)]) == 2
    err = err_of(capsys)
    assert "--offset 99999999" in err and "--tokens 16" in err and "n_tokens" not in err, err
    assert not out.exists()


@pytest.mark.parametrize("name", ["k.pdf", "k.svg", "k.jpg", "k"])
def test_a_figure_path_that_is_not_png_is_refused_before_any_work(tmp_path, capsys, name):
    # the figure is always PNG: k.pdf used to get PNG bytes under a .pdf name
    out = tmp_path / name
    assert main(["inspect", "--tokens", "16", "--figure", str(out)]) == 2
    err = err_of(capsys)
    assert "--figure" in err and name in err and ".png" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--dtype", "bogus"], "--dtype must be one of ['bfloat16', 'float16', 'float32'] (or bf16, fp16, fp32; any case), got 'bogus'"),
        (["--calibrate-tokens", "0"], "--calibrate-tokens must be >= 1, got 0"),
        (
            ["--tokens", "16", "--calibrate-tokens", "17"],
            "--calibrate-tokens must be an int in [1, 16] (--tokens), got 17",
        ),
        (
            ["--prompt", "a short prompt", "--calibrate-tokens", "-3"],
            "--calibrate-tokens must be >= 1, got -3",
        ),
    ],
)
def test_a_bad_dtype_or_calibration_size_is_refused_before_the_model_loads(monkeypatch, capsys, argv, said):
    # both were refused only after the load (and, for --calibrate-tokens, a 2,048-token prefill)
    import kvlab.eval.inspect

    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(kvlab.eval.inspect, "inspect_model", no_load)
    assert main(["inspect", *argv]) == 2
    err = err_of(capsys)
    assert err == f"kvlab inspect: error: {said}", err
