"""Test helpers for generate modes that roll a cache back with ``crop`` (assisted and prompt-lookup decoding),
shared by the unit and integration tiers."""

from __future__ import annotations

import copy


def layer_skip_draft(model, num_layers: int = 1):
    """A draft that runs the target's first ``num_layers`` layers (shared embeddings and head): it agrees with the
    target often but not always, so assisted decoding both accepts and rejects drafts (and crops). It proposes 6
    tokens per step."""
    draft = copy.deepcopy(model)
    draft.model.layers = draft.model.layers[:num_layers]
    draft.config.num_hidden_layers = num_layers
    draft.config.layer_types = draft.config.layer_types[:num_layers]
    draft.set_attn_implementation("sdpa")
    draft.generation_config.num_assistant_tokens = 6
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    return draft


def recording(cache):
    """``(cache, calls)``: ``calls`` records, for every ``crop`` call on ``cache``, the change in tokens held:
    ``-n`` when it dropped ``n`` tokens, ``0`` for a no-op. That is transformers' own argument from 5.14/5.15 on
    (``crop(-n)``); earlier releases pass the length to keep (``crop(kept)``), which this records the same way."""
    calls = []
    crop = cache.crop

    def wrapped(n):
        before = cache.get_seq_length()
        result = crop(n)
        calls.append(cache.get_seq_length() - before)
        return result

    cache.crop = wrapped
    return cache, calls
