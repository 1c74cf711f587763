"""The quantization chapter's exercise (its eight tests), run against kvlab.quant.KVQuantizationStrategies."""

import pytest
import torch

from kvlab.quant import KVQuantizationStrategies


def test_key_per_channel_scale_shape():
    key = torch.randn(1, 2, 5, 8)
    key_q, key_scale = KVQuantizationStrategies().quantize_key_per_channel(key)
    assert key_q.shape == key.shape
    assert key_scale.shape == (1, 2, 1, 8)


def test_value_per_token_scale_shape():
    value = torch.randn(1, 2, 5, 8)
    value_q, value_scale = KVQuantizationStrategies().quantize_value_per_token(value)
    assert value_q.shape == value.shape
    assert value_scale.shape == (1, 2, 5, 1)


def test_append_state_contract():
    strategy = KVQuantizationStrategies()
    state = strategy.append_and_partition(
        None, torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), residual_length=4
    )
    state = strategy.append_and_partition(
        state, torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8), residual_length=4
    )
    assert state["total_tokens"] == 5
    assert state["quantized_tokens"] + state["key_residual"].shape[-2] == 5
    assert state["quantized_tokens"] + state["value_residual"].shape[-2] == 5


def test_residual_window_partition_contract():
    strategy = KVQuantizationStrategies()
    state = strategy.append_and_partition(
        None, torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), residual_length=2
    )
    state = strategy.append_and_partition(
        state, torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8), residual_length=2
    )
    assert state["quantized_tokens"] == 3
    assert sum(segment.shape[-2] for segment in state["key_q_segments"]) == 3
    assert state["key_residual"].shape[-2] == 2
    assert state["value_residual"].shape[-2] == 2


def test_previous_quantized_segments_are_not_rewritten():
    strategy = KVQuantizationStrategies()
    state = strategy.append_and_partition(
        None, torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4), residual_length=2
    )
    first_segment = state["key_q_segments"][0].clone()
    state = strategy.append_and_partition(
        state, torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4), residual_length=2
    )
    assert len(state["key_q_segments"]) == 2
    assert torch.equal(state["key_q_segments"][0], first_segment)
    assert state["flushed_tokens"] == 2


def test_window_without_overflow_contract():
    strategy = KVQuantizationStrategies()
    state = strategy.append_and_partition(
        None, torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4), residual_length=4
    )
    state = strategy.append_and_partition(
        state, torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4), residual_length=4
    )
    assert state["quantized_tokens"] == 0
    assert state["flushed_tokens"] == 0
    assert state["key_residual"].shape[-2] == 2


def test_restore_and_budget_contract():
    torch.manual_seed(0)
    key, value = torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    result = KVQuantizationStrategies().compare(key, value)
    assert torch.isfinite(result["key_mse"]) and torch.isfinite(result["value_mse"])
    assert result["packed_quantized_bytes"] < result["raw_bytes"]
    assert result["packed_quantized_bytes"] < result["container_quantized_bytes"]


def test_zero_range_scale_is_finite():
    strategy = KVQuantizationStrategies()
    zeros = torch.zeros(1, 1, 3, 4)
    _, key_scale = strategy.quantize_key_per_channel(zeros)
    _, value_scale = strategy.quantize_value_per_token(zeros)
    assert torch.isfinite(key_scale).all() and torch.isfinite(value_scale).all()


def test_bad_inputs_are_named():
    s = KVQuantizationStrategies()
    with pytest.raises(ValueError, match="residual_length must be positive, got 0"):
        s.append_and_partition(None, torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4), residual_length=0)
    with pytest.raises(ValueError, match=r"\(1, 4\)"):
        s.quantize_key_per_channel(torch.randn(1, 4))
