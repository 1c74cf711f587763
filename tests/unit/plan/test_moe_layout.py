"""kvlab.plan.weights._MoE: which layers route to experts, and one MoE MLP's total and active parameters."""

from __future__ import annotations

import pytest

from kvlab.plan.weights import _MoE

HIDDEN = 16


def test_dense_model_routes_no_layer():
    moe = _MoE.from_config({"intermediate_size": 64}, "llama", HIDDEN)
    assert moe.experts == 0 and not any(moe.is_moe(i) for i in range(8))
    assert moe.mlp_params() == (0, 0)


def test_first_dense_layers_frequency_and_mlp_only_layers():
    cfg = {
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 2,
        "mlp_only_layers": [4],
    }
    moe = _MoE.from_config(cfg, "deepseek_v2", HIDDEN)
    assert [i for i in range(8) if moe.is_moe(i)] == [2, 6]  # not 0 (dense), odd layers, nor 4 (mlp only)


def test_jamba_period_and_offset():
    cfg = {"num_experts": 4, "num_experts_per_tok": 1, "intermediate_size": 32}
    moe = _MoE.from_config({**cfg, "expert_layer_period": 2, "expert_layer_offset": 1}, "jamba", HIDDEN)
    assert [i for i in range(6) if moe.is_moe(i)] == [1, 3, 5]


def test_total_counts_every_expert_active_counts_top_k_and_the_shared_expert():
    experts, top_k, inter, shared = 8, 2, 32, 2
    cfg = {
        "n_routed_experts": experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": inter,
        "n_shared_experts": shared,
    }
    total, active = _MoE.from_config(cfg, "deepseek_v2", HIDDEN).mlp_params()
    expert, shared_params, router = 3 * HIDDEN * inter, 3 * HIDDEN * shared * inter, HIDDEN * experts
    assert total == router + experts * expert + shared_params
    assert active == router + top_k * expert + shared_params
    assert total - active == (experts - top_k) * expert


def test_more_experts_per_token_than_experts_is_named():
    cfg = {"num_local_experts": 2, "num_experts_per_tok": 3, "intermediate_size": 8}
    with pytest.raises(ValueError, match=r"`num_experts_per_tok` \(3\) must not exceed the experts \(2\)"):
        _MoE.from_config(cfg, "mixtral", HIDDEN)
