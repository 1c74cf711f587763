"""``kvlab plan MODEL --from-log FILE`` refuses the values of the flags it reads (``--gpu-mem-gib``, ``--tp``,
``--context``, ``--block-size``, ``--weight-bytes``) as plain ``kvlab plan`` does, with the same message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.cli import main

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm_startup_logs"
KIMI = str(DATA / "configs" / "kimi-k2-thinking.json")
KIMI_LOG = str(DATA / "logs" / "recipes-kimi-k2-thinking-tp8.log")  # states TP only: no memory, no max_model_len


def _error(capsys, argv: list[str]) -> str:
    """The one-line refusal of ``kvlab plan argv`` (exit 2, argparse's included; nothing on stdout)."""
    try:
        rc = main(["plan", *argv])
    except SystemExit as e:  # argparse's refusal of a flag's type
        rc = e.code
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""
    return captured.err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "flags",
    [
        ["--gpu-mem-gib", "inf"],  # was an OverflowError traceback
        ["--gpu-mem-gib", "nan"],  # was "cannot convert float NaN to integer"
        ["--gpu-mem-gib", "0"],  # was accepted: "no memory prediction"
        ["--gpu-mem-gib", "-3"],
        ["--gpu-mem-gib", "-3", "--weight-bytes", "1000000000"],  # was "got -3221225472" (bytes)
        ["--gpu-mem-gib", "1e308"],
        ["--tp", "0"],
        ["--context", "-5"],
        ["--weight-bytes", "-3"],
    ],
)
def test_from_log_refuses_a_flag_value_as_plain_plan_does(flags, capsys):
    plain = _error(capsys, [KIMI, *flags])
    from_log = _error(capsys, [KIMI, "--from-log", KIMI_LOG, *flags])
    assert from_log == plain
    assert flags[0] in from_log and flags[1] in from_log.replace("1e+308", "1e308").replace(".0", "")


def test_from_log_names_a_block_size_vllm_lacks_before_reading_the_log(capsys):
    err = _error(capsys, [KIMI, "--from-log", KIMI_LOG, "--block-size", "7"])
    assert err.startswith("kvlab plan: error: --block-size must be one of [1, 8, 16, 32") and err.endswith("got 7")


@pytest.mark.parametrize("total", [float("inf"), float("nan"), 0.0, -3.0])
def test_explain_vllm_log_refuses_a_device_memory_that_is_not_finite_and_positive(total):
    """The library's ``total_gib`` (what --gpu-mem-gib gives), named as the library's parameter: inf was an
    OverflowError, 0 no memory prediction."""
    from kvlab.plan.load import load_config
    from kvlab.plan.spec import spec_from_config
    from kvlab.plan.vllm_log import explain_vllm_log, read_vllm_log

    config = load_config(KIMI)
    log = read_vllm_log(Path(KIMI_LOG).read_text())
    with pytest.raises(ValueError, match="`total_gib` must be a finite number of GiB > 0, got"):
        explain_vllm_log(log, spec_from_config(config), config, total_gib=total, weight_bytes=10**9)


def _warnings(capsys, argv: list[str]) -> tuple[list[str], list[str]]:
    """``(the --json output's warnings, the warning lines on stderr)`` of ``kvlab plan argv --json`` (exit 0)."""
    assert main(["plan", *argv, "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out)["warnings"], [x for x in captured.err.splitlines() if "warning:" in x]


def test_from_log_warns_of_a_context_beyond_the_models_limit_as_plain_plan_does(capsys):
    """The kimi log states no max_model_len: --context 10000000 (kimi's limit is 262,144) was taken silently."""
    from kvlab.plan.load import load_spec

    beyond = str(load_spec(KIMI).max_position_embeddings * 40)  # kimi: no rope scaling beyond it
    plain, plain_err = _warnings(capsys, [KIMI, "--context", beyond])
    from_log, from_log_err = _warnings(capsys, [KIMI, "--from-log", KIMI_LOG, "--context", beyond])
    assert plain and from_log == plain and from_log_err == plain_err and len(from_log_err) == 1
    within, err = _warnings(capsys, [KIMI, "--from-log", KIMI_LOG, "--context", "8192"])
    assert within == [] and err == []
