"""Long-context quality of a KV cache: in-context recall (copy) and passkey retrieval, scored through the cache.

Both probes put information far back in a prompt, prefill the prompt, then decode a continuation **one token at a
time through the cache** and score it teacher-forced: only tokens decoded after the prefill attend over what the
cache stored (a KIVI or HQQ cache attends with float K/V during its own prefill forward), so only decoded tokens
can show what a cache lost.

* **Recall (copy)**: a span of held-out text (``span_tokens`` = L) is written into held-out filler so that it
  starts ``d`` tokens before the first decoded token; the continuation is the same span. Its first token is the
  cue (decoded, not scored); tokens 2..L are scored: greedy (argmax) accuracy and mean NLL per distance. This is
  the induction / in-context copying test of Olsson et al. 2022 ("In-context learning and induction heads").
* **Passkey retrieval** (Mohtashami & Jaggi 2023, arXiv:2305.16300): a needle stating a random 5-digit key in
  held-out filler at depth p of the prompt; after the prefill, :data:`PASSKEY_QUERY` goes through the cache in one
  forward (as a chat turn's prefill would: it attends to the cache's stored history) and the answer is decoded
  one token at a time; a trial is correct when every answer token is the argmax. Accuracy per depth with a
  Wilson 95 % interval.

Placement keeps what is probed out of the newest ``residual_length + group_size`` tokens (a KIVI cache holds up
to ``R + G - 1`` newest tokens in the model dtype), so a quantized cache is judged on its quantized part.

The prefill is the same for every cache (it attends with float K/V), so :func:`prefill_states` runs it once with a
``DynamicCache`` and :func:`fill_cache` copies its K/V into each candidate: ``KIVICache.load`` for KIVI, a
replayed first ``update`` per layer otherwise (checked to return its input unchanged, as in a real prefill).
"""

from kvlab.eval.longctx.prompts import (
    PASSKEY_ANSWER,
    PASSKEY_DEPTHS,
    PASSKEY_KEY_RANGE,
    PASSKEY_NEEDLE,
    PASSKEY_QUERY,
    RECALL_FRACTIONS,
    RECALL_SPAN_TOKENS,
    NotMeasurable,
    Probe,
    build_passkey_probe,
    build_recall_probe,
    encode_heldout,
    heldout_probes,
    needle_starts,
    passkey_tokens,
    recall_distances,
)
from kvlab.eval.longctx.scoring import (
    FILL_TOKENS_PER_CHUNK,
    PREFILL_TOKENS_PER_CHUNK,
    decode_scores,
    fill_cache,
    long_context_fields,
    measure_long_context,
    passkey_metrics,
    prefill_states,
    recall_metrics,
    run_probe,
    token_scores,
)

__all__ = [
    "FILL_TOKENS_PER_CHUNK",
    "NotMeasurable",
    "PASSKEY_ANSWER",
    "PASSKEY_DEPTHS",
    "PASSKEY_KEY_RANGE",
    "PASSKEY_NEEDLE",
    "PASSKEY_QUERY",
    "PREFILL_TOKENS_PER_CHUNK",
    "Probe",
    "RECALL_FRACTIONS",
    "RECALL_SPAN_TOKENS",
    "build_passkey_probe",
    "build_recall_probe",
    "decode_scores",
    "encode_heldout",
    "fill_cache",
    "heldout_probes",
    "long_context_fields",
    "measure_long_context",
    "needle_starts",
    "passkey_metrics",
    "passkey_tokens",
    "prefill_states",
    "recall_distances",
    "recall_metrics",
    "run_probe",
    "token_scores",
]
