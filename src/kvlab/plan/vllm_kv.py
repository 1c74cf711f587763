"""The KV cache vLLM builds from a given KV memory: blocks, "GPU KV cache size" and "Maximum concurrency".

Our own model of the arithmetic of vLLM's v1 KV cache manager, read from ``vllm/v1/core/kv_cache_utils.py`` and
``vllm/v1/kv_cache_interface.py`` (vllm-project/vllm at commit bbf906a8, the v0.1x line with decode and prefill
context parallelism); no vLLM needed, no torch:

* each attention layer that stores its own K/V gets a spec: full attention, sliding window or chunked local
  attention, with ``max(1, kv_heads // tp)`` heads per rank (replicated when ``tp`` exceeds the KV heads), or one
  MLA latent of ``kv_lora_rank + qk_rope_head_dim`` (K only, replicated on every rank). Layers that reuse another
  layer's K/V (``num_kv_shared_layers``) get none;
* a block's page is ``2 x block_size x heads x head_size x dtype bytes`` (``1 x`` for MLA); ``--kv-cache-dtype
  fp8|fp8_e4m3|fp8_e5m2`` stores 1 B per value, ``auto`` the model dtype;
* grouping (``get_kv_cache_groups``): one spec for every layer -> one group and ``num_blocks = memory // page //
  layers``; one attention type with different page sizes (Gemma 4's full layers alone) -> one group whose page
  is the sum of the layers' pages; several types -> pages unified by raising the smaller pages' block size
  (``unify_kv_cache_spec_page_size``), layers of each type split into groups of ``group_size`` layers (the
  fewest layers of a type, or the most when that is under 1.5x the fewest; padding where it does not divide),
  and ``num_blocks = memory // page // group_size``;
* "GPU KV cache size: N tokens": ``num_blocks // groups x smallest block size`` (``report="blocks"``, vLLM up to
  the 0.1x line), or ``max_concurrency x max_model_len`` (``report="concurrency"``: what the v0.21 and v0.26
  startup logs in docs/plan.md print; inferred from those logs, whose tokens are not multiples of the block
  size, not read from that version's source); both times the decode context parallel size;
* "Maximum concurrency for L tokens per request": ``num_blocks / ceil(per-request bytes / (page x group_size))``,
  a request needing ``ceil(L / (block_size x dcp))`` blocks in a full layer, ``ceil(min(window - 1 +
  max_num_batched_tokens, L) / block_size) + 1`` in a sliding one, ``ceil(min(chunk + max_num_batched_tokens, L)
  / block_size)`` in a chunked one.

Not modelled: Mamba / linear-attention state pages of hybrids (their layers are left out, with a note), FlashMLA's
FP8 latent layout, pipeline parallelism.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, replace

from kvlab.plan.config_fields import CHUNKED, DTYPE_BYTES, FULL, NO_KV, SLIDING
from kvlab.plan.ledger import kv_heads_per_rank
from kvlab.plan.spec import ModelSpec

VLLM_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")
REPORTS = ("blocks", "concurrency")


@dataclass(frozen=True)
class LayerKVSpec:
    """One layer's KV cache spec on one rank, as vLLM's ``FullAttentionSpec`` / ``SlidingWindowSpec`` /
    ``ChunkedLocalAttentionSpec`` / ``MLAAttentionSpec`` hold it."""

    kind: str  # FULL, SLIDING or CHUNKED
    block_size: int  # tokens per block (raised for smaller pages when page sizes are unified)
    num_kv_heads: int  # heads on this rank (1 for an MLA latent)
    head_size: int  # values per head (the whole latent for MLA)
    dtype_bytes: int  # bytes per stored value
    mla: bool = False  # one latent (K only) instead of K and V
    window: int | None = None  # sliding window, tokens
    chunk: int | None = None  # attention chunk, tokens

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of this layer: ``(1 if MLA else 2) x block_size x heads x head_size x dtype``."""
        return (
            (1 if self.mla else 2) * self.block_size * self.num_kv_heads * self.head_size * self.dtype_bytes
        )

    def max_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int, dcp: int) -> int:
        """Blocks one request of ``max_model_len`` tokens needs in this layer (``max_memory_usage_bytes``)."""
        if self.kind == SLIDING:
            tokens = min(self.window - 1 + max_num_batched_tokens, max_model_len)
            return math.ceil(tokens / self.block_size) + 1
        if self.kind == CHUNKED:
            tokens = min(self.chunk + max_num_batched_tokens, max_model_len)
            return math.ceil(tokens / self.block_size)
        return math.ceil(max_model_len / (self.block_size * dcp))


