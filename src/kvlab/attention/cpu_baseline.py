"""A float decode-attention kernel on the CPU: the baseline the quantized kernels are measured against.

``torch.nn.functional.scaled_dot_product_attention`` with one query token on the CPU is what transformers runs,
but it is not a tuned decode kernel (it reads bf16 K/V at a few % of the copy bandwidth), so a ratio against it
says as much about SDPA as about the quantized kernel. :func:`float_decode_attention` is decode attention over
bf16/fp16/fp32 K/V written in the same style as the KIVI kernel (``_kivi_int.c``, built into the same library by
:mod:`kvlab.attention.cpu_kernel`): the query heads of a KV head are the rows of one item (GQA without repeating
K/V), items split over OpenMP threads, blocks of 16 keys converted to fp32 in registers, fp32 FMAs and softmax,
on the instruction-set path :func:`kvlab.attention.cpu_kernel.isa` names (AVX512, AVX2 or portable C).

Source: the decode attention of FlashDecoding / vLLM's paged attention (one query, full K/V read once per KV
head), Dao et al., "FlashAttention" (arXiv:2205.14135) for the fp32 softmax over blocks.
"""

from __future__ import annotations

import ctypes

import torch

from kvlab.attention import cpu_kernel

# K/V dtypes the kernel reads, by the C code
KV_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def float_unsupported(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> str | None:
    """Why :func:`float_decode_attention` cannot take ``query [B, Hq, q, D]`` over ``keys``/``values``
    ``[B, Hkv, T, D]`` (``None`` when it can): not 4-D CPU tensors, K/V shapes or dtypes that differ, a dtype it does
    not read, head_dim not a multiple of 16, no tokens, query heads not a multiple of KV heads, more than
    ``cpu_kernel.MAX_ROWS`` rows per KV head."""
    if any(t.dim() != 4 or t.device.type != "cpu" for t in (query, keys, values)):
        return "query, keys and values must be 4-D CPU tensors"
    if keys.shape != values.shape or keys.dtype != values.dtype:
        return f"keys {tuple(keys.shape)} {keys.dtype} and values {tuple(values.shape)} {values.dtype} differ"
    if keys.dtype not in KV_DTYPES:
        return f"K/V dtype {keys.dtype} (the kernel reads {', '.join(map(str, KV_DTYPES))})"
    if query.dtype not in (torch.float32, torch.bfloat16):
        return f"query dtype {query.dtype} (the kernel reads bf16 or fp32)"
    b, hq, q_len, d = query.shape
    if keys.shape[0] != b or keys.shape[3] != d or hq % keys.shape[1]:
        return f"query {tuple(query.shape)} does not fit keys {tuple(keys.shape)}"
    if d % 16 or keys.shape[2] < 1:
        return f"head_dim {d} (a multiple of 16) or {keys.shape[2]} tokens (at least 1)"
    if hq // keys.shape[1] * q_len > cpu_kernel.MAX_ROWS:
        return f"{hq // keys.shape[1] * q_len} rows per KV head (at most {cpu_kernel.MAX_ROWS})"
    return None


def float_decode_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scaling: float
) -> torch.Tensor:
    """Attention of ``query [B, Hq, q_len, D]`` (bf16 or fp32) over every token of ``keys``/``values``
    ``[B, Hkv, T, D]`` (bf16, fp16 or fp32, channels contiguous; no mask: a decode step attends its whole history),
    softmax scale ``scaling``; returns ``[B, Hq, q_len, D]`` in ``query.dtype`` (fp32 accumulation, rounded once).
    Equal to ``scaled_dot_product_attention(query, keys, values, scale=scaling, enable_gqa=True)`` in fp32 up to
    rounding (the sums are reordered: 16 lanes and a tree).

    Raises:
        ValueError: a problem :func:`float_unsupported` names.
        RuntimeError: the kernel is not available (the reason is named) or rejected the sizes.
    """
    why = float_unsupported(query, keys, values)
    if why is not None:
        raise ValueError(f"float_decode_attention cannot take this problem: {why}")
    lib = cpu_kernel._loaded("the float CPU kernel")
    b, hq, q_len, d = query.shape
    h, t = keys.shape[1], keys.shape[2]
    m = hq // h * q_len
    query = query.contiguous()
    k = keys if keys.stride(-1) == 1 else keys.contiguous()
    v = values if values.stride(-1) == 1 else values.contiguous()
    strides = (ctypes.c_int64 * 6)(*k.stride()[:3], *v.stride()[:3])
    scores = torch.empty(b * h * m * t, dtype=torch.float32)
    work = torch.empty(b * h * 2 * m * d, dtype=torch.float32)
    out = torch.empty(b, hq, q_len, d, dtype=query.dtype)
    rc = lib.float_decode_step(
        cpu_kernel.ISAS.index(cpu_kernel.isa()), query.data_ptr(), int(query.dtype == torch.bfloat16), scaling,
        b, h, m, d, k.data_ptr(), v.data_ptr(), t, KV_DTYPES[k.dtype], strides,
        scores.data_ptr(), work.data_ptr(), out.data_ptr(), int(out.dtype == torch.bfloat16),
        cpu_kernel.threads(t),
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"the float CPU kernel rejected head_dim {d}, {t} tokens (code {rc})")
    return out
