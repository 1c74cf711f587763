"""Settings the loaded model refutes are refused right after loading, before any cell (``kvlab eval --group-size
48`` on head_dim 64 failed in every KIVI cell and exited 0), and a candidate that failed in every cell fails the
run (exit 1, named next to the decision) instead of being silently left out of it."""

from __future__ import annotations

import json

import pytest

from kvlab.cli import main
from kvlab.eval import candidates as cand_mod
from kvlab.eval.config import EvalConfig
from kvlab.eval.model_info import check_against_model
from kvlab.eval.schema import validate_result
from tests.conftest import make_tiny_qwen2
from tests.unit.eval.test_eval_unit import CharTokenizer


def err_of(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())  # rich wraps long lines


@pytest.fixture(scope="module")
def head64():
    """A tiny Qwen2 with the bundled model's head_dim (64) and KV heads (2)."""
    return make_tiny_qwen2(head_dim=64, max_positions=2048)


# ── settings the loaded model refutes ─────────────────────────────────────────────────────────────────────────────


def test_a_kivi_group_size_that_does_not_divide_head_dim_is_refused(head64):
    """--group-size 48 --residual 96 on head_dim 64: every KIVI cell failed at generate, and the run exited 0."""
    cfg = EvalConfig(group_size=48, residual_length=96, window_residuals=())
    with pytest.raises(ValueError) as info:
        check_against_model(cfg, head64)
    message = str(info.value)
    assert "`group_size` (--group-size) 48 does not divide the model's head_dim (64)" in message
    assert "['kivi-4', 'kivi-2']" in message and "32, 16 or 8" in message  # divisors of 64 that divide 96
    check_against_model(EvalConfig(group_size=32, residual_length=96, window_residuals=()), head64)


def test_a_window_group_size_is_checked_with_its_own_flag(head64):
    cfg = EvalConfig(window_residuals=(24, 48), window_group_size=24)
    with pytest.raises(ValueError, match=r"`window_group_size` \(--window-group-size\) 24 does not divide"):
        check_against_model(cfg, head64)
    check_against_model(
        EvalConfig(window_residuals=(24, 48), window_group_size=24, candidates=("dynamic", "fp8-e4m3")),
        head64,
    )


def test_an_hqq_group_size_the_kv_shape_refutes_is_refused(head64):
    pytest.importorskip("hqq")
    cfg = EvalConfig(candidates=("dynamic", "hqq-4"), hqq_group_size=48, window_residuals=())
    with pytest.raises(ValueError, match=r"`hqq_group_size` \(--hqq-group-size\) 48 does not divide") as info:
        check_against_model(cfg, head64)
    assert "2 KV heads x 512 tokens x head_dim 64" in str(info.value)
    check_against_model(EvalConfig(candidates=("dynamic", "hqq-4"), hqq_group_size=128), head64)


def test_eval_refuses_a_refuted_group_size_right_after_loading(tmp_path, capsys):
    """The bundled model (head_dim 64) loads, and the run stops with exit 2 before any cell."""
    argv = ["eval", "--quick", "--group-size", "48", "--residual", "96", "--threads", "1"]
    assert main([*argv, "--out-dir", str(tmp_path), "--label", "g48"]) == 2
    err = err_of(capsys)
    assert "error: `group_size` (--group-size) 48 does not divide the model's head_dim (64)" in err, err
    result = json.loads((tmp_path / "g48.json").read_text())
    assert result["status"] == "failed" and result["rows"] == []
    assert result["failures"][0]["stage"] == "settings"


def test_a_mixed_plan_for_another_layer_count_is_refused_right_after_loading(tmp_path, capsys, monkeypatch):
    """A plan of 6 layers on the bundled model (4): every cell failed at construct, each one after the other;
    now the run stops with exit 2 before any cell, naming the candidate and the layer, as kvlab tasks does."""
    import kvlab.plan.mixed

    plan = {"kvlab_plan": 1, "layers": {"5": {"k": "kivi-8", "v": "kivi-8"}, "*": {"k": "kivi-4", "v": "kivi-4"}}}
    # the registry lists plan names at import: mixed-demo is read as this plan instead
    monkeypatch.setattr(kvlab.plan.mixed, "find_plan", lambda name: (plan, "test"))
    argv = ["eval", "--quick", "--candidates", "dynamic,mixed-demo", "--threads", "1"]
    assert main([*argv, "--out-dir", str(tmp_path), "--label", "m6"]) == 2
    err = err_of(capsys)
    assert "error: cache candidate 'mixed-demo' does not fit this model: plan names layer 5" in err, err
    result = json.loads((tmp_path / "m6.json").read_text())
    assert result["status"] == "failed" and result["rows"] == []
    assert result["failures"][0]["stage"] == "settings"