@dataclass(frozen=True)
class VllmKVCache:
    """What vLLM would build and print for one rank's KV memory."""

    kv_memory_bytes: int  # "Available KV cache memory", bytes per GPU
    groups: tuple[tuple[LayerKVSpec, int], ...]  # (spec, layers) per KV cache group
    group_size: int  # layers per group: one memory pool each
    page_size_bytes: int  # bytes of one block in one pool (the sum over layers for a one-type group)
    num_blocks: int  # blocks per pool
    kv_cache_tokens: int  # "GPU KV cache size: N tokens"
    max_model_len: int  # the L of "Maximum concurrency for L tokens per request"
    max_concurrency: float  # "Maximum concurrency ...: Cx"
    report: str  # how kv_cache_tokens was counted (REPORTS)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "kv_memory_bytes": self.kv_memory_bytes,
            "groups": [
                {
                    "kind": s.kind,
                    "layers": n,
                    "block_size": s.block_size,
                    "page_size_bytes": s.page_size_bytes,
                }
                for s, n in self.groups
            ],
            "group_size": self.group_size,
            "page_size_bytes": self.page_size_bytes,
            "num_blocks": self.num_blocks,
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_model_len": self.max_model_len,
            "max_concurrency": self.max_concurrency,
            "report": self.report,
            "notes": list(self.notes),
        }


