"""Long-context metrics of kvlab eval on hand-made inputs with hand-derived answers (batch >= 2): Wilson interval,
KL divergence and its summary, token scores, recall and passkey summaries, probe placement, scoring through a
cache against one full forward, the shared prefill, the long-context gates."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from kvlab.caches import KIVICache
from kvlab.eval.config import EvalConfig, Gates
from kvlab.eval.decision import apply_gates, decide, long_context_gates, long_context_warning
from kvlab.eval.divergence import kl_divergence, kl_summary, percentile
from kvlab.eval.longctx import (
    PASSKEY_NEEDLE,
    PASSKEY_QUERY,
    NotMeasurable,
    build_passkey_probe,
    build_recall_probe,
    decode_scores,
    fill_cache,
    long_context_fields,
    measure_long_context,
    needle_starts,
    passkey_metrics,
    passkey_tokens,
    prefill_states,
    recall_distances,
    recall_metrics,
    token_scores,
)
from kvlab.eval.stats import wilson_interval
from kvlab.runtime.hf_api import cache_kwarg
from tests.damaged_caches import NewestTokensCache


# ── Wilson interval ─────────────────────────────────────────────────────────────────────────────────────────────
@pytest.mark.parametrize(
    "k, n, low, high",
    [  # Newcombe (1998), Statistics in Medicine 17:857, Table I, method 3 (Wilson score, no continuity correction)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_interval_matches_published_values(k, n, low, high):
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=5e-5) and hi == pytest.approx(high, abs=5e-5)


def test_wilson_interval_ends_and_symmetry():
    assert wilson_interval(20, 20) == (pytest.approx(1 - 0.1611, abs=5e-5), 1.0)
    lo, hi = wilson_interval(10, 20)
    assert lo == pytest.approx(1 - hi)  # symmetric about 1/2
    assert wilson_interval(0, 20)[0] == 0.0
    wide, narrow = wilson_interval(10, 20, 0.99), wilson_interval(10, 20, 0.80)
    assert wide[0] < lo < narrow[0] and narrow[1] < hi < wide[1]


@pytest.mark.parametrize(
    "args, msg",
    [
        ((1, 0), "`trials` must be >= 1, got 0"),
        ((21, 20), r"`successes` must be in \[0, trials=20\], got 21"),
        ((-1, 20), "got -1"),
        ((True, 20), "`successes` must be an integer, got True"),
        ((1.0, 20), "`successes` must be an integer, got 1.0"),
        ((1, 20, 1.0), r"`confidence` must be in \(0, 1\), got 1.0"),
    ],
)
def test_wilson_interval_bad_input_is_named(args, msg):
    with pytest.raises(ValueError, match=msg):
        wilson_interval(*args)


# ── KL divergence ──────────────────────────────────────────────────────────────────────────────────────────────
def _log(*p):
    return torch.tensor(p, dtype=torch.float64).log()


def test_kl_divergence_hand_derived_and_direction():
    # row 0: P = (1/2, 1/2), Q = (1/4, 3/4): KL(P||Q) = 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3)
    # row 1: identical distributions, one shifted by a constant: 0
    base = torch.stack([torch.stack([_log(0.5, 0.5)]), torch.stack([_log(0.1, 0.9)])])  # [2, 1, 2]
    cand = torch.stack([torch.stack([_log(0.25, 0.75)]), torch.stack([_log(0.1, 0.9) + 7.0])])
    kl = kl_divergence(base, cand)
    assert kl.shape == (2, 1)
    assert kl[0, 0].item() == pytest.approx(0.5 * math.log(4 / 3), abs=1e-12)
    assert kl[1, 0].item() == pytest.approx(0.0, abs=1e-12)
    # the other direction, KL(Q||P) = 1/4 ln(1/2) + 3/4 ln(3/2), is a different number: the order matters
    assert kl_divergence(cand, base)[0, 0].item() == pytest.approx(
        0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    )


def test_kl_divergence_bad_input_is_named():
    with pytest.raises(ValueError, match=r"one shape, got \(2, 1, 2\) and \(2, 1, 3\)"):
        kl_divergence(torch.zeros(2, 1, 2), torch.zeros(2, 1, 3))
    with pytest.raises(ValueError, match=r"`cand_logits` holds inf or NaN at \(1, 0, 1\)"):
        kl_divergence(torch.zeros(2, 1, 2), torch.tensor([[[0.0, 0.0]], [[0.0, math.nan]]]))


def test_percentile_is_linear_between_order_statistics():
    values = torch.tensor([[4.0, 1.0], [3.0, 2.0]])
    assert percentile(values, 0.99) == pytest.approx(
        3 + 0.97 * (4 - 3)
    )  # sorted [1,2,3,4], pos 0.99*3 = 2.97
    assert percentile(values, 0.5) == pytest.approx(2.5)
    assert percentile(values, 0.0) == 1.0 and percentile(values, 1.0) == 4.0
    with pytest.raises(ValueError, match=r"`fraction` must be in \[0, 1\], got 1.5"):
        percentile(values, 1.5)


def test_kl_summary_over_batch_and_steps():
    kl = torch.tensor([[0.1, 0.3], [0.0, 1.0]])  # batch 2, steps 2: every position weighs the same
    s = kl_summary(kl)
    assert s["kl_mean"] == pytest.approx(0.35)
    assert s["kl_p99"] == pytest.approx(0.3 + 0.97 * 0.7)  # sorted [0, .1, .3, 1], pos 2.97
    assert s["kl_max"] == pytest.approx(1.0) and s["kl_positions"] == 4
    with pytest.raises(ValueError, match="finite values >= 0"):
        kl_summary(torch.tensor([[0.1, -0.2], [0.0, 0.0]]))


# ── token scores, recall and passkey summaries ─────────────────────────────────────────────────────────────────
def test_token_scores_hand_derived():
    logits = torch.stack(
        [
            torch.stack([_log(0.2, 0.5, 0.3), _log(0.6, 0.3, 0.1)]),
            torch.stack([_log(0.1, 0.1, 0.8), _log(1 / 3, 1 / 3, 1 / 3)]),
        ]
    )  # [2, 2, 3]
    targets = torch.tensor([[1, 1], [2, 0]])
    nll, hit = token_scores(logits, targets)
    expected = torch.tensor(
        [[-math.log(0.5), -math.log(0.3)], [-math.log(0.8), math.log(3)]], dtype=torch.float32
    )
    assert torch.allclose(nll, expected, atol=1e-6)
    assert hit.tolist() == [[True, False], [True, True]]  # a three-way tie goes to the first id, 0
    with pytest.raises(ValueError, match=r"targets` must be token ids in \[0, 3\)"):
        token_scores(logits, torch.tensor([[1, 3], [0, 0]]))
    with pytest.raises(ValueError, match=r"got \(2, 2, 3\) and \(2, 3\)"):
        token_scores(logits, torch.zeros(2, 3, dtype=torch.long))


def test_recall_metrics_per_distance_and_overall():
    hit = torch.tensor([[1, 0, 1], [1, 1, 1], [0, 0, 1]], dtype=torch.bool)
    nll = torch.tensor([[0.1, 2.0, 0.3], [0.2, 0.2, 0.2], [3.0, 1.0, 0.5]])
    scored = torch.ones(3, 3, dtype=torch.bool)
    scored[2, 2] = False  # an unscored hit does not count
    m = recall_metrics(nll, hit, scored, (64, 64, 128))
    assert m["scored_tokens"] == 8
    assert m["accuracy"] == pytest.approx(5 / 8)
    assert m["mean_nll"] == pytest.approx((0.1 + 2.0 + 0.3 + 0.6 + 3.0 + 1.0) / 8)
    near, far = m["distances"]
    assert (near["distance_tokens"], near["rows"], near["scored_tokens"]) == (64, 2, 6)
    assert near["accuracy"] == pytest.approx(5 / 6) and near["mean_nll"] == pytest.approx(3.0 / 6)
    assert (far["distance_tokens"], far["accuracy"], far["mean_nll"]) == (128, 0.0, pytest.approx(2.0))


def test_passkey_metrics_all_answer_tokens_must_hit():
    # 4 trials, depths 0.0 (rows 0, 1) and 0.5 (rows 2, 3); the first prediction of each row is the query's
    # (unscored), the last two the answer's
    hit = torch.tensor([[0, 1, 1], [1, 1, 0], [0, 1, 1], [1, 1, 1]], dtype=torch.bool)
    scored = torch.tensor([[0, 1, 1]] * 4, dtype=torch.bool)
    m = passkey_metrics(hit, scored, (0.0, 0.0, 0.5, 0.5))
    d0, d1 = m["depths"]
    assert (d0["depth"], d0["correct"], d0["trials"], d0["accuracy"]) == (0.0, 1, 2, 0.5)
    assert (d1["depth"], d1["correct"], d1["trials"], d1["accuracy"]) == (0.5, 2, 2, 1.0)
    assert d0["ci95"] == list(wilson_interval(1, 2)) and d1["ci95"] == list(wilson_interval(2, 2))
    assert (m["correct"], m["trials"], m["accuracy"]) == (3, 4, 0.75)
    with pytest.raises(ValueError, match=r"rows \[1\] have none"):
        passkey_metrics(
            hit, torch.tensor([[0, 1, 1], [0, 0, 0], [0, 1, 1], [0, 1, 1]], dtype=torch.bool), (0,) * 4
        )
    with pytest.raises(ValueError, match="`groups` has 3 labels for a batch of 4"):
        passkey_metrics(hit, scored, (0.0, 0.0, 0.5))


# ── placement ──────────────────────────────────────────────────────────────────────────────────────────────────
def test_recall_distances_clip_to_outside_the_protected_tail():
    # 512 tokens, span 32, tail 160: at least 192 (span ends 160 before the end), at most 511
    assert recall_distances(512, 32, 160) == [192, 256, 461]  # 0.25*512 = 128 -> 192; 0.9*512 = 460.8 -> 461
    assert recall_distances(256, 32, 160) == [192, 230]  # near and mid both clip to 192
    with pytest.raises(NotMeasurable, match="needs a context of at least 193"):
        recall_distances(192, 32, 160)
    with pytest.raises(ValueError, match=r"fractions in \[0, 1\], got 1.5"):
        recall_distances(512, 32, 160, (0.5, 1.5))


def test_needle_starts_hand_derived():
    # context 100, needle 10, tail 20: room = 100 - 20 - 10 - 1 = 69; start = 1 + round(p * 69)
    starts = needle_starts(100, 10, 20)
    assert starts == [1, 18, 35, 53, 70]  # round(17.25)=17, round(34.5)=34 (half to even), round(51.75)=52
    assert starts[-1] + 10 == 100 - 20  # depth 100 %: the needle ends exactly `tail` tokens before the end
    with pytest.raises(NotMeasurable, match="needs a context of at least 31"):
        needle_starts(30, 10, 20)


# ── probes ─────────────────────────────────────────────────────────────────────────────────────────────────────
class DigitTokenizer:
    """One id per character (digits split, as the bundled tokenizer does)."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1 + ord(c) % 250 for c in text]}


