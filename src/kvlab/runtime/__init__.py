"""Run-time helpers shared by eval, bench, lab and the commands: one leaf module each, importing no other kvlab code.

``device``        resolve a device name, synchronize before reading a clock
``dtypes``        model dtype names -> ``torch.dtype``
``hf_api``        the name of the cache argument of the installed transformers (``cache``/``past_key_values``)
``tensor_bytes``  exact live tensor bytes of a code block on any device (``TorchDispatchMode``)
``provenance``    versions and machine facts recorded next to results
``atomic``        write a file atomically with ordinary permissions (torch-free)
``timing``        interleaved timing, same-round latency ratios, contention read from /proc (torch-free)
``hub``           is the Hugging Face hub reachable (one short TCP connect; torch-free)
``text_files``    read a text file by its byte-order mark (UTF-8 BOM, UTF-16 from PowerShell; torch-free)
``checks``        a count is a non-bool int >= N; a comma-separated list typed on the command line (torch-free)
``console``       the rich console on stdout, wider than 80 columns into a pipe (torch-free)

This package imports nothing at import time, so ``kvlab.runtime.atomic`` stays torch-free.
"""
