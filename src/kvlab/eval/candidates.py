"""Cache candidates of ``kvlab eval``: a registry of names to cache factories.

* ``dynamic`` — transformers ``DynamicCache`` (the float baseline).
* ``kivi-N`` (N in 2, 4, 8) — :class:`kvlab.caches.KIVICache`: keys per-channel, values per-token.
* ``hqq-N`` / ``quanto-N`` — transformers ``QuantizedCache`` with the HQQ backend (axis 1, as in the quantization chapter) or
  quanto (axis 0), when the ``hf`` extra is installed; otherwise the candidate is recorded as skipped with the reason.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from typing import Any

_NAME = re.compile(r"^(dynamic|kivi-(2|4|8)|hqq-(2|4|8)|quanto-(2|4))$")


def check_candidate_names(names: tuple[str, ...]) -> None:
    """Raise ``ValueError`` naming any unknown candidate, a duplicate, or a list without ``dynamic``."""
    if not names:
        raise ValueError("`candidates` must not be empty")
    bad = [n for n in names if not isinstance(n, str) or not _NAME.match(n)]
    if bad:
        raise ValueError(
            f"unknown cache candidate(s) {bad}; known: dynamic, kivi-2, kivi-4, kivi-8, hqq-2, hqq-4, hqq-8, "
            f"quanto-2, quanto-4"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate cache candidates in {list(names)}")
    if "dynamic" not in names:
        raise ValueError(f"`candidates` must include the baseline 'dynamic', got {list(names)}")


@dataclass(frozen=True)
class Candidate:
    """One cache candidate: ``family`` in {dynamic, kivi, hqq, quanto}, ``nbits`` (None for dynamic)."""

    name: str
    family: str
    nbits: int | None

    @classmethod
    def parse(cls, name: str) -> Candidate:
        check_candidate_names((name,) if name == "dynamic" else ("dynamic", name))
        if name == "dynamic":
            return cls(name, "dynamic", None)
        family, bits = name.split("-")
        return cls(name, family, int(bits))

    def unavailable_reason(self) -> str | None:
        """Why this candidate cannot run here (a missing optional package), or ``None``."""
        if self.family in ("hqq", "quanto"):
            module = "hqq" if self.family == "hqq" else "optimum.quanto"
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:
                found = False
            if not found:
                return f"package for backend '{self.family}' is not installed (pip install 'kvlab[hf]')"
        return None

    def make(
        self,
        model_config: Any,
        residual_length: int,
        group_size: int,
        hqq_group_size: int = 64,
        kivi_attention: str = "dequantize",
    ):
        """A fresh cache for one run. ``group_size`` applies to KIVI, ``hqq_group_size`` to HQQ/quanto."""
        from transformers import DynamicCache, QuantizedCache

        from kvlab.caches import KIVICache

        if self.family == "dynamic":
            return DynamicCache()
        if self.family == "kivi":
            return KIVICache(
                nbits=self.nbits,
                group_size=group_size,
                residual_length=residual_length,
                attention=kivi_attention,
            )
        axis = 1 if self.family == "hqq" else 0  # as in the quantization chapter: HQQ needs axis 1 for both K and V
        return QuantizedCache(
            backend=self.family,
            config=model_config,
            nbits=self.nbits,
            axis_key=axis,
            axis_value=axis,
            q_group_size=hqq_group_size,
            residual_length=residual_length,
        )

    def describe(
        self, residual_length: int, group_size: int, hqq_group_size: int, kivi_attention: str = "dequantize"
    ) -> dict:
        """JSON description of the candidate's settings."""
        if self.family == "dynamic":
            return {"name": self.name, "family": "dynamic"}
        if self.family == "kivi":
            return {
                "name": self.name,
                "family": "kivi",
                "nbits": self.nbits,
                "group_size": group_size,
                "residual_length": residual_length,
                "key_axis": "per-channel",
                "value_axis": "per-token",
            }
        axis = 1 if self.family == "hqq" else 0
        return {
            "name": self.name,
            "family": self.family,
            "nbits": self.nbits,
            "group_size": hqq_group_size,
            "residual_length": residual_length,
            "axis_key": axis,
            "axis_value": axis,
        }
