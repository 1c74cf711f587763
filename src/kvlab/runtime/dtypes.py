"""Model dtypes by name (the three kvlab runs models in), and how their GEMMs run on a CPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from kvlab.runtime.checks import check_int
from kvlab.runtime.dtype_names import MODEL_DTYPES, alias_hint
from kvlab.runtime.dtype_speed import SLOW_DTYPE_RATIO

# the model dtypes (kvlab.runtime.dtype_names.MODEL_DTYPES, the one list) by name -> torch.bfloat16, ...
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in MODEL_DTYPES}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"``, ``"float16"``, ``"float32"`` (or the matching ``torch.dtype``) -> ``torch.dtype``.

    Raises:
        ValueError: any other value, named in the message; a short spelling (``"bf16"``) with the name to use
            (the command line reads it as that name: :func:`canonical_dtype`).
    """
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
    elif isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"`dtype` must be one of {sorted(DTYPES)}, got {dtype!r}{alias_hint(dtype)}")


# the GEMM timed by matmul_time_ratio: a prefill-like [tokens, hidden] x [hidden, out] product
_RATIO_SHAPE = (512, 256, 1024)


def matmul_time_ratio(
    dtype: str | torch.dtype, device: str | torch.device = "cpu", rounds: int = 3
) -> float | None:
    """How many times longer a ``dtype`` matmul takes than a float32 one on this CPU, with the current torch threads.

    CPUs without native bfloat16/float16 matrix instructions (x86 without AVX512-BF16 or AMX, for example an
    AVX2-only EPYC) run torch's bfloat16 GEMMs through a slow path: measured here on such a 2-core machine, a
    ``[512, 256] x [256, 768]`` product took 8x the float32 time. A run in that dtype then spends its time in
    prefill, and its latencies describe the emulation, not a bf16 serving CPU. The product timed is
    ``[512, 256] x [256, 1024]`` (tokens x hidden x out), best of ``rounds`` after one untimed call per dtype.

    Args:
        dtype: the model dtype (:func:`parse_dtype` names or a ``torch.dtype``).
        device: where the model runs; only a CPU is timed.
        rounds: timed calls per dtype (>= 1).

    Returns:
        ``t(dtype) / t(float32)`` (> 0), or None for float32 itself or a non-CPU device.

    Raises:
        ValueError: an unknown dtype, or ``rounds`` < 1 (each named).
    """
    import time

    dt = parse_dtype(dtype)
    check_int("rounds", rounds, 1)
    if dt == torch.float32 or torch.device(device).type != "cpu":
        return None
    tokens, hidden, out = _RATIO_SHAPE
    gen = torch.Generator().manual_seed(0)
    x32 = torch.randn(tokens, hidden, generator=gen)
    w32 = torch.randn(out, hidden, generator=gen)
    best = {}
    with torch.inference_mode():
        for d in (torch.float32, dt):
            x, w = x32.to(d), w32.to(d)
            torch.nn.functional.linear(x, w)  # untimed: one-time dispatch and allocation
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                torch.nn.functional.linear(x, w)
                times.append(time.perf_counter() - t0)
            best[d] = min(times)
    return best[dt] / max(best[torch.float32], 1e-9)


@contextlib.contextmanager
def float32_gemms(model: torch.nn.Module) -> Iterator[int]:
    """Run every ``nn.Linear`` of a bfloat16/float16 ``model`` as a float32 GEMM: inputs and weights widened to
    float32 (exact), the product accumulated in float32, the output rounded back to the layer's dtype.

    Why: a CPU without bfloat16 matrix instructions (an AVX2-only x86) runs torch's bfloat16 GEMMs 4-10x slower than
    float32 ones (:func:`matmul_time_ratio`), so a bf16 model spends most of its prefill in the emulation. A bf16
    GEMM as serving hardware runs it (cuBLAS, oneDNN with AVX512-BF16/AMX) also multiplies bf16 operands with float32
    accumulation and rounds the output to bf16; this path computes the same product and differs only in summation
    order (outputs within one bf16 ulp; on the bundled model at 4,096 tokens, logits within 0.25 of 36.5). Measured
    on a 2-core AVX2 EPYC: a 4,096-token prefill of the bundled model in 1.22 s against 3.79 s. Activations and the
    KV cache stay in the model dtype. Float32 copies of the Linear weights are held while the context is open (4
    bytes per weight element), and each call allocates its widened input and float32 output (counted by the CPU
    peak-memory accounting).

    While the context is open :func:`float32_attention` is also true: kvlab attention
    (:func:`kvlab.attention.enable`) then runs the SDPA of bf16/fp16 queries and K/V on the CPU in float32 and
    rounds its output back (a decode step's bf16 SDPA took 6-7x the float32 time on that EPYC, more than all the
    step's GEMMs at 4,096 tokens). That is the arithmetic of kvlab's fused KIVI attention (float32 scores,
    probabilities and accumulation); a bf16 flash kernel also rounds the softmax probabilities to bf16 before
    ``P @ V``.

    Args:
        model: a module whose Linear weights are bfloat16 or float16 (other Linear layers, and layers whose
            ``forward`` is already replaced on the instance, e.g. by accelerate's hooks, are left as they are).

    Yields:
        the number of Linear layers rerouted (0 when none is bf16/fp16: the context then changes nothing).

    Raises:
        ValueError: ``model`` is not a ``torch.nn.Module``.
    """
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
    patched: list[torch.nn.Linear] = []
    _FLOAT32_ATTENTION[0] += 1
    try:
        for module in model.modules():
            if (
                isinstance(module, torch.nn.Linear)
                and module.weight.dtype in (torch.bfloat16, torch.float16)
                and "forward" not in vars(module)  # a forward set on the instance (accelerate's hooks) stays
            ):
                _reroute(module)
                patched.append(module)
        yield len(patched)
    finally:
        _FLOAT32_ATTENTION[0] -= 1
        for module in patched:
            del module.forward  # the class's forward again
            del module._kvlab_w32, module._kvlab_b32