HELDOUT = list(range(300, 300 + 4000))  # distinct ids: every slice of it is identifiable


def test_recall_probe_writes_the_span_at_its_distance():
    probe = build_recall_probe(HELDOUT, 256, protected_tail=64, rows_per_distance=2, span_tokens=16, seed=1)
    assert probe.prompt_ids.shape == (6, 256) and probe.sequence.shape == (6, 16)
    assert probe.groups == (80, 80, 128, 128, 230, 230)  # 0.25*256 = 64 is raised to 16 + 64 = 80
    assert bool(probe.scored.all()) and probe.scored.shape == (6, 15)
    for row, d in enumerate(probe.groups):
        span = probe.sequence[row]
        assert torch.equal(probe.prompt_ids[row, 256 - d : 256 - d + 16], span)
        rest = torch.cat([probe.prompt_ids[row, : 256 - d], probe.prompt_ids[row, 256 - d + 16 :]])
        assert not bool(torch.isin(span, rest).any())  # the filler does not hold the span's text elsewhere
    again = build_recall_probe(HELDOUT, 256, protected_tail=64, rows_per_distance=2, span_tokens=16, seed=1)
    assert again.info["ids_sha256"] == probe.info["ids_sha256"]  # seeded: reproducible
    other = build_recall_probe(HELDOUT, 256, protected_tail=64, rows_per_distance=2, span_tokens=16, seed=2)
    assert other.info["ids_sha256"] != probe.info["ids_sha256"]


