"""The transformers call convention kvlab speaks: the name of the argument that carries a cache.

transformers 5.24 renamed the cache argument of every model's ``forward`` and of ``generate`` from
``past_key_values`` to ``cache``; the old name still works there but raises a ``FutureWarning`` (removed for
``forward`` in 5.40, for ``generate`` in 6.0), and releases before 5.24 know only the old name. kvlab reads the
installed model's ``forward`` signature instead of a version number, so it works on every release and on custom
models with either name.
"""

from __future__ import annotations

import inspect
from typing import Any


def cache_kwarg(model: Any) -> str:
    """Name of the cache argument of ``model.forward`` and ``model.generate``.

    ``"cache"`` when ``model.forward`` has a parameter of that name (transformers >= 5.24), else
    ``"past_key_values"`` (transformers < 5.24, custom models written against it). Use it as
    ``model(input_ids, **{cache_kwarg(model): cache})`` or ``model.generate(..., **{cache_kwarg(model): cache})``.

    Raises:
        TypeError: ``model`` has no callable ``forward`` (the object's type named).
    """
    forward = getattr(model, "forward", None)
    if not callable(forward):
        raise TypeError(
            f"`model` must have a callable `forward` (a transformers model), got {type(model).__name__}"
        )
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
