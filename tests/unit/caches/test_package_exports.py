"""Every cache class of :mod:`kvlab.caches` is importable from the package, as its siblings are (``MixedCache``
and ``FloatKernelCache`` were not: ``from kvlab.caches import MixedCache`` raised)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from transformers import Cache

import kvlab.caches


def test_every_cache_class_is_exported_by_the_package():
    defined = {}
    for info in pkgutil.iter_modules(kvlab.caches.__path__):
        module = importlib.import_module(f"kvlab.caches.{info.name}")
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, Cache) and obj.__module__ == module.__name__:
                defined[name] = obj
    assert {"MixedCache", "FloatKernelCache", "KIVICache"} <= set(defined)
    for name, cls in defined.items():
        assert name in kvlab.caches.__all__, name
        assert getattr(kvlab.caches, name) is cls, name
