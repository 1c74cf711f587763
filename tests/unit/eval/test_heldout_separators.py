"""The held-out text's token count is prose, grouped as kvlab groups counts ("1,500 tokens"); the context it is
compared with in ``build_prompts`` is a ``--contexts`` item and stays as the flag takes it ("context 2048")."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvlab.eval.longctx.prompts import build_recall_probe
from kvlab.eval.measure import build_prompts


class _ShortTokenizer:
    """Any text is 1,500 tokens: shorter than a 2,048-token context."""

    def __call__(self, text, **kw):
        return {"input_ids": list(range(1500))}


def test_build_prompts_groups_the_heldout_count_not_the_context():
    cfg = SimpleNamespace(prompt_mode="heldout", batch=1, seed=0)
    with pytest.raises(ValueError) as info:
        build_prompts(cfg, _ShortTokenizer(), 2048, torch.device("cpu"))
    assert "held-out text has 1,500 tokens under this tokenizer, fewer than context 2048" in str(info.value)


def test_recall_probe_groups_both_counts():
    with pytest.raises(ValueError, match="held-out text has 1,500 tokens, fewer than the 2,048 a prompt needs"):
        build_recall_probe(list(range(1500)), 2048, protected_tail=160)
