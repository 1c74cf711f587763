"""The planner's commands, one module each: ``kvlab plan`` (:mod:`.plan`), ``kvlab roofline`` (:mod:`.roofline`),
``kvlab video`` (:mod:`.video`); the flags they share in :mod:`.flags`, their tables in :mod:`.render`. The logic
is in the torch-free :mod:`kvlab.plan`."""

from __future__ import annotations

from kvlab.commands.plan import plan, roofline, video


def register(subparsers) -> None:
    """Add the planner's commands ``kvlab plan``, ``kvlab roofline`` and ``kvlab video`` to ``subparsers``."""
    plan.register(subparsers)
    roofline.register(subparsers)
    video.register(subparsers)