def test_passkey_probe_places_needle_and_scores_only_the_answer():
    tok = DigitTokenizer()
    probe = build_passkey_probe(tok, HELDOUT, 200, protected_tail=40, trials=3, depths=(0.0, 1.0), seed=3)
    needle_len = len(PASSKEY_NEEDLE.format(key="12345"))
    q = len(PASSKEY_QUERY)
    assert probe.prompt_ids.shape == (6, 200) and probe.sequence.shape == (6, q + 6)  # ' ' + 5 digits
    assert probe.groups == (0.0, 0.0, 0.0, 1.0, 1.0, 1.0)
    assert probe.info["needle_start_tokens"] == [1, 200 - 40 - needle_len]
    for row in range(6):
        start = probe.info["needle_start_tokens"][row // 3]
        needle = probe.prompt_ids[row, start : start + needle_len].tolist()
        key = "".join(chr((t - 1) % 250) for t in needle)[len(" The pass key is ") :][:5]
        assert needle == tok(PASSKEY_NEEDLE.format(key=key))["input_ids"]
        assert probe.sequence[row].tolist() == tok(PASSKEY_QUERY + " " + key)["input_ids"]
        # predictions j = q-1 .. q+4 score the answer's 6 tokens; the query's q-1 predictions are not scored
        assert probe.scored[row].tolist() == [False] * (q - 1) + [True] * 6


def test_passkey_tokens_refuses_a_tokenizer_that_merges_query_and_answer():
    class Merging:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [len(text)]}  # the whole text is one token

    with pytest.raises(ValueError, match="does not split"):
        passkey_tokens(Merging(), "12345")


