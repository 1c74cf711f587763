"""Analytic matmul FLOPs of the toy decoder (docs/lab.md; 2 FLOPs per multiply-add).

Conventions (the mechanics chapter's, after its corrections): 2 FLOPs per multiply-add; only matrix products count (norms,
softmax and other elementwise work are omitted); attention is counted dense, ``t x t`` scores then masking, as
:func:`kvlab.lab.toy.attention_full` computes it; the output head runs at one position per step.
"""

from __future__ import annotations

from kvlab.lab.toy import ToyConfig


def projection_flops_per_token(cfg: ToyConfig) -> int:
    """Projection and FFN FLOPs of one token through one layer: ``wq wk wv wo w1 w2``."""
    d, kv, ffn = cfg.d_model, cfg.kv_width, cfg.ffn_width
    return 2 * (d * d + d * kv + d * kv + d * d + d * ffn + ffn * d)


def head_flops(cfg: ToyConfig) -> int:
    """Output-head FLOPs at one position, ``2 * d_model * vocab``."""
    return 2 * cfg.d_model * cfg.vocab_size


def full_forward_flops(cfg: ToyConfig, tokens: int) -> int:
    """FLOPs of one full causal forward over ``tokens`` positions with dense ``tokens x tokens`` attention:
    ``QK^T`` and ``PV`` each cost ``2 * q_heads * head_dim * tokens^2`` per layer."""
    if tokens < 1:
        raise ValueError(f"`tokens` must be >= 1, got {tokens!r}")
    attention = cfg.n_layers * 4 * cfg.q_heads * cfg.head_dim * tokens * tokens
    return cfg.n_layers * tokens * projection_flops_per_token(cfg) + attention + head_flops(cfg)


def decode_step_flops(cfg: ToyConfig, context_tokens: int) -> int:
    """FLOPs of one decode step whose query attends to ``context_tokens`` cached positions (itself included):
    ``4 * q_heads * head_dim * context_tokens`` attention FLOPs per layer."""
    if context_tokens < 1:
        raise ValueError(f"`context_tokens` must be >= 1, got {context_tokens!r}")
    attention = cfg.n_layers * 4 * cfg.q_heads * cfg.head_dim * context_tokens
    return cfg.n_layers * projection_flops_per_token(cfg) + attention + head_flops(cfg)


def naive_generation_flops(cfg: ToyConfig) -> int:
    """Full recompute: step ``t`` (0-based) reruns the prefix of ``prompt_tokens + t`` tokens."""
    return sum(full_forward_flops(cfg, cfg.prompt_tokens + t) for t in range(cfg.new_tokens))


def cached_generation_flops(cfg: ToyConfig) -> int:
    """One prefill of the prompt, then ``new_tokens - 1`` decode steps; the step that produces output ``t``
    (``t >= 1``) attends to ``prompt_tokens + t`` positions."""
    steps = sum(decode_step_flops(cfg, cfg.prompt_tokens + t) for t in range(1, cfg.new_tokens))
    return full_forward_flops(cfg, cfg.prompt_tokens) + steps
