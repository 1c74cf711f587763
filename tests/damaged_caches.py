"""Test-only damaged caches: caches that lose distant context on purpose, so the long-context measurement can be
shown to fail them (``kvlab eval``'s recall and passkey probes, its gates and its decision)."""

from __future__ import annotations

from transformers.cache_utils import Cache, DynamicSlidingWindowLayer


class NewestTokensCache(Cache):
    """Keeps only the newest ``window - 1`` tokens of every layer after each update; positions keep counting
    (``get_seq_length`` is every token seen), and the prefill itself still attends to the whole prompt, as a
    StreamingLLM-style eviction without attention sinks would. Everything older than the window is lost."""

    def __init__(self, window: int = 256):
        if isinstance(window, bool) or not isinstance(window, int) or window < 2:
            raise ValueError(f"`window` must be an integer >= 2, got {window!r}")
        self.window = window
        super().__init__(layer_class_to_replicate=lambda: DynamicSlidingWindowLayer(sliding_window=window))

    def first_visible(self, position: int) -> int:
        """First token position that the token decoded at ``position`` (0-based) still attends to: the layer
        returns the ``window - 1`` tokens it kept plus the new one."""
        return max(0, position - self.window + 1)
