"""``kvlab inspect`` says what a size needs before its forward: a ``--tokens`` whose estimate
(:func:`kvlab.eval.inspect.peak_bytes`) passes the available memory is refused with exit 2 and one line naming
--tokens, the GiB needed and available and what would fit; the prefill makes no [tokens, vocab] logits."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from kvlab.cli import main
from kvlab.eval import inspect as kv_inspect
from kvlab.models import reference_model_path
from kvlab.runtime import provenance


def test_the_estimate_grows_with_tokens_and_counts_the_cache(tiny_qwen2):
    cfg, dtype = tiny_qwen2.config, torch.float32
    small, large = (kv_inspect.peak_bytes(cfg, tokens=t, dtype=dtype) for t in (100, 1000))
    kv = (
        cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    )
    assert large > small and large - small >= 900 * kv


def test_no_logits_are_made(tiny_qwen2, monkeypatch):
    """The prefill runs the decoder only: the LM head is never called."""

    def refuse(*args, **kwargs):
        raise AssertionError("lm_head called: [tokens, vocab] logits made")

    monkeypatch.setattr(tiny_qwen2.lm_head, "forward", refuse)
    ids = torch.randint(1, 256, (1, 24), generator=torch.Generator().manual_seed(1))
    assert len(kv_inspect.inspect_kv(tiny_qwen2, ids)["layers"]) == tiny_qwen2.config.num_hidden_layers


@pytest.mark.skipif(
    not (reference_model_path() / "model.safetensors").is_file(),
    reason="the bundled reference model is absent",
)
def test_a_size_past_the_available_memory_is_refused_before_any_forward(monkeypatch):
    monkeypatch.setattr(provenance, "available_memory_bytes", lambda: 2**20)  # 1 MiB left
    monkeypatch.setattr(kv_inspect, "inspect_kv", lambda *a, **k: pytest.fail("a forward ran"))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["inspect", "--tokens", "64"])
    errors = [line for line in err.getvalue().splitlines() if "error:" in line]
    assert code == 2 and out.getvalue() == "", err.getvalue()
    assert len(errors) == 1, errors
    message = errors[0]
    assert message.startswith("kvlab inspect: error: --tokens 64 (the prefill's activations"), message
    assert "needs about " in message and " GiB of memory, the machine has 0.00 GiB available; " in message
    assert "tokens fit" in message