# ── scoring through a cache ────────────────────────────────────────────────────────────────────────────────────
@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=4400,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        max_position_embeddings=1024,
    )
    return Qwen2ForCausalLM(cfg).eval()


def test_decode_through_the_cache_equals_one_full_forward(tiny):
    probe = build_recall_probe(HELDOUT, 160, protected_tail=32, rows_per_distance=1, span_tokens=8, seed=0)
    got = decode_scores(
        tiny, fill_cache(DynamicCache(), prefill_states(tiny, probe.prompt_ids)), probe.sequence
    )
    full = torch.cat([probe.prompt_ids, probe.sequence], dim=1)  # [rows, 160 + 8]
    with torch.no_grad():
        logits = tiny(input_ids=full).logits  # position 160 + j (input sequence[j]) predicts sequence[j + 1]
    nll, hit = token_scores(logits[:, 160:-1], probe.sequence[:, 1:])
    assert torch.allclose(got["nll"], nll, atol=1e-4)
    assert torch.equal(got["hit"], hit)


def test_shared_prefill_equals_the_caches_own_prefill(tiny):
    probe = build_recall_probe(HELDOUT, 160, protected_tail=32, rows_per_distance=1, span_tokens=8, seed=0)
    states = prefill_states(tiny, probe.prompt_ids)
    for make in (lambda: KIVICache(nbits=2, group_size=16, residual_length=16), DynamicCache):
        own = make()
        with torch.no_grad():
            tiny(input_ids=probe.prompt_ids, use_cache=True, **{cache_kwarg(tiny): own})
        a = decode_scores(tiny, own, probe.sequence)
        b = decode_scores(tiny, fill_cache(make(), states), probe.sequence)
        assert torch.allclose(a["nll"], b["nll"], atol=1e-5)


