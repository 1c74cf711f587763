"""``kvlab lab eviction`` says what a size needs before it starts (as ``kvlab inspect`` and ``kvlab lab --real``
do): a size past the available memory is refused with exit 2 before the first forward, naming --tokens and the
tokens that fit; ``kvlab lab --real`` warns before a reference forward too long to be one short step (``--tokens
10000`` was one silent forward)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch
from transformers import LlamaConfig

from kvlab.cli import main
from kvlab.lab import eviction, exactness, longrun
from kvlab.lab.eviction import EvictionConfig
from kvlab.models import reference_model_path
from kvlab.runtime import provenance

SMOLLM2 = LlamaConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
)
needs_model = pytest.mark.skipif(
    not (reference_model_path() / "model.safetensors").is_file(),
    reason="the bundled reference model is absent",
)


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), [line for line in err.getvalue().splitlines() if line.strip()]


def test_the_eviction_estimate_holds_the_full_forward_and_grows_with_tokens():
    cfg = EvictionConfig(tokens=10_000, window_length=256)
    need = eviction.peak_bytes(SMOLLM2, cfg, torch.bfloat16)
    kv = longrun.kv_bytes(SMOLLM2, 10_000, 2)
    assert kv == 2 * 30 * 3 * 64 * 10_000 * 2
    assert need > longrun.activation_bytes(SMOLLM2, 10_000) + kv
    chunk = 1024 * 49152 * (2 + 8)  # one chunk of logits: [SCORE_ROWS, vocab] in bf16, float32, cross-entropy
    assert need == longrun.activation_bytes(SMOLLM2, 10_000) + kv + 10_000 * 576 * 2 + chunk
    assert eviction.peak_bytes(SMOLLM2, cfg, torch.bfloat16, tokens=20_000) > need


def test_eviction_memory_problem_names_the_tokens_that_fit(monkeypatch):
    cfg = EvictionConfig(tokens=10_000, window_length=256)
    monkeypatch.setattr(provenance, "available_memory_bytes", lambda: 2**30)
    message = eviction.memory_problem(SMOLLM2, cfg, torch.bfloat16)
    assert message.startswith("`tokens` 10,000 (one forward over every token")
    fit = int(message.rsplit("at most about ", 1)[1].split()[0].replace(",", ""))
    assert eviction.peak_bytes(SMOLLM2, cfg, torch.bfloat16, tokens=fit) <= 2**30
    assert eviction.peak_bytes(SMOLLM2, cfg, torch.bfloat16, tokens=fit + 1) > 2**30
    monkeypatch.setattr(provenance, "available_memory_bytes", lambda: None)  # unknown: no check
    assert eviction.memory_problem(SMOLLM2, cfg, torch.bfloat16) is None


@needs_model
def test_eviction_past_the_available_memory_is_refused_before_any_forward(monkeypatch):
    monkeypatch.setattr(provenance, "available_memory_bytes", lambda: 2**20)  # 1 MiB left
    code, out, err = _run(["lab", "eviction", "--tokens", "20", "--window", "8", "--sinks", "2", "0"])
    assert code == 2 and out == ""
    assert err[-1].startswith("kvlab lab eviction: error: --tokens 20 (one forward over every token")
    assert "of memory, the machine has 0.00 GiB available" in err[-1]
    assert not any("full context" in line for line in err)


@needs_model
def test_a_long_reference_forward_is_warned_about_before_it_starts(monkeypatch):
    monkeypatch.setattr(exactness, "LONG_FORWARD_TOKENS", 8)
    code, out, err = _run(["lab", "--real", "--json", "--tokens", "12"])
    warnings = [line for line in err if line.startswith("warning:")]
    assert code == 0 and len(warnings) == 1, err
    assert warnings[0].startswith(
        "warning: --tokens 12: the reference is one forward of 12 tokens without a cache"
    )
    assert err.index(warnings[0]) < next(i for i, line in enumerate(err) if "reference: one forward" in line)
    assert json.loads(out)["warnings"] == [warnings[0].removeprefix("warning: ")]
    code, out, err = _run(["lab", "--real", "--json", "--tokens", "8"])
    assert code == 0 and not [line for line in err if line.startswith("warning:")]


def test_toy_lab_new_tokens_past_the_memory_is_refused_before_any_work(monkeypatch, capsys):
    # was: numpy ArrayMemoryError (238 GiB) traceback, exit 1, after the append measurement ran
    from kvlab.lab import append, equivalence
    from kvlab.lab.toy import ToyConfig, peak_bytes

    def never(*args, **kwargs):
        raise AssertionError("work started before --new-tokens was checked")

    monkeypatch.setattr(provenance, "available_memory_bytes", lambda: 8 * 2**30)
    monkeypatch.setattr(append, "measure_append_cost", never)
    assert main(["lab", "--new-tokens", "999999999"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "--new-tokens 999,999,999 needs about" in err and "8.00 GiB available" in err and "fit" in err, err
    with pytest.raises(ValueError, match="at most about") as refused:
        equivalence.check_toy_memory(ToyConfig(new_tokens=10**6), available=8 * 2**30)
    fit = int(str(refused.value).split("at most about ")[1].split(" ")[0].replace(",", ""))
    assert peak_bytes(ToyConfig(new_tokens=fit)) <= 8 * 2**30 < peak_bytes(ToyConfig(new_tokens=fit + 1))
    equivalence.check_toy_memory(ToyConfig(), available=8 * 2**30)  # the default run fits
    equivalence.check_toy_memory(ToyConfig(new_tokens=10**6), available=None)  # unknown memory: no check
