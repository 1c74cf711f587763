"""The eval's quality metrics on hand-made logits and ids, each against an answer derived by hand (batch 2).

A scripted stand-in for a model returns logits we choose, so every expected NLL is a sum of multiples of ln 2:
the token scored at a step gets probability 2**-a there, every other token an equal share of the rest.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from kvlab.eval.metrics import compare_outputs, fixed_continuation, topk_overlap

LN2 = math.log(2.0)
VOCAB = 16


class ScriptedLM:
    """Returns ``logits[:, call]`` at its ``call``-th forward (0 = the prompt), whatever the input; records inputs.

    ``logits``: ``[batch, calls, vocab]``.
    """

    def __init__(self, logits: torch.Tensor):
        self.logits = logits
        self.calls: list[tuple[torch.Tensor, object]] = []

    def forward(self, input_ids, use_cache=True, logits_to_keep=0, past_key_values=None):
        call = len(self.calls)
        self.calls.append((input_ids.clone(), past_key_values))
        return SimpleNamespace(logits=self.logits[:, call : call + 1, :])  # [batch, 1, vocab]

    __call__ = forward


def scripted_logits(continuation: torch.Tensor, exponents: list[list[int]]) -> torch.Tensor:
    """``[batch, n, VOCAB]`` log-probabilities: ``continuation[b, s]`` gets ``2**-exponents[b][s]`` at step s.

    The other VOCAB - 1 tokens share the rest equally, so the scored token is the argmax (exponents <= 3) and
    the NLL of any other token is different from the scored one's.
    """
    batch, n = continuation.shape
    logp = torch.empty(batch, n, VOCAB, dtype=torch.float64)
    for b in range(batch):
        for s in range(n):
            p = 2.0 ** -exponents[b][s]
            logp[b, s, :] = math.log((1 - p) / (VOCAB - 1))
            logp[b, s, continuation[b, s]] = math.log(p)
    return logp.float()


# consecutive tokens differ in every row, so scoring the token after the right one changes the NLL
CONTINUATION = torch.tensor([[3, 7, 1], [9, 2, 5]])
# row 0: 1 + 2 + 3 = 6 ln 2 over 3 tokens; row 1: 1 + 1 + 1 = 3 ln 2 over 3 tokens -> mean 9 ln 2 / 6 = 1.5 ln 2
EXPONENTS = [[1, 2, 3], [1, 1, 1]]
PROMPT = torch.tensor([[11, 12, 13, 14], [4, 6, 8, 10]])


def run_scripted(continuation=CONTINUATION, exponents=EXPONENTS, prompt=PROMPT, top_k=1):
    model = ScriptedLM(scripted_logits(continuation, exponents))
    cache = object()
    return fixed_continuation(model, prompt, continuation, cache, top_k), model, cache


def test_fixed_continuation_mean_nll_over_batch_and_steps():
    q, _, _ = run_scripted()
    # (6 + 3) ln 2 over 2 rows x 3 tokens; a mean over steps only would give 3 ln 2, row 0 alone 2 ln 2
    assert q["mean_nll"] == pytest.approx(1.5 * LN2, rel=1e-6)


def test_fixed_continuation_rows_with_different_nll_average_by_token():
    one = [
        run_scripted(CONTINUATION[b : b + 1], [EXPONENTS[b]], PROMPT[b : b + 1])[0]["mean_nll"]
        for b in (0, 1)
    ]
    assert one == pytest.approx([2.0 * LN2, 1.0 * LN2], rel=1e-6)
    both, _, _ = run_scripted()
    assert both["mean_nll"] == pytest.approx((one[0] + one[1]) / 2, rel=1e-6)  # equal lengths: the plain mean


@pytest.mark.parametrize("row", [0, 1])
def test_fixed_continuation_scores_each_step_against_its_own_token(row):
    """Per-token NLL from prefix runs: m * mean(m) - (m - 1) * mean(m - 1) is the NLL of step m - 1."""
    cont, exps = CONTINUATION[row : row + 1], [EXPONENTS[row]]
    sums = [0.0]
    for m in range(1, cont.shape[1] + 1):
        q, _, _ = run_scripted(cont[:, :m], [exps[0][:m]], PROMPT[row : row + 1])
        sums.append(q["mean_nll"] * m)
    per_token = [sums[m] - sums[m - 1] for m in range(1, len(sums))]
    assert per_token == pytest.approx([a * LN2 for a in exps[0]], rel=1e-5)


def test_fixed_continuation_feeds_the_continuation_and_reuses_the_cache():
    q, model, cache = run_scripted()
    assert len(model.calls) == CONTINUATION.shape[1]  # the prompt, then every token but the last
    assert torch.equal(model.calls[0][0], PROMPT)
    for step in range(1, CONTINUATION.shape[1]):
        assert torch.equal(model.calls[step][0], CONTINUATION[:, step - 1 : step])
    assert all(c is cache for _, c in model.calls)
    assert q["topk_ids"] == [
        [[3], [9]],
        [[7], [2]],
        [[1], [5]],
    ]  # [steps][batch][k]: the scored token is top-1
    assert q["prefill_ms"] >= 0 and q["decode_ms"] >= 0


def test_fixed_continuation_single_token_has_no_decode_time():
    q, model, _ = run_scripted(CONTINUATION[:, :1], [e[:1] for e in EXPONENTS])
    assert len(model.calls) == 1 and q["decode_ms"] is None
    assert q["mean_nll"] == pytest.approx(LN2, rel=1e-6)


@pytest.mark.parametrize(
    "prompt, continuation, top_k, match",
    [
        (PROMPT, CONTINUATION[:, :0], 1, r"at least one token"),
        (PROMPT[:1], CONTINUATION, 1, r"`continuation` batch \(2\) must equal `input_ids` batch \(1\)"),
        (PROMPT[0], CONTINUATION, 1, r"must be \[batch, tokens\], got shapes \(4,\)"),
        (PROMPT, CONTINUATION, 0, r"`top_k` must be an int >= 1, got 0"),
    ],
)
def test_fixed_continuation_bad_input_is_named(prompt, continuation, top_k, match):
    model = ScriptedLM(torch.zeros(2, 3, VOCAB))
    with pytest.raises(ValueError, match=match):
        fixed_continuation(model, prompt, continuation, object(), top_k)
    assert model.calls == []  # refused before any forward


def test_topk_overlap_is_the_intersection_over_k():
    base = [[[1, 2, 3], [4, 5, 6]], [[7, 8, 9], [1, 2, 3]]]
    cand = [[[3, 2, 1], [4, 0, 0]], [[10, 11, 12], [2, 3, 9]]]
    # |∩| per (step, row): 3, 1, 0, 2 -> (3 + 1 + 0 + 2) / (4 * 3) = 0.5 (a union would give values >= 1)
    assert topk_overlap(base, cand, 3) == pytest.approx(0.5)
    assert topk_overlap(base, base, 3) == 1.0
    assert topk_overlap([[[1, 2]], [[3, 4]]], [[[5, 6]], [[7, 8]]], 2) == 0.0
    assert math.isnan(topk_overlap([], [], 3))


@pytest.mark.parametrize(
    "base, cand, k, match",
    [
        ([[[1]], [[2]]], [[[1]]], 1, r"`base` has 2 steps but `cand` has 1"),
        ([[[1], [2]]], [[[1]]], 1, r"at step 0, `base` has 2 batch rows but `cand` has 1"),
        ([[[1, 2]]], [[[1, 2, 3]]], 2, r"at step 0, row 0: expected 2 ids each, got 2 and 3"),
        ([[[1]]], [[[1]]], 0, r"`k` must be an int >= 1, got 0"),
    ],
)
def test_topk_overlap_bad_input_is_named(base, cand, k, match):
    with pytest.raises(ValueError, match=match):
        topk_overlap(base, cand, k)


def test_compare_outputs_agreement_and_first_divergence():
    base = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    cand = torch.tensor([[1, 0, 3, 0], [5, 6, 0, 8]])  # row 0 diverges at 1, row 1 at 2; 5 of 8 agree
    d = compare_outputs(base, cand)
    assert d == {"greedy_exact_match": False, "token_agreement_rate": 5 / 8, "first_divergence_index": 1}
    assert compare_outputs(base, base.clone()) == {
        "greedy_exact_match": True,
        "token_agreement_rate": 1.0,
        "first_divergence_index": None,
    }
    one_row = base.clone()
    one_row[1, 3] = 0  # only row 1 differs, at its last step
    assert compare_outputs(base, one_row)["first_divergence_index"] == 3
    first = base.clone()
    first[1, 0] = 0
    assert compare_outputs(base, first)["first_divergence_index"] == 0  # 0 is a divergence, not "none"


def test_compare_outputs_bad_shapes_are_named():
    base = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with pytest.raises(ValueError, match=r"got \(2, 3\) and \(1, 3\)"):
        compare_outputs(base, base[:1])  # would broadcast silently
    with pytest.raises(ValueError, match=r"got \(3,\) and \(3,\)"):
        compare_outputs(base[0], base[0])