def test_fill_cache_refuses_a_cache_whose_prefill_differs():
    class Halving(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            k, v = super().update(key_states, value_states, layer_idx, *args, **kwargs)
            return k * 0.5, v

    states = [(torch.ones(2, 1, 4, 8), torch.ones(2, 1, 4, 8))]
    with pytest.raises(ValueError, match="Halving.update on an empty layer 0 returned K/V"):
        fill_cache(Halving(), states)


def test_a_damaged_cache_runs_through_the_measurement(tiny):
    probes = {
        "recall": build_recall_probe(HELDOUT, 300, protected_tail=64, rows_per_distance=2, span_tokens=16),
        "passkey": build_passkey_probe(DigitTokenizer(), HELDOUT, 300, protected_tail=64, trials=2),
    }
    kept = fill_cache(NewestTokensCache(64), prefill_states(tiny, probes["recall"].prompt_ids))
    assert kept.get_seq_length() == 300 and kept.layers[0].keys.shape[-2] == 63  # positions go on, tokens go
    base = measure_long_context(tiny, DynamicCache, probes)
    damaged = measure_long_context(tiny, lambda: NewestTokensCache(64), probes)
    fields = long_context_fields(damaged, base)
    assert [d["depth"] for d in fields["passkey"]["depths"]] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert {d["distance_tokens"] for d in fields["recall"]["distances"]} == {80, 150, 270}
    assert fields["recall_nll_delta"] != 0.0  # it attends to fewer tokens: the scores move
    assert fields["recall_drop"] == max(d["accuracy_drop"] for d in fields["recall"]["distances"])


# ── row fields and gates ───────────────────────────────────────────────────────────────────────────────────────
def _lc(recall_by_distance, passkey_by_depth):
    return {
        "recall": {
            "accuracy": sum(recall_by_distance.values()) / len(recall_by_distance),
            "mean_nll": 1.0,
            "distances": [{"distance_tokens": d, "accuracy": a} for d, a in recall_by_distance.items()],
        },
        "passkey": {
            "accuracy": sum(passkey_by_depth.values()) / len(passkey_by_depth),
            "depths": [{"depth": p, "accuracy": a} for p, a in passkey_by_depth.items()],
        },
    }


def test_long_context_fields_pair_by_distance_and_depth():
    base = _lc({192: 0.9, 461: 0.9}, {0.0: 1.0, 1.0: 1.0})
    cand = _lc({192: 0.9, 461: 0.6}, {0.0: 0.5, 1.0: 1.0})
    f = long_context_fields(cand, base)
    assert f["recall_drop"] == pytest.approx(0.3)  # the worst distance, not the mean (0.15)
    assert [d["accuracy_drop"] for d in f["recall"]["distances"]] == [pytest.approx(0.0), pytest.approx(0.3)]
    assert f["passkey_drop"] == pytest.approx(0.25)  # mean over depths: 1.0 - 0.75
    assert [d["accuracy_drop"] for d in f["passkey"]["depths"]] == [0.5, 0.0]
    with pytest.raises(ValueError, match="recall distances differ"):
        long_context_fields(_lc({192: 0.9}, {0.0: 1.0}), base)


PASSING = {"nll_delta": 0.0, "topk_overlap": 1.0, "latency_ratio": 1.0, "cache_bytes_saved": 10}


@pytest.mark.parametrize(
    "field, value, passes",
    [
        ("recall_drop", 0.05, True),  # on the boundary: <= passes
        ("recall_drop", 0.0500001, False),
        ("recall_drop", -0.2, True),  # better than the float cache
        ("recall_drop", None, False),
        ("recall_drop", math.nan, False),
        ("passkey_drop", 0.05, True),
        ("passkey_drop", 0.06, False),
        ("kl_mean", 0.10, True),
        ("kl_mean", 0.1000001, False),
        ("kl_mean", math.nan, False),
    ],
)
def test_long_context_gates_at_their_boundaries(field, value, passes):
    gates = Gates(max_recall_drop=0.05, max_passkey_drop=0.05, max_kl_mean=0.10)
    assert long_context_gates({field: value}, gates) == {field: passes}
    verdicts = apply_gates({**PASSING, field: value}, gates)  # the runner's own gate function uses them
    assert verdicts[field] is passes and all(v for k, v in verdicts.items() if k != field)


def test_long_context_gates_apply_only_when_measured_and_follow_the_config():
    assert long_context_gates({}, Gates()) == {}
    assert list(apply_gates(PASSING, Gates())) == [
        "nll_delta",
        "topk_overlap",
        "latency_ratio",
        "saves_memory",
    ]
    row = {"recall_drop": 0.1, "passkey_drop": 0.1, "kl_mean": 0.2}
    assert long_context_gates(row, Gates()) == {"recall_drop": False, "passkey_drop": False, "kl_mean": False}
    loose = Gates(max_recall_drop=0.2, max_passkey_drop=0.2, max_kl_mean=0.3)
    assert long_context_gates(row, loose) == {"recall_drop": True, "passkey_drop": True, "kl_mean": True}
    with pytest.raises(TypeError, match="got dict"):
        long_context_gates(row, {"max_recall_drop": 0.05})


def test_decision_rejects_a_cache_that_loses_the_passkey():
    base = _lc({192: 0.9}, {0.0: 1.0, 0.5: 1.0, 1.0: 1.0})
    good = {**PASSING, "candidate": "kivi-4", "context_length": 512, "cache_bytes_saved": 10}
    lossy = {**PASSING, "candidate": "evict-256", "context_length": 512, "cache_bytes_saved": 99}
    good.update(long_context_fields(_lc({192: 0.9}, {0.0: 1.0, 0.5: 1.0, 1.0: 1.0}), base))
    lossy.update(long_context_fields(_lc({192: 0.9}, {0.0: 0.0, 0.5: 0.0, 1.0: 1.0}), base))
    for row in (good, lossy):
        row["gates"] = apply_gates(row, Gates())
        row["eligible"] = all(row["gates"].values())
    assert lossy["gates"]["passkey_drop"] is False and not lossy["eligible"]
    selected, decision = decide([good, lossy])  # lossy saves more bytes, but only good is eligible
    assert selected is good and decision == "accept kivi-4 at context 512"


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"passkey_trials": 0}, "`passkey_trials` must be an integer >= 1, got 0"),
        ({"recall_rows": -1}, "`recall_rows` must be an integer >= 1, got -1"),
        ({"recall_span_tokens": 1}, "`recall_span_tokens` must be an integer >= 2, got 1"),
        ({"recall_fractions": (0.5, 1.2)}, r"`recall_fractions` must hold fractions in \[0, 1\], got 1.2"),
        ({"passkey_depths": ()}, "`passkey_depths` must not be empty"),
        ({"retrieval_contexts": (512, 1000)}, r"must be capacity contexts \[512, 2048, 4096\], got \[1000\]"),
        ({"long_context": "yes"}, "`long_context` must be a bool, got 'yes'"),
        ({"gates": None}, None),
    ],
)
def test_long_context_settings_bad_values_are_named(kw, msg):
    if msg is None:
        for gate, value, text in (
            ("max_recall_drop", 1.5, r"`max_recall_drop` must be in \[0, 1\], got 1.5"),
            ("max_passkey_drop", -0.1, r"`max_passkey_drop` must be in \[0, 1\], got -0.1"),
            ("max_kl_mean", -1.0, "`max_kl_mean` must be >= 0, got -1.0"),
            ("max_kl_mean", math.inf, "`max_kl_mean` must be a finite number, got inf"),
        ):
            with pytest.raises(ValueError, match=text):
                Gates(**{gate: value})
        return
    with pytest.raises(ValueError, match=msg):
        EvalConfig(**kw)