def cache_dtype_bytes(spec: ModelSpec, kv_cache_dtype: str) -> int:
    """Bytes per stored value for vLLM's ``--kv-cache-dtype`` (``auto``: the model dtype).

    Raises:
        ValueError: a name vLLM does not take (named with the choices).
    """
    if kv_cache_dtype not in VLLM_KV_CACHE_DTYPES:
        raise ValueError(f"`kv_cache_dtype` must be one of {VLLM_KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    if kv_cache_dtype.startswith("fp8"):
        return 1
    return spec.dtype_bytes if kv_cache_dtype == "auto" else DTYPE_BYTES[kv_cache_dtype]


def layer_specs(
    spec: ModelSpec, *, tp: int, block_size: int, dtype_bytes: int, skip_layers: Collection[int] = ()
) -> list[LayerKVSpec]:
    """One :class:`LayerKVSpec` per layer that stores its own K/V, on one rank (``get_kv_cache_spec``); the
    decoder layers whose index is in ``skip_layers`` (``--kv-cache-dtype-skip-layers``: vLLM's ``Attention``
    gives them ``kv_cache_dtype="auto"``) store the model dtype, the others ``dtype_bytes``.

    Raises:
        ValueError: a skipped layer the model lacks.
    """
    bad = sorted(i for i in skip_layers if not 0 <= i < spec.num_layers)
    if bad:
        raise ValueError(
            f"`kv_cache_dtype_skip_layers` names layer {bad[0]}, which the model lacks (layers 0-{spec.num_layers - 1})"
        )
    if spec.is_mla:
        heads, size = 1, spec.kv_elements_per_token_per_layer
    else:
        heads, size = kv_heads_per_rank(spec, tp), spec.head_dim
    out = []
    for index, kind in enumerate(spec.layer_kinds):
        if kind not in (FULL, SLIDING, CHUNKED):
            continue
        width = spec.full_head_dim if kind == FULL and spec.full_head_dim else size
        out.append(
            LayerKVSpec(
                kind=kind,
                block_size=block_size,
                num_kv_heads=heads,
                head_size=width,
                dtype_bytes=spec.dtype_bytes if index in skip_layers else dtype_bytes,
                mla=spec.is_mla,
                window=spec.sliding_window if kind == SLIDING else None,
                chunk=spec.attention_chunk_size if kind == CHUNKED else None,
            )
        )
    return out


def kv_groups(specs: list[LayerKVSpec]) -> tuple[list[tuple[LayerKVSpec, int]], int, int]:
    """``(groups, group_size, page_size_bytes)`` as ``get_kv_cache_groups`` forms them (see the module docstring):
    each group a (spec, layers) pair; the page is that of one pool block."""
    if not specs:
        raise ValueError("the model has no layer that stores K/V: vLLM builds no KV cache")
    by_type: dict[LayerKVSpec, int] = defaultdict(int)
    for s in specs:
        by_type[s] += 1
    if len(by_type) == 1:  # one spec for every layer
        ((s, n),) = by_type.items()
        return [(s, n)], n, s.page_size_bytes
    if len({s.kind for s in by_type}) == 1 and len({(s.window, s.chunk) for s in by_type}) == 1:
        # one type, different page sizes: one group, each layer its own pool (UniformTypeKVCacheSpecs)
        return [(s, n) for s, n in by_type.items()], 1, sum(s.page_size_bytes * n for s, n in by_type.items())
    page = max(s.page_size_bytes for s in by_type)
    unified: dict[LayerKVSpec, int] = defaultdict(int)
    for s, n in by_type.items():
        if page % s.page_size_bytes:
            raise ValueError(
                f"vLLM cannot unify page sizes {page:,} B and {s.page_size_bytes:,} B (not a multiple): it refuses "
                "this model"
            )
        unified[replace(s, block_size=s.block_size * (page // s.page_size_bytes))] += n
    fewest, most = min(unified.values()), max(unified.values())
    group_size = most if most < fewest * 1.5 else fewest
    groups = []
    for s, n in unified.items():
        for i in range(math.ceil(n / group_size)):
            groups.append((s, min(group_size, n - i * group_size)))
    return groups, group_size, page


def vllm_kv_cache(
    spec: ModelSpec,
    kv_memory_bytes: int,
    *,
    max_model_len: int,
    tp: int = 1,
    dcp: int = 1,
    block_size: int = 16,
    kv_cache_dtype: str = "auto",
    max_num_batched_tokens: int = 8192,
    report: str = "blocks",
    kv_cache_dtype_skip_layers: Collection[int] = (),
) -> VllmKVCache:
    """The blocks, "GPU KV cache size" and "Maximum concurrency" vLLM would print for ``kv_memory_bytes`` of KV
    memory on one rank (the module docstring gives the rules and their source).

    Args:
        spec: the model; kv_memory_bytes: "Available KV cache memory" in bytes per GPU.
        max_model_len: tokens per request; tp: tensor-parallel size; dcp: decode context parallel size.
        block_size: tokens per block (``--block-size``; vLLM's CUDA default 16); kv_cache_dtype: as vLLM's flag.
        max_num_batched_tokens: the scheduler's token budget (sliding layers need window - 1 + it per request).
        report: how the tokens line is counted (:data:`REPORTS`).
        kv_cache_dtype_skip_layers: decoder layer indices kept in the model dtype (``--kv-cache-dtype-skip-layers
            i j``): full-attention layers with two page sizes form one group of one pool per layer
            (``UniformTypeKVCacheSpecs``), a block spanning every layer.

    Raises:
        ValueError: a negative memory, a count < 1, an unknown ``kv_cache_dtype`` or ``report``, a ``tp`` the
            KV heads do not allow, a skipped layer the model lacks, or page sizes vLLM cannot unify.
    """
    for name, value in (
        ("max_model_len", max_model_len),
        ("tp", tp),
        ("dcp", dcp),
        ("block_size", block_size),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}")
    if kv_memory_bytes < 0:
        raise ValueError(f"`kv_memory_bytes` must be >= 0, got {kv_memory_bytes!r}")
    if report not in REPORTS:
        raise ValueError(f"`report` must be one of {REPORTS}, got {report!r}")
    dtype_bytes, skip = cache_dtype_bytes(spec, kv_cache_dtype), kv_cache_dtype_skip_layers
    specs = layer_specs(spec, tp=tp, block_size=block_size, dtype_bytes=dtype_bytes, skip_layers=skip)
    groups, group_size, page = kv_groups(specs)
    num_blocks = int(kv_memory_bytes) // page // group_size
    if group_size == 1 and len(groups) > 1:  # one type, one pool per layer: a block spans every layer
        needed = max(s.max_blocks_per_request(max_model_len, max_num_batched_tokens, dcp) for s, _ in groups)
        n_groups = 1
    else:
        needed = sum(s.max_blocks_per_request(max_model_len, max_num_batched_tokens, dcp) for s, _ in groups)
        n_groups = len(groups)
    concurrency = num_blocks / needed
    if report == "blocks":
        tokens = num_blocks // n_groups * min(s.block_size for s, _ in groups) * dcp
    else:
        tokens = int(concurrency * max_model_len) * dcp
    notes = []
    if NO_KV in spec.layer_kinds:
        notes.append(
            f"{spec.count(NO_KV)} layers without attention KV (Mamba/linear): vLLM gives their state pages a group "
            "of their own; not modelled here, so the tokens are an upper bound"
        )
    return VllmKVCache(
        kv_memory_bytes=int(kv_memory_bytes),
        groups=tuple(groups),
        group_size=group_size,
        page_size_bytes=page,
        num_blocks=num_blocks,
        kv_cache_tokens=tokens,
        max_model_len=max_model_len,
        max_concurrency=concurrency,
        report=report,
        notes=tuple(notes),
    )
