"""Rotating cached keys by a position offset: RoPE's rotation read from a transformers model config.

RoPE (RoFormer, arXiv:2104.09864 section 3.4) rotates each channel pair ``(i, i + d/2)`` of a key at position ``p`` by the
angle ``p * inv_freq[i]`` (the "rotate half" layout transformers' Llama/Qwen2/Mistral families use). The attention
score of a query at ``q`` and a key at ``k`` depends on ``q - k`` only, and a key already rotated at ``p`` moves to
``p + offset`` by one more rotation of ``offset * inv_freq``: nothing of the key's hidden state is needed. This is
what an evicting cache needs when it changes the distance between a kept key and the next query (StreamingLLM,
arXiv:2309.17453 section 3.2: positions inside the cache).

Handled RoPE types (``config.rope_parameters["rope_type"]``, transformers 5): those whose ``inv_freq`` does not
depend on the sequence length, so one rotation per offset is exact: ``default``, ``linear`` (position
interpolation), ``llama3`` and ``yarn`` (``attention_factor`` scales the model's cos/sin, not the relative
rotation, so the offset rotation leaves it out). ``dynamic`` (NTK) and ``longrope`` change ``inv_freq`` with the
sequence length and are refused, as is any other type.
"""

from __future__ import annotations

from typing import Any

import torch

ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # inv_freq independent of the sequence length


def text_config(config: Any) -> Any:
    """The decoder's config of ``config`` (a multimodal config's text part, else ``config`` itself)."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def model_text_config(config: Any) -> Any:
    """:func:`text_config` of ``config``, checked to be a model's config (``model.config``): a cache reads its
    layers from ``num_hidden_layers``.

    Raises:
        ValueError: ``config`` has no integer ``num_hidden_layers`` >= 1 (a string, a dict, a number), named.
    """
    text = text_config(config)
    n = getattr(text, "num_hidden_layers", None)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(
            f"`config` must be the model's config (model.config, with num_hidden_layers >= 1), got "
            f"{repr(config)[:80]}"
        )
    return text


def rope_parameters(config: Any) -> dict:
    """``config.rope_parameters`` (transformers 5), else the 4.x fields (``rope_theta`` + ``rope_scaling``).

    Raises:
        ValueError: the config names no RoPE base (a model without rotary position embeddings).
    """
    text = text_config(config)
    params = getattr(text, "rope_parameters", None)
    if isinstance(params, dict) and "full_attention" in params and isinstance(params["full_attention"], dict):
        params = params["full_attention"]  # per-layer-type parameters (Gemma-style configs)
    if not isinstance(params, dict):
        params = dict(getattr(text, "rope_scaling", None) or {})
        if getattr(text, "rope_theta", None) is not None:
            params.setdefault("rope_theta", text.rope_theta)
    params = dict(params)
    params.setdefault("rope_type", params.get("type", "default"))
    if params.get("rope_theta") is None:
        raise ValueError(
            f"the model config ({type(text).__name__}) names no RoPE base (`rope_parameters['rope_theta']`): "
            f"re-rotating keys needs a RoPE model"
        )
    return params


class KeyRotation:
    """Rotate RoPE keys by a whole number of positions.

    Args:
        config: a transformers model config with RoPE (``rope_parameters`` in transformers 5, or ``rope_theta`` and
            ``rope_scaling`` as in 4.x), ``head_dim`` (or ``hidden_size / num_attention_heads``) and optionally
            ``partial_rotary_factor`` (only the first ``rotary_dim`` channels rotate).

    Raises:
        ValueError: a RoPE type outside :data:`ROPE_TYPES` (named), or a config without RoPE.

    Source: RoFormer (arXiv:2104.09864) section 3.4; the frequencies are transformers' ``ROPE_INIT_FUNCTIONS`` for the
    scaled types and ``theta ** (-2i / d)`` for ``default``.
    """

    def __init__(self, config: Any):
        text = text_config(config)
        params = rope_parameters(config)
        rope_type = params["rope_type"]
        if rope_type not in ROPE_TYPES:
            raise ValueError(
                f"RoPE type {rope_type!r} is not handled: re-rotating keys needs an inv_freq independent of the "
                f"sequence length ({', '.join(ROPE_TYPES)})"
            )
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        factor = params.get("partial_rotary_factor", getattr(text, "partial_rotary_factor", None)) or 1.0
        if rope_type == "default":
            dim = int(head_dim * factor)
            inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            inv_freq, _attention_factor = ROPE_INIT_FUNCTIONS[rope_type](text, "cpu")
        self.rope_type = rope_type
        self.inv_freq = inv_freq.double()  # [rotary_dim / 2], float64 so that large offsets keep their angle
        self.rotary_dim = 2 * inv_freq.numel()
        self.head_dim = head_dim

    def rotate(self, keys: torch.Tensor, offset: int) -> torch.Tensor:
        """``keys`` rotated at position ``p`` -> the same keys rotated at ``p + offset`` (``offset`` may be < 0).

        Args:
            keys: ``[..., tokens, head_dim]`` RoPE-rotated keys (any float dtype).
            offset: positions to move every key by.

        Returns:
            A new tensor like ``keys``; computed in float32 from float64 angles, cast back to ``keys.dtype``.

        Raises:
            ValueError: ``keys.shape[-1]`` is not the config's head_dim.
        """
        if keys.shape[-1] != self.head_dim:
            raise ValueError(f"keys have head_dim {keys.shape[-1]}, the RoPE config has {self.head_dim}")
        if offset == 0:
            return keys
        angle = offset * self.inv_freq  # [rotary_dim / 2], float64
        cos = torch.cat((angle.cos(), angle.cos())).to(device=keys.device, dtype=torch.float32)
        sin = torch.cat((angle.sin(), angle.sin())).to(device=keys.device, dtype=torch.float32)
        rot, rest = keys[..., : self.rotary_dim].float(), keys[..., self.rotary_dim :]
        half = self.rotary_dim // 2
        rotated_half = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)  # rotate_half
        out = (rot * cos + rotated_half * sin).to(keys.dtype)
        return torch.cat((out, rest), dim=-1) if rest.shape[-1] else out