def test_passkey_contexts_default_to_the_smallest_capacity_context():
    assert EvalConfig().passkey_contexts() == (512,)
    assert EvalConfig(retrieval_contexts=(2048, 4096)).passkey_contexts() == (2048, 4096)
    assert EvalConfig(retrieval_contexts=()).passkey_contexts() == ()
    assert EvalConfig(long_context=False).passkey_contexts() == ()


def test_long_context_warning_names_a_baseline_that_does_not_retrieve():
    rows = [
        {
            "matrix": "capacity",
            "candidate": "dynamic",
            "context_length": 512,
            "recall_accuracy": 0.95,
            "passkey_accuracy": 0.1,
        },
        {"matrix": "capacity", "candidate": "dynamic", "context_length": 2048, "recall_accuracy": 0.9},
        {"matrix": "window", "candidate": "dynamic", "context_length": 512, "recall_accuracy": 0.0},
    ]
    warning = long_context_warning(rows)
    assert warning is not None and "passkey 0.10 at 512" in warning and "recall" not in warning.split(":")[0]
    rows[0]["passkey_accuracy"] = 0.97
    assert long_context_warning(rows) is None


# ── build_row: KL and long-context fields wired into a paired row ──────────────────────────────────────
def _measurement(logits: torch.Tensor, long_context: dict | None) -> dict:
    meas = {
        "perf": {"median_ms": 100.0, "min_ms": 100.0, "timings_ms": [100.0], "ms_per_token": 25.0,
                 "incremental_peak_bytes": None},
        "cache_bytes": 1000,
        "cache_tokens": 19,
        "quality": {"mean_nll": 2.0, "topk_ids": [[[0], [0]]], "prefill_ms": 1.0, "decode_ms": 0.5,
                    "logits": logits},
        "generated": torch.tensor([[1, 2], [3, 4]]),
    }  # fmt: skip
    if long_context is not None:
        meas["long_context"] = long_context
    return meas


