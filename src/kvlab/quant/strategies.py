"""The quantization chapter's CPU exercise, reproduced: K and V quantized on different axes, plus an append/flush lifecycle.

The quantization chapter (Step 4) teaches KIVI's two axes with a *symmetric* absmax quantizer in an ``int8`` container
(``qmax = 7``: signed 4-bit) and a residual window that flushes exactly the tokens beyond ``residual_length``.
This class keeps the quantization chapter's method names and return keys so the chapter's eight tests run unchanged in spirit
(``tests/unit/quant/test_strategies.py``). kvlab's production path is :mod:`kvlab.quant.kivi`: asymmetric
min-max groups, real bit packing, and G-aligned flushes.
"""

from __future__ import annotations

import torch


def _check_4d(name: str, x: torch.Tensor) -> None:
    if x.ndim != 4:
        raise ValueError(f"{name} must have shape [batch, heads, tokens, head_dim], got {tuple(x.shape)}")


class KVQuantizationStrategies:
    """Teaching model of KIVI's quantization axes and append state (the quantization chapter, Step 4).

    Inputs are ``[batch, heads, tokens, head_dim]``. Keys are scaled per channel (range over tokens, scale
    ``[..., 1, head_dim]``), values per token (range over channels, scale ``[..., tokens, 1]``). Codes live in an
    ``int8`` container; :meth:`compare` reports both the container bytes and the packed 4-bit bytes.

    Args:
        qmax: largest code magnitude (7 = signed 4-bit).
        eps: floor on the absmax so an all-zero range keeps a finite scale.

    Raises:
        ValueError: ``qmax`` outside ``[1, 127]`` or ``eps <= 0``.
    """

    def __init__(self, qmax: int = 7, eps: float = 1e-8):
        if not 1 <= qmax <= 127:
            raise ValueError(f"qmax must be in [1, 127] to fit an int8 container, got {qmax!r}")
        if not eps > 0:
            raise ValueError(f"eps must be positive, got {eps!r}")
        self.qmax = qmax
        self.eps = eps

    def _codes(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return torch.round(x.float() * scale).clamp(-self.qmax, self.qmax).to(torch.int8)

    def _scale(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        absmax = x.float().abs().amax(dim=dim, keepdim=True)
        return self.qmax / absmax.clamp_min(self.eps)

    def restore(self, quantized: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """Float approximation ``codes / scale``; ``scale`` broadcasts against ``quantized``."""
        return quantized.to(scale.dtype) / scale.clamp_min(self.eps)

    def quantize_key_per_channel(self, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys per channel: ``key [B, H, T, D]`` -> (``int8 [B, H, T, D]``, scale ``[B, H, 1, D]``)."""
        _check_4d("key", key)
        scale = self._scale(key, dim=-2)  # range over tokens, one scale per channel
        return self._codes(key, scale), scale

    def quantize_value_per_token(self, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Values per token: ``value [B, H, T, D]`` -> (``int8 [B, H, T, D]``, scale ``[B, H, T, 1]``)."""
        _check_4d("value", value)
        scale = self._scale(value, dim=-1)  # range over channels, one scale per token
        return self._codes(value, scale), scale

    def append_and_partition(
        self, state: dict | None, new_key: torch.Tensor, new_value: torch.Tensor, residual_length: int
    ) -> dict:
        """Append ``new_key``/``new_value`` ``[B, H, t, D]`` and quantize only what overflows the residual window.

        Returns a new state dict with the quantization chapter's keys: ``key_q_segments``, ``key_scale_segments``,
        ``value_q_segments``, ``value_scale_segments``, ``key_residual``, ``value_residual``, ``flushed_tokens``,
        ``quantized_tokens``, ``total_tokens``. Earlier segments are carried over untouched.

        Raises:
            ValueError: ``residual_length <= 0``, non-4-D inputs or mismatched K/V shapes.
        """
        if residual_length <= 0:
            raise ValueError(f"residual_length must be positive, got {residual_length!r}")
        if new_key.ndim != 4 or new_value.ndim != 4:
            raise ValueError("new_key and new_value must be four-dimensional")
        if new_key.shape != new_value.shape:
            raise ValueError(f"new_key {tuple(new_key.shape)} and new_value {tuple(new_value.shape)} differ")
        if state is None:
            empty = new_key.shape[:-2] + (0, new_key.shape[-1])
            state = {
                "key_q_segments": [],
                "key_scale_segments": [],
                "value_q_segments": [],
                "value_scale_segments": [],
                "key_residual": new_key.new_empty(empty),
                "value_residual": new_value.new_empty(empty),
            }
        keys = torch.cat((state["key_residual"], new_key), dim=-2)
        values = torch.cat((state["value_residual"], new_value), dim=-2)
        flush = max(keys.shape[-2] - residual_length, 0)  # only the tokens beyond the window
        segments = {
            name: list(state[name])
            for name in ("key_q_segments", "key_scale_segments", "value_q_segments", "value_scale_segments")
        }
        if flush:
            key_q, key_scale = self.quantize_key_per_channel(keys[..., :flush, :])
            value_q, value_scale = self.quantize_value_per_token(values[..., :flush, :])
            segments["key_q_segments"].append(key_q)
            segments["key_scale_segments"].append(key_scale)
            segments["value_q_segments"].append(value_q)
            segments["value_scale_segments"].append(value_scale)
        key_residual = keys[..., flush:, :]
        quantized = sum(seg.shape[-2] for seg in segments["key_q_segments"])
        return {
            **segments,
            "key_residual": key_residual,
            "value_residual": values[..., flush:, :],
            "flushed_tokens": flush,
            "quantized_tokens": quantized,
            "total_tokens": quantized + key_residual.shape[-2],
        }

    def compare(self, key: torch.Tensor, value: torch.Tensor) -> dict:
        """Scale shapes, restore MSE and the byte ledger (raw, int8 container, packed 4-bit) of one K/V pair."""
        key_q, key_scale = self.quantize_key_per_channel(key)
        value_q, value_scale = self.quantize_value_per_token(value)
        scale_bytes = (
            key_scale.numel() * key_scale.element_size() + value_scale.numel() * value_scale.element_size()
        )
        return {
            "key_scale_shape": tuple(key_scale.shape),
            "value_scale_shape": tuple(value_scale.shape),
            "key_mse": torch.mean((key.float() - self.restore(key_q, key_scale)) ** 2),
            "value_mse": torch.mean((value.float() - self.restore(value_q, value_scale)) ** 2),
            "raw_bytes": key.numel() * key.element_size() + value.numel() * value.element_size(),
            "container_quantized_bytes": key_q.numel() * key_q.element_size()
            + value_q.numel() * value_q.element_size()
            + scale_bytes,
            "packed_quantized_bytes": (key_q.numel() + value_q.numel() + 1) // 2 + scale_bytes,
        }
