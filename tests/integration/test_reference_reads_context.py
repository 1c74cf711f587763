"""The bundled model reads its whole context: in-context copying and passkey retrieval through a float cache.

This is what lets ``kvlab eval``'s recall and passkey columns see what a cache does to distant tokens: a model that
ignores its context scores ~0.2 copy accuracy (what the text alone predicts) and 0 passkey accuracy whatever the
cache does. Measured here with the eval's own probes (``kvlab.eval.longctx``), on held-out text, through
``DynamicCache``; the model card records the full grid (copy at 14 distances, passkey at 3 contexts x 5 depths)
from the training script's run of the same code.
"""

from __future__ import annotations

import pytest
from transformers import DynamicCache

from kvlab.eval.longctx import (
    build_passkey_probe,
    build_recall_probe,
    encode_heldout,
    measure_long_context,
)
from kvlab.models import heldout_text

PROTECTED_TAIL = 128 + 32  # the eval's default R + G: what is probed lies outside the newest 160 tokens
NO_CONTEXT_COPY = 0.30  # copy accuracy of the model before it was trained to read its context (0.17-0.30)
# the bar for a model that reads its whole context (copy >= 0.90 at every distance); these probes measure
# 0.98 at 512 and 0.96 at 2,048 (stage 8; the model card has all 14 distances)
MIN_COPY = 0.90
MIN_PASSKEY = 0.95  # measured 1.00 (10 trials x 5 depths) at 512 and 2,048


@pytest.fixture(scope="module")
def heldout_ids(reference_bf16):
    _, tokenizer = reference_bf16
    return encode_heldout(tokenizer, heldout_text())


@pytest.mark.parametrize("context", [512, 2048])
def test_copies_a_span_from_far_back_in_the_prompt(reference_bf16, heldout_ids, context):
    model, _ = reference_bf16
    probe = build_recall_probe(
        heldout_ids, context, protected_tail=PROTECTED_TAIL, rows_per_distance=4, fractions=(0.5,), seed=1
    )
    rec = measure_long_context(model, DynamicCache, {"recall": probe})["recall"]
    for d in rec["distances"]:
        assert d["accuracy"] >= MIN_COPY > NO_CONTEXT_COPY, (
            f"copy accuracy {d['accuracy']:.3f} at distance {d['distance_tokens']} of {context}"
        )


@pytest.mark.parametrize("context", [512, 2048])
def test_retrieves_a_passkey_at_every_depth(reference_bf16, heldout_ids, context):
    model, tokenizer = reference_bf16
    probe = build_passkey_probe(
        tokenizer, heldout_ids, context, protected_tail=PROTECTED_TAIL, trials=10, seed=1
    )
    pk = measure_long_context(model, DynamicCache, {"passkey": probe})["passkey"]
    worst = min(pk["depths"], key=lambda d: d["accuracy"])
    assert pk["accuracy"] >= MIN_PASSKEY, (
        f"passkey accuracy {pk['accuracy']:.2f} at {context} (worst {worst})"
    )