def test_row_carries_kl_from_base_to_candidate_and_the_long_context_gates():
    from kvlab.eval.candidates import Candidate
    from tests.unit.eval.test_gates_and_decision import row_of as _row

    # batch 2, one step: row 0 P=(1/2,1/2) vs Q=(1/4,3/4); row 1 identical
    base_logits = torch.stack([torch.stack([_log(0.5, 0.5)]), torch.stack([_log(0.1, 0.9)])]).float()
    cand_logits = torch.stack([torch.stack([_log(0.25, 0.75)]), torch.stack([_log(0.1, 0.9)])]).float()
    base = _measurement(base_logits, _lc({192: 0.9}, {0.0: 1.0, 1.0: 1.0}))
    cand = _measurement(cand_logits, _lc({192: 0.5}, {0.0: 1.0, 1.0: 1.0}))
    cand["cache_bytes"] = 400
    row = _row("capacity", Candidate.parse("kivi-2"), 512, 2, 128, 32, cand, base, EvalConfig(top_k=1))
    assert row["kl_mean"] == pytest.approx(0.5 * math.log(4 / 3) / 2, rel=1e-5)  # mean of (KL, 0) over 2 rows
    assert row["kl_max"] == pytest.approx(0.5 * math.log(4 / 3), rel=1e-5)
    assert row["recall_drop"] == pytest.approx(0.4) and row["passkey_drop"] == pytest.approx(0.0)
    assert row["gates"]["recall_drop"] is False and row["gates"]["passkey_drop"] is True
    assert row["gates"]["kl_mean"] is True and row["eligible"] is False
    base_row = _row("capacity", Candidate.parse("dynamic"), 512, 2, None, None, base, None, EvalConfig())
    assert base_row["recall_accuracy"] == pytest.approx(0.9) and base_row["passkey_accuracy"] == 1.0
    assert "gates" not in base_row and "kl_mean" not in base_row


