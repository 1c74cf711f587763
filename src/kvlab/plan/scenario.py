"""The default scenario: the one model, device and reserve every command assumes unless told otherwise.

The mechanics chapter ("KV Cache and Autoregressive Video Generation", §01 and §05) sizes its examples for
Llama-3-8B in BF16 on an 80 GiB A100 with a 4 GiB reserve for activations and framework. ``kvlab plan``,
``kvlab paging`` and ``kvlab figures`` read these names from here, so the scenario is written once.

Pure Python; no torch.
"""

from __future__ import annotations

DEFAULT_MODEL = "llama-3-8b"  # a planner preset written from the model's public config.json
DEFAULT_GPU = "A100-80GB"  # a row of kvlab.plan.hardware: 81,920 MiB as the device reports it (80 GiB)
DEFAULT_KV_DTYPE = "bf16"  # the model's own dtype
DEFAULT_RESERVE_GIB = 4.0  # GiB (2**30 B) kept back for activations, framework and fragmentation
DEFAULT_CONTEXT_TOKENS = 8192  # tokens per sequence where a command needs one context
