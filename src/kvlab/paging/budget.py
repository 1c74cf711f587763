"""How many KV bytes a serving GPU can hold: the budget both paging simulators share.

The default is the mechanics chapter's account (§01, §05, appendix ``paged_alloc.py``): Llama-3-8B in BF16 on an assumed
80 GiB device, 8.03e9 parameters x 2 bytes of weights, a 4 GiB reserve for activations and framework, and
``2 x 32 layers x 8 KV heads x 128 dims x 2 bytes = 131072`` KV bytes per token, which leaves 500,063 tokens
(61.04 GiB). With ``model`` and ``kv_dtype`` the bytes per token and the weights come from the planner
(:mod:`kvlab.plan`), so any model and any KV dtype (KIVI included) can be simulated.

``kvlab paging`` and :func:`planner_budget` default to the planner's GPU (:func:`gpu_memory`: the A100-80GB's
81,920 MiB = 80 GiB as the device reports it, as ``kvlab plan``), which is the 80 GiB account above;
``--gpu-mem-gib`` sets another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 1024**3

# Llama-3-8B public config (mechanics chapter §3.3): layers, KV heads, head_dim, BF16 bytes, parameter count.
LLAMA3_8B_LAYERS = 32
LLAMA3_8B_KV_HEADS = 8
LLAMA3_8B_HEAD_DIM = 128
LLAMA3_8B_DTYPE_BYTES = 2
LLAMA3_8B_PARAMS = 8.03e9
LLAMA3_8B_KV_BYTES_PER_TOKEN = (
    2 * LLAMA3_8B_LAYERS * LLAMA3_8B_KV_HEADS * LLAMA3_8B_HEAD_DIM * LLAMA3_8B_DTYPE_BYTES
)

SEED_GPU_GIB = 80  # assumed device memory, not a measured free-memory figure (mechanics chapter §01)
SEED_OVERHEAD_GIB = 4  # activations / framework / fragmentation reserve (the mechanics chapter's appendix)


@dataclass(frozen=True)
class KVBudget:
    """Memory left for the KV cache once weights and a reserve are set aside.

    Args:
        gpu_bytes: assumed device memory.
        weight_bytes: model weights resident on the device.
        overhead_bytes: reserve for activations, framework and fragmentation.
        kv_bytes_per_token: KV bytes one token costs across all layers (may be fractional for quantized caches).
        source: where the numbers come from, shown to the user.
    """

    gpu_bytes: float
    weight_bytes: float
    overhead_bytes: float
    kv_bytes_per_token: float
    source: str = "mechanics chapter example: Llama-3-8B, BF16 KV, 80 GiB - weights - 4 GiB"

    def __post_init__(self) -> None:
        for name in ("gpu_bytes", "weight_bytes", "overhead_bytes", "kv_bytes_per_token"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f"`{name}` must be finite, got {value!r}")
        if not self.kv_bytes_per_token > 0:
            raise ValueError(f"`kv_bytes_per_token` must be > 0, got {self.kv_bytes_per_token!r}")
        if self.weight_bytes < 0 or self.overhead_bytes < 0:
            raise ValueError(
                f"weights and reserve must be >= 0, got weight_bytes={self.weight_bytes!r}, "
                f"overhead_bytes={self.overhead_bytes!r}"
            )
        if self.free_bytes <= 0:
            raise ValueError(
                f"nothing left for the KV cache: {self.gpu_bytes / GIB:.2f} GiB device - "
                f"{self.weight_bytes / GIB:.2f} GiB weights - {self.overhead_bytes / GIB:.2f} GiB reserve"
            )

    @property
    def free_bytes(self) -> float:
        """Device bytes minus weights minus reserve."""
        return self.gpu_bytes - self.weight_bytes - self.overhead_bytes

    @property
    def capacity_tokens(self) -> int:
        """Whole tokens of KV that fit in :attr:`free_bytes` (seed: ``int(free // bytes_per_token)``)."""
        return int(self.free_bytes // self.kv_bytes_per_token)

    @property
    def budget_bytes(self) -> float:
        """KV bytes of :attr:`capacity_tokens` tokens: the budget every policy is admitted against."""
        bpt = self.kv_bytes_per_token
        return self.capacity_tokens * (int(bpt) if float(bpt).is_integer() else bpt)

    def num_blocks(self, block_size_tokens: int) -> int:
        """Physical blocks of ``block_size_tokens`` tokens that fit in the budget."""
        if block_size_tokens < 1:
            raise ValueError(f"`block_size_tokens` must be >= 1, got {block_size_tokens!r}")
        return self.capacity_tokens // block_size_tokens

    def as_dict(self) -> dict:
        return {
            "gpu_bytes": self.gpu_bytes,
            "weight_bytes": self.weight_bytes,
            "overhead_bytes": self.overhead_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "capacity_tokens": self.capacity_tokens,
            "budget_bytes": self.budget_bytes,
            "source": self.source,
        }


def seed_budget(kv_bytes_per_token: float = LLAMA3_8B_KV_BYTES_PER_TOKEN) -> KVBudget:
    """The mechanics chapter's 61 GiB account (80 GiB - 14.96 GiB weights - 4 GiB) for Llama-3-8B.

    ``kv_bytes_per_token`` may be overridden to model a quantized cache of the same model.
    """
    source = "mechanics chapter example: Llama-3-8B, 80 GiB - weights - 4 GiB"
    if kv_bytes_per_token != LLAMA3_8B_KV_BYTES_PER_TOKEN:
        source += f", {kv_bytes_per_token:g} KV bytes/token"
    return KVBudget(
        gpu_bytes=SEED_GPU_GIB * GIB,
        weight_bytes=LLAMA3_8B_PARAMS * LLAMA3_8B_DTYPE_BYTES,
        overhead_bytes=SEED_OVERHEAD_GIB * GIB,
        kv_bytes_per_token=kv_bytes_per_token,
        source=source,
    )


def kivi_bytes_per_token_llama3_8b(nbits: int = 4, group_size: int = 32, metadata_bytes: int = 2) -> float:
    """KIVI bytes per token of Llama-3-8B far past the residual window (codes + per-group scale and zero).

    Per layer and KV head: ``2*D*b/8`` code bytes for K and V, plus ``2*m*D/G`` for K's per-channel and
    ``2*m*D/G`` for V's per-token scale+zero (the shared interface's exact formula with Q = T, no residual).
    KIVI-4, G=32: 160 B vs 512 B in BF16. Used only when the planner is not asked.
    """
    d = LLAMA3_8B_HEAD_DIM
    per_head = 2 * d * nbits / 8 + 4 * metadata_bytes * d / group_size
    return LLAMA3_8B_LAYERS * LLAMA3_8B_KV_HEADS * per_head


def seed_kv_bytes_per_token(kv_dtype: str = "bf16") -> float:
    """Llama-3-8B KV bytes per token at ``kv_dtype`` without the planner: bf16/fp16, fp8, or kivi2/4/8 (G=32).

    Raises:
        ValueError: for any other name.
    """
    name = kv_dtype.lower()
    if name in ("bf16", "bfloat16", "fp16", "float16", "auto"):
        return LLAMA3_8B_KV_BYTES_PER_TOKEN
    if name in ("fp8", "float8"):
        return LLAMA3_8B_KV_BYTES_PER_TOKEN // 2
    if name in ("kivi2", "kivi4", "kivi8"):
        return kivi_bytes_per_token_llama3_8b(nbits=int(name[4:]))
    raise ValueError(f"`kv_dtype` must be one of bf16, fp16, fp8, kivi2, kivi4, kivi8, got {kv_dtype!r}")


def gpu_memory(gpu_gib: float | None = None) -> tuple[float, str]:
    """Device bytes and how to describe them: ``gpu_gib`` GiB (2**30 B), or for ``None`` the memory of the
    planner's default GPU (:data:`kvlab.plan.report.DEFAULT_GPU`) as the device reports it (A100-80GB: 81,920
    MiB = 80 GiB, the mechanics chapter's budget), the default of ``kvlab plan`` too."""
    if gpu_gib is not None:
        return gpu_gib * GIB, f"{gpu_gib:g} GiB"
    from kvlab.plan.hardware import get_hardware
    from kvlab.plan.report import DEFAULT_GPU

    hw = get_hardware(DEFAULT_GPU)
    return float(hw.memory_bytes), f"{hw.name} {hw.memory_mib:,} MiB ({hw.memory_gib:.2f} GiB)"


def planner_budget(
    model: str,
    kv_dtype: str = "bf16",
    gpu_gib: float | None = None,
    overhead_gib: float = SEED_OVERHEAD_GIB,
) -> KVBudget:
    """The single adapter to :mod:`kvlab.plan`: KV bytes per token and weight bytes of ``model`` at ``kv_dtype``.

    ``model`` is anything :func:`kvlab.plan.load_spec` takes (a preset name such as ``llama-3-8b``, a
    config.json, a model directory). Bytes per token are the planner's long-context figure
    (:func:`kvlab.plan.kv_bytes_per_token`; for KIVI the residual window is amortized away); weights are
    :func:`kvlab.plan.weight_bytes` (the checkpoint when it sits next to the config, else parameters x dtype).
    The device has ``gpu_gib`` GiB, or by default the planner's default GPU (:func:`gpu_memory`); the reserve
    is ``overhead_gib`` GiB.

    Raises:
        ValueError: when the planner does not know the model or the KV dtype, or cannot size the weights.
    """
    from kvlab.plan import kv_bytes_per_token, load_spec, weight_bytes

    spec = load_spec(model)
    bpt = kv_bytes_per_token(spec, kv_dtype)
    weights = weight_bytes(spec)
    gpu_bytes, gpu_text = gpu_memory(gpu_gib)
    return KVBudget(
        gpu_bytes=gpu_bytes,
        weight_bytes=weights.total_bytes,
        overhead_bytes=overhead_gib * GIB,
        kv_bytes_per_token=bpt,
        source=f"kvlab.plan: {model}, KV {kv_dtype}, {gpu_text} - weights ({weights.source}) - "
        f"{overhead_gib:g} GiB",
    )