# open float32_gemms contexts (a list: one mutable cell shared by every importer)
_FLOAT32_ATTENTION = [0]


def float32_attention() -> bool:
    """True while a :func:`float32_gemms` context is open: kvlab attention then computes bf16/fp16 SDPA on the CPU
    in float32 (inputs widened exactly, output rounded back to their dtype)."""
    return _FLOAT32_ATTENTION[0] > 0


def _reroute(module: torch.nn.Linear) -> None:
    """Give one Linear layer a float32-GEMM ``forward`` with float32 copies of its weight and bias."""
    module._kvlab_w32 = module.weight.detach().float()
    module._kvlab_b32 = None if module.bias is None else module.bias.detach().float()

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x.float(), module._kvlab_w32, module._kvlab_b32).to(x.dtype)

    module.forward = forward


def cpu_matmul_mode(requested: str, ratio: float | None, device: torch.device) -> str:
    """What a run's Linear layers go through: ``"float32"`` (:func:`float32_gemms`), ``"native"`` (torch's kernels
    for the model dtype) or ``"not applicable"`` (a GPU, or a float32 model). Used by ``kvlab eval`` and
    ``kvlab bench decode`` (``--cpu-matmul``).

    Args:
        requested: ``"auto"``, ``"native"`` or ``"float32"``; ``"auto"`` picks float32 when ``ratio`` (the dtype's
            matmul time over float32's, :func:`matmul_time_ratio`) is above :data:`SLOW_DTYPE_RATIO`.
        ratio: None for float32 models and non-CPU devices.
        device: where the model runs.

    Raises:
        ValueError: an unknown ``requested``, or ``"float32"`` for a non-CPU device (each named).
    """
    if requested not in ("auto", "native", "float32"):
        raise ValueError(f"`cpu_matmul` must be 'auto', 'native' or 'float32', got {requested!r}")
    if device.type != "cpu":
        if requested == "float32":
            raise ValueError(f"`cpu_matmul` 'float32' applies to a CPU run, got device {str(device)!r}")
        return "not applicable"
    if ratio is None:  # a float32 model multiplies in float32 whatever was asked
        return "not applicable"
    if requested == "auto":
        return "float32" if ratio > SLOW_DTYPE_RATIO else "native"
    return requested


def float32_copy_bytes(model: torch.nn.Module) -> int:
    """Bytes of the float32 weight and bias copies :func:`float32_gemms` would hold for ``model`` (4 per element of
    every bf16/fp16 ``nn.Linear``)."""
    total = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight.dtype in (torch.bfloat16, torch.float16):
            total += 4 * (module.weight.numel() + (0 if module.bias is None else module.bias.numel()))
    return total


def cpu_matmul_policy(
    model: torch.nn.Module, requested: str, device: torch.device, available_bytes: int | None = -1
) -> tuple[dict, contextlib.AbstractContextManager]:
    """Measure this CPU's matmul ratio for ``model``'s dtype and decide the GEMM path, as a run records it.

    The float32 path holds float32 copies of the Linear weights (:func:`float32_copy_bytes`); when they would take
    more than half the available memory, ``"auto"`` keeps torch's own kernels (and says why in ``cpu_matmul_note``)
    and an explicit ``"float32"`` is refused.

    Args:
        available_bytes: memory free for the copies; ``-1`` (default) reads it
            (:func:`kvlab.runtime.provenance.available_memory_bytes`), None = unknown (no check).

    Returns:
        ``(record, context)``: ``record`` is ``{"matmul_time_ratio_vs_float32": float | None, "cpu_matmul": mode}``
        (:func:`matmul_time_ratio` rounded to 0.01, :func:`cpu_matmul_mode`), plus ``cpu_matmul_note`` when
        ``"auto"`` fell back for lack of memory; ``context`` is :func:`float32_gemms` on ``model`` when the mode is
        float32, else a context that changes nothing. Run the measured work inside it.

    Raises:
        ValueError: from :func:`cpu_matmul_mode`, or ``"float32"`` requested when the copies would not fit (the
            bytes needed and available named).
    """
    ratio = matmul_time_ratio(next(model.parameters()).dtype, device)
    mode = cpu_matmul_mode(requested, ratio, device)
    record = {"matmul_time_ratio_vs_float32": None if ratio is None else round(ratio, 2), "cpu_matmul": mode}
    if mode == "float32":
        if available_bytes == -1:
            from kvlab.runtime.provenance import available_memory_bytes

            available_bytes = available_memory_bytes()
        need = float32_copy_bytes(model)
        if available_bytes is not None and need > available_bytes / 2:
            why = (
                f"float32 copies of the Linear weights ({need / 2**30:.2f} GiB) would take more than half the "
                f"available memory ({available_bytes / 2**30:.2f} GiB)"
            )
            if requested == "float32":
                raise ValueError(f"`cpu_matmul` 'float32': {why}; use 'native'")
            record.update(cpu_matmul="native", cpu_matmul_note=f"{why}: torch's own kernels were used")
    gemms = float32_gemms(model) if record["cpu_matmul"] == "float32" else contextlib.nullcontext()
    return record, gemms
