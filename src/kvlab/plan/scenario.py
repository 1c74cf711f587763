"""The default scenario: the one model, device and reserve every command assumes unless told otherwise.

The mechanics chapter ("KV Cache and Autoregressive Video Generation", section 01 and section 05) sizes its examples for
Llama-3-8B in BF16 on an 80 GiB A100 with a 4 GiB reserve for activations and framework. ``kvlab plan``,
``kvlab paging`` and ``kvlab figures`` read these names from here, so the scenario is written once.

Pure Python; no torch.
"""

from __future__ import annotations

from kvlab.plan.hardware import get_hardware

DEFAULT_MODEL = "llama-3-8b"  # a planner preset written from the model's public config.json
DEFAULT_GPU = "A100-80GB"  # a row of kvlab.plan.hardware: 81,920 MiB as the device reports it (80 GiB)
DEFAULT_GPU_MEMORY_GIB: float = get_hardware(
    DEFAULT_GPU
).memory_gib  # 80.0 GiB: the whole device as the budget
DEFAULT_KV_DTYPE = "bf16"  # the model's own dtype
DEFAULT_RESERVE_GIB = 4.0  # GiB (2**30 B) kept back for activations, framework and fragmentation
DEFAULT_CONTEXT_TOKENS = 8192  # tokens per sequence where a command needs one context