def test_chunked_rows_score_the_same_as_one_batch(tiny, monkeypatch):
    import kvlab.eval.longctx.scoring as longctx

    probe = build_recall_probe(HELDOUT, 160, protected_tail=32, rows_per_distance=2, span_tokens=8, seed=4)
    states = prefill_states(tiny, probe.prompt_ids)
    make = lambda: KIVICache(nbits=4, group_size=16, residual_length=16)  # noqa: E731
    whole = longctx.run_probe(tiny, probe, make, states)
    monkeypatch.setattr(longctx, "FILL_TOKENS_PER_CHUNK", 160)  # one row per cache
    chunked = longctx.run_probe(tiny, probe, make, states)
    for key in ("fill_ms", "decode_ms"):
        whole.pop(key), chunked.pop(key)
    assert chunked["scored_tokens"] == 6 * 7
    assert [d["accuracy"] for d in chunked["distances"]] == [d["accuracy"] for d in whole["distances"]]
    assert [d["mean_nll"] for d in chunked["distances"]] == pytest.approx(
        [d["mean_nll"] for d in whole["distances"]], abs=1e-5
    )
    assert chunked["mean_nll"] == pytest.approx(whole["mean_nll"], abs=1e-5)


def test_passkey_query_chunk_then_answer_equals_one_full_forward(tiny):
    probe = build_passkey_probe(
        DigitTokenizer(), HELDOUT, 200, protected_tail=40, trials=2, depths=(0.0, 1.0)
    )
    q = len(PASSKEY_QUERY)
    assert probe.first_chunk == q and probe.info["query_tokens"] == q
    got = decode_scores(
        tiny,
        fill_cache(DynamicCache(), prefill_states(tiny, probe.prompt_ids)),
        probe.sequence,
        probe.first_chunk,
    )
    full = torch.cat([probe.prompt_ids, probe.sequence], dim=1)
    with torch.no_grad():
        logits = tiny(input_ids=full).logits
    nll, hit = token_scores(logits[:, 200:-1], probe.sequence[:, 1:])
    assert got["nll"].shape == (4, q + 5)
    assert torch.allclose(got["nll"], nll, atol=1e-4) and torch.equal(got["hit"], hit)
    with pytest.raises(ValueError, match=r"`first_chunk` must be an integer in \[1, 7\], got 8"):
        decode_scores(tiny, DynamicCache(), probe.sequence[:, :8], 8)


def test_probe_arguments_edge_cases_are_named_or_accepted():
    import numpy as np

    from kvlab.eval.longctx import build_passkey_probe, build_recall_probe, needle_starts, recall_distances

    ids = list(range(5000))
    for call in (
        lambda: build_recall_probe(ids, 256, protected_tail=8, span_tokens=1),
        lambda: recall_distances(256, 1, 8),
    ):
        with pytest.raises(ValueError, match=r"`span_tokens` must be an int >= 2, got 1"):
            call()
    # generators, numpy scalars and arrays are read as the numbers they hold
    assert recall_distances(256, 16, 8, (f for f in (0.5, 0.9))) == recall_distances(256, 16, 8, (0.5, 0.9))
    assert needle_starts(512, 8, 8, (p for p in (0.0, 1.0))) == needle_starts(512, 8, 8, (0.0, 1.0))
    assert recall_distances(np.int64(256), np.int64(16), np.int64(8), np.array([0.5, 0.9])) == [128, 230]
    assert needle_starts(512, 8, 8, [np.float32(0.5)]) == needle_starts(512, 8, 8, [0.5])
    probe = build_recall_probe(np.array(ids), np.int64(256), protected_tail=8, fractions=np.array([0.5]))
    assert tuple(probe.prompt_ids.shape) == (2, 256)
    with pytest.raises(ValueError, match=r"`fractions` must be a sequence .* single value 0.5"):
        recall_distances(256, 16, 8, 0.5)
    for call in (
        lambda: needle_starts(512, 8, 8, (0.5, 0.5, 1.0)),
        lambda: build_passkey_probe(None, ids, 512, protected_tail=8, depths=[0.5, 0.5]),
    ):
        with pytest.raises(ValueError, match=r"`depths` must not repeat a value .*\[0.5\]"):
            call()
    with pytest.raises(ValueError, match=r"`heldout_ids` must hold integer token ids, got 1.5 at index 1"):
        build_recall_probe([1, 1.5, *ids], 256, protected_tail=8)