# ── a candidate that failed in every cell ─────────────────────────────────────────────────────────────────────────

TINY_RUN = [
    "eval",
    "--candidates",
    "dynamic,kivi-8,kivi-2",
    "--contexts",
    "40,72",
    "--new-tokens",
    "6",
    "--residual",
    "16",
    "--group-size",
    "16",
    "--window-residuals",
    "none",
    "--warmup",
    "0",
    "--repeat",
    "1",
    "--quality-tokens",
    "4",
    "--prompt-mode",
    "repeat",
    "--device",
    "cpu",
    "--dtype",
    "float32",
    "--no-long-context",
    "--threads",
    "1",
]


def test_a_candidate_that_failed_in_every_cell_fails_the_run(tmp_path, capsys, monkeypatch):
    """kivi-2 failing in every cell left a decision about the others and exit 0."""
    model = make_tiny_qwen2(head_dim=16, max_positions=512)
    monkeypatch.setattr("kvlab.models.load_model", lambda *a, **k: (model, CharTokenizer()))
    real_make = cand_mod.Candidate.make

    def make(self, *a, **k):
        if self.name == "kivi-2":
            raise RuntimeError("boom from kivi-2")
        return real_make(self, *a, **k)

    monkeypatch.setattr(cand_mod.Candidate, "make", make)
    assert main([*TINY_RUN, "--out-dir", str(tmp_path), "--label", "f"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "not judged: kivi-2 failed in every capacity cell (first at construct: RuntimeError: boom from kivi-2)"
        in out
    )
    result = json.loads((tmp_path / "f.json").read_text())
    assert result["status"] == "partial" and validate_result(result) == []
    assert result["summary"]["failed_candidates"] == [
        {"candidate": "kivi-2", "stage": "construct", "type": "RuntimeError", "message": "boom from kivi-2"}
    ]
    monkeypatch.setattr(cand_mod.Candidate, "make", real_make)  # nothing fails: exit 0, no failed candidate
    assert main([*TINY_RUN, "--out-dir", str(tmp_path), "--label", "ok"]) == 0
    assert json.loads((tmp_path / "ok.json").read_text())["summary"]["failed_candidates"] == []


# ── contexts the held-out text cannot hold ────────────────────────────────────────────────────────────────────────


def test_a_context_longer_than_the_heldout_text_is_refused_naming_the_flag_and_the_limit():
    """--contexts 99999999 loaded the model, then failed in the run (exit 1) naming no flag: the held-out text the
    prompts and probes are cut from is the limit."""
    from kvlab.eval.longctx.prompts import encode_heldout
    from kvlab.eval.model_info import check_heldout_length
    from kvlab.models import heldout_text

    tok = CharTokenizer()
    total = len(encode_heldout(tok, heldout_text()))
    check_heldout_length(EvalConfig(contexts=(256, total), window_residuals=()), tok)
    with pytest.raises(ValueError) as info:
        check_heldout_length(EvalConfig(contexts=(256, total + 1), window_residuals=()), tok)
    message = str(info.value)
    assert f"`contexts` (--contexts) {total + 1} is longer than the held-out text, {total:,} tokens" in message
    # the suggested value is plain: pasted into --contexts, a comma list, "1,234" would be two contexts
    suggested = message.split("pass at most ")[1].split()[0]
    assert suggested == str(total), message
    from kvlab.cli import build_parser

    assert build_parser().parse_args(["eval", "--contexts", suggested]).contexts == (total,)
    # the window context is cut from the same text, named with its own flag
    with pytest.raises(ValueError, match=r"`window_context` \(--window-context\)"):
        check_heldout_length(EvalConfig(contexts=(256,), window_residuals=(16,), window_context=total + 1), tok)
    # repeated prompts without the probes read no held-out text: no limit from it
    repeat = EvalConfig(contexts=(total + 1,), window_residuals=(), prompt_mode="repeat", long_context=False)
    check_heldout_length(repeat, tok)
    with pytest.raises(ValueError, match="from which the long-context probes are cut"):
        check_heldout_length(EvalConfig(contexts=(total + 1,), window_residuals=(), prompt_mode="repeat"), tok)


def test_eval_refuses_a_context_past_the_heldout_text_before_any_cell(tmp_path, capsys, monkeypatch):
    model = make_tiny_qwen2(head_dim=16, max_positions=512)
    monkeypatch.setattr("kvlab.models.load_model", lambda *a, **k: (model, CharTokenizer()))
    argv = [a for a in TINY_RUN if a not in ("--prompt-mode", "repeat", "--no-long-context")]
    argv[argv.index("40,72")] = "40,99999999"
    # past the positions too: allowed here, to reach the held-out text's own limit
    assert main([*argv, "--allow-past-limit", "--out-dir", str(tmp_path), "--label", "long"]) == 2
    err = err_of(capsys)
    assert "error: `contexts` (--contexts) 99999999 is longer than the held-out text" in err, err
    result = json.loads((tmp_path / "long.json").read_text())
    assert result["status"] == "failed" and result["rows"] == []
    assert result["failures"][0]["stage"] == "settings"


# ── cells that cannot fit in memory ───────────────────────────────────────────────────────────────────────────────


def test_a_cell_too_large_for_the_memory_is_refused_naming_the_flag_the_bytes_and_what_fits(head64):
    """``--prompt-mode repeat --no-long-context`` reads no held-out text, so nothing bounded --contexts: 99999999
    loaded the model and died in the first cell (a 51 GB allocation), exit 0. The estimate is worded by the shared
    ``memory_refusal``, with the longest context that fits."""
    import torch

    from kvlab.commands.eval.run import cell_peak_bytes, memory_problem
    from kvlab.lab.longrun import gib

    cpu = torch.device("cpu")
    cfg = EvalConfig(contexts=(40, 99_999_999), window_residuals=(), prompt_mode="repeat", long_context=False)
    problem = memory_problem(cfg, head64, cpu, available=2**30)
    need = cell_peak_bytes(head64.config, 99_999_999, cfg.new_tokens, 1, 4)
    assert problem.startswith("--contexts 99999999 with 64 new tokens (one prefill's activations")
    assert f"needs about {gib(need)} of memory, the machine has 1.00 GiB available" in problem
    fits = int(problem.rsplit("at most about ", 1)[1].split(" tokens fit")[0].replace(",", ""))
    assert cell_peak_bytes(head64.config, fits, 64, 1, 4) <= 2**30 < cell_peak_bytes(head64.config, fits + 1, 64, 1, 4)
    # a run that fits, and an unknown amount of memory, are not refused
    assert memory_problem(EvalConfig(contexts=(40, 72), window_residuals=()), head64, cpu, available=2**30) is None
    assert memory_problem(cfg, head64, cpu, available=None) is None
    # the window cell is named by its own flag; a batch multiplies every token
    window = EvalConfig(contexts=(40,), window_residuals=(16,), window_context=99_999_999)
    assert memory_problem(window, head64, cpu, available=2**30).startswith("--window-context 99,999,999")
    batched = memory_problem(EvalConfig(contexts=(40, 2**20), window_residuals=(), batch=8), head64, cpu, 2**30)
    assert batched.startswith("--contexts 1048576 with 64 new tokens at --batch 8") and "fit at --batch 8" in batched


def test_eval_refuses_a_context_that_cannot_fit_before_any_cell(tmp_path, capsys, monkeypatch):
    model = make_tiny_qwen2(head_dim=16, max_positions=512)
    monkeypatch.setattr("kvlab.models.load_model", lambda *a, **k: (model, CharTokenizer()))
    monkeypatch.setattr("kvlab.runtime.provenance.available_memory_bytes", lambda: 2**30)
    argv = list(TINY_RUN)  # --prompt-mode repeat --no-long-context: no held-out text bounds the contexts
    argv[argv.index("40,72")] = "40,99999999"
    # past the positions too: allowed here, to reach the memory estimate
    assert main([*argv, "--allow-past-limit", "--out-dir", str(tmp_path), "--label", "huge"]) == 2
    err = err_of(capsys)
    assert "error: --contexts 99999999 with 6 new tokens (one prefill's activations" in err, err
    assert "of memory, the machine has 1.00 GiB available; at most about" in err and "tokens fit" in err
    result = json.loads((tmp_path / "huge.json").read_text())
    assert result["status"] == "failed" and result["rows"] == []
    assert result["failures"][0]["stage"] == "settings"
