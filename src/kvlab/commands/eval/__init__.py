"""``kvlab eval``: the paired float vs quantized KV-cache experiment (docs/EVAL.md). Its flags are in
:mod:`.flags`, the ``EvalConfig`` they build in :mod:`.settings`, the run itself in :mod:`.run`; the engine is
:mod:`kvlab.eval`."""

from __future__ import annotations

from kvlab.commands.eval import flags, run


def register(sub) -> None:
    """Add ``kvlab eval`` (:func:`kvlab.commands.eval.flags.add_flags`, run by :func:`kvlab.commands.eval.run.run`) to
    ``sub``, and record every setting flag's default in ``RESUME_IGNORES`` (``--resume`` refuses one given)."""
    p = sub.add_parser(
        "eval",
        help="paired experiment: DynamicCache vs quantized caches (KIVI, HF HQQ) on one model",
        description="Run the paired experiment: a capacity matrix (contexts) and a residual-window matrix, "
        "each cache candidate against DynamicCache on the same prompts, judged by quality and latency gates; "
        "write results/<label>.json.",
    )
    flags.add_flags(p)
    p.set_defaults(func=run.run)
    run.RESUME_IGNORES.update(
        {
            dest: default
            for dest, default in vars(p.parse_args([])).items()
            if dest not in ("func", "resume", "json")
        }
    )
