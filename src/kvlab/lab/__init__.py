"""kvlab's labs (docs/lab.md): cached decoding vs full recompute, FLOPs, append cost, AR video.

* :mod:`kvlab.lab.toy` — the numpy toy decoder (GQA, fp32) and its two greedy generators.
* :mod:`kvlab.lab.flops` — analytic matmul FLOPs of both generators (docs/lab.md).
* :mod:`kvlab.lab.equivalence` — :func:`run_toy_lab`, the experiment behind ``kvlab lab``.
* :mod:`kvlab.lab.append` — per-step append cost, growing ``torch.cat`` vs preallocated in place (torch).
* :mod:`kvlab.lab.exactness` — a real transformers model decoded through each exact cache (torch).
* :mod:`kvlab.lab.eviction` — ``kvlab lab eviction``: attention sinks + window against recomputing the window.
* :mod:`kvlab.lab.longrun` — what the real-model runs check before their work (the model's positions, the
  machine's memory) and the progress steps their long loops are cut into.
* :mod:`kvlab.lab.video` — ``kvlab lab video``: a toy block-autoregressive video denoiser, its frame KV cache
  against full recompute, sink + window eviction with logical (t, h, w) positions, negative controls;
  :mod:`kvlab.lab.video_model`, :mod:`kvlab.lab.video_cache`, :mod:`kvlab.lab.video_flops` hold its parts.
"""

from kvlab.lab.equivalence import run_toy_lab
from kvlab.lab.flops import cached_generation_flops, naive_generation_flops
from kvlab.lab.toy import ToyConfig, generate_cached, generate_naive

__all__ = [
    "ToyConfig",
    "cached_generation_flops",
    "generate_cached",
    "generate_naive",
    "naive_generation_flops",
    "run_toy_lab",
]
