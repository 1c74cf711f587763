"""What a decode-time benchmark starts from: its caches (:class:`BenchCandidate`, a cache-registry name), the
run-wide cache settings from the bench flags, the model and its prompt loaded, the attention path set for a cache,
the exact prefill written into each fresh cache, and one decode step. ``kvlab bench decode`` and ``kvlab bench
memory`` share them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kvlab.caches.entry import ResolvedCache
from kvlab.caches.registry import CacheSettings, resolve
from kvlab.runtime.checks import echoed_value
from kvlab.runtime.dtypes import float32_attention


@dataclass(frozen=True)
class BenchCandidate:
    """One cache of the benchmark, by its cache-registry name (:mod:`kvlab.caches.registry`): ``family`` in
    {dynamic, kivi, hqq, quanto, paged, fp8, ...}; ``attention`` (``"fused"``/``"dequantize"``) for KIVI and FP8;
    ``cache``: its registry entry, resolved once by :meth:`parse` (:meth:`make` and :meth:`describe` resolve again
    with the run's settings)."""

    name: str
    family: str
    nbits: int | None = None
    attention: str | None = None  # "fused" or "dequantize" for KIVI and FP8
    cache: ResolvedCache | None = field(default=None, repr=False, compare=False)

    def __reduce__(self):  # the entry holds functions: a pickled candidate is its name
        return (BenchCandidate.parse, (self.name,))

    @classmethod
    def parse(cls, name: str) -> BenchCandidate:
        """``"kivi4-fused"`` (or ``"kivi-4-fused"``, ``"KIVI-4-fused"``) -> ``BenchCandidate("kivi4-fused", "kivi",
        4, "fused")``: the registry's canonical name with ``family-N`` written ``familyN``, the spelling the targets
        and records use (so one cache has one name: duplicates and the baseline are matched by it).

        Raises:
            ValueError: a name the cache registry does not know (the message says why).
        """
        try:
            cache = resolve(name)
        except ValueError as exc:
            raise ValueError(f"unknown cache {name!r}: {exc}") from None
        name = cache.name.canonical
        hyphened = f"{cache.family}-{cache.nbits}"
        if cache.nbits is not None and name.startswith(hyphened):
            name = f"{cache.family}{cache.nbits}{name[len(hyphened) :]}"
        return cls(name, cache.family, cache.nbits, cache.describe().get("attention"), cache)

    def _resolved(self) -> ResolvedCache:
        return self.cache if self.cache is not None else resolve(self.name)

    @property
    def uses_kvlab_attention(self) -> bool:
        """Whether the model must run kvlab attention (:func:`kvlab.attention.enable`) for this cache (its registry
        entry says: fused KIVI, FP8, the evicting caches that read queries)."""
        return self._resolved().uses_kvlab_attention

    def unavailable_reason(self) -> str | None:
        """Why this cache cannot run here (its optional backend is missing), or ``None``."""
        return self._resolved().unavailable_reason()

    def make(self, model_config: Any, settings: CacheSettings):
        """A fresh cache object (the registry's factory; the name's own settings override ``settings``)."""
        return resolve(self._resolved().name, settings).make(model_config)

    def describe(self, settings: CacheSettings) -> dict:
        """JSON description of the cache and its settings (the registry's)."""
        return resolve(self._resolved().name, settings).describe()


def bench_settings(settings: CacheSettings | None, cands: tuple | list = ()) -> CacheSettings:
    """The caches' run-wide settings (``None``: every family at its defaults; the CLI gives ``--group-size``,
    ``--residual-length``, ``--hqq-group-size``), each of ``cands`` (the run's :class:`BenchCandidate` objects)
    resolved with them now, before any model loads.

    Raises:
        ValueError: a value a family reading it refuses (named with the cache: a residual length that is not a
            multiple of the KIVI group size failed every cell, then the run, after the model had loaded).
    """
    settings = CacheSettings() if settings is None else settings
    for cand in cands:
        cand.describe(settings)
    return settings


def parse_candidates(names: tuple[str, ...] | list[str]) -> list[BenchCandidate]:
    """Parse cache names; ``dynamic`` must be among them (ratios divide by it).

    Raises:
        ValueError: an unknown or duplicate name, or no ``dynamic``.
    """
    parsed = [BenchCandidate.parse(n) for n in names]
    if len({c.name for c in parsed}) != len(parsed):
        raise ValueError(f"duplicate caches in {list(names)}")
    if "dynamic" not in {c.name for c in parsed}:
        raise ValueError(f"the caches must include 'dynamic' (the ratio baseline), got {list(names)}")
    return parsed


def check_model_shape(cands: list[BenchCandidate], settings: CacheSettings, shape: dict, contexts) -> None:
    """Refuse, once the model's shape is known and before any cell, an HQQ/quanto group size
    (``--hqq-group-size``, or a name's own ``:hqq_group_size=``) that does not divide one prompt's K/V values at
    each of ``contexts`` on this model: transformers' quantized layers quantize the whole prompt in groups of that
    size, so every cell of those caches failed and the run went on (exit 0 with ``--quick``).
    :func:`kvlab.eval.candidates.check_hqq_group_size`, as ``kvlab eval`` and ``kvlab bench flush`` refuse it.
    ``shape``: the model description of :func:`load_bench_model` (``kv_heads``, ``head_dim``); caches not
    installed here are skipped by the run and not checked.

    Raises:
        ValueError: naming ``hqq_group_size`` with its flag, the value, the model's shape and a divisor that fits.
    """
    from kvlab.eval.candidates import check_hqq_group_size

    by_size: dict[int, list[str]] = {}
    for cand in cands:
        resolved = resolve(cand._resolved().name, settings)
        if "hqq_group_size" in resolved.entry.reads and cand.unavailable_reason() is None:
            by_size.setdefault(resolved.settings.hqq_group_size, []).append(cand.name)
    for size, names in by_size.items():
        check_hqq_group_size(names, shape["kv_heads"], shape["head_dim"], size, tuple(contexts))


def load_bench_model(model: Any, dtype: str, device: torch.device) -> tuple[Any, Any, dict]:
    """``(model, tokenizer or None, description)``.

    ``model`` is ``None`` (the bundled reference model), a local directory or hub id (via
    :func:`kvlab.models.load_model`), or an already built ``torch.nn.Module`` (tests), used as is.
    """
    if isinstance(model, torch.nn.Module):
        model.eval()
        desc = {"name": type(model).__name__, "source": "in-memory model object"}
        return model, None, desc | _model_shape(model)
    from kvlab.models import load_model, reference_model_path

    lm, tokenizer = load_model(model, dtype=dtype, device=str(device))
    name = "bundled reference model" if model is None else str(model)
    path = str(reference_model_path()) if model is None else str(model)
    return lm, tokenizer, {"name": name, "source": path} | _model_shape(lm)


def _model_shape(model: Any) -> dict:
    cfg = (
        model.config.get_text_config(decoder=True)
        if hasattr(model.config, "get_text_config")
        else model.config
    )
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return {
        "architecture": type(model).__name__,
        "layers": cfg.num_hidden_layers,
        "q_heads": cfg.num_attention_heads,
        "kv_heads": cfg.num_key_value_heads,
        "head_dim": head_dim,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def prompt_ids(tokenizer: Any, vocab_size: int, n_tokens: int, seed: int = 0) -> tuple[list[int], str]:
    """``n_tokens`` token ids and where they come from.

    The bundled model's held-out text when the tokenizer and text are available (tiled when it is shorter than
    ``n_tokens``); otherwise seeded uniform random ids in ``[0, vocab_size)``.
    """
    if tokenizer is not None:
        try:
            from kvlab.models import heldout_token_ids

            try:
                return heldout_token_ids(tokenizer, n_tokens), "held-out text of the bundled model"
            except ValueError:  # shorter than n_tokens: repeat the whole text
                from kvlab.models import heldout_text

                ids = list(tokenizer(heldout_text(), add_special_tokens=False, verbose=False)["input_ids"])
                reps = -(-n_tokens // len(ids))
                return (ids * reps)[:n_tokens], f"held-out text of the bundled model, tiled {reps}x"
        except FileNotFoundError:
            pass
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (n_tokens,), generator=gen).tolist()
    return ids, f"uniform random token ids (seed {seed})"


def check_room(
    model: Any,
    dtype: str,
    device: torch.device,
    tokens: int,
    asked: int,
    setting: str = "contexts",
    progress: Any = None,
) -> str | None:
    """Refuse, before the model loads, a run whose longest prompt cannot be held: ``tokens`` prompt tokens (the
    longest of ``setting``, ``asked`` tokens, with the ones decoded after it) need at least the K/V of a
    ``DynamicCache`` of every token in ``dtype`` (the exact prefill every cache starts from), plus the weights when
    the model is not loaded yet and the prompt ids; more than ``device`` has free (``MemAvailable`` on a CPU,
    ``torch.cuda.mem_get_info`` on CUDA) is refused. The model's sizes come from its files
    (:func:`kvlab.lab.longrun.configured_spec`; a ``torch.nn.Module``: its config); no check where they cannot be
    read or the free memory is unknown.

    Returns:
        A note when ``tokens`` pass the model's ``max_position_embeddings`` (timed all the same: a RoPE model runs
        there), also told to ``progress`` (a ``callable(str)``) when given; else None.

    Raises:
        ValueError: the estimate does not fit, naming ``setting`` and ``asked`` (plain for ``contexts``, a comma
            list: it pastes back as one item), the bytes needed and the bytes free.
    """
    from kvlab.lab.longrun import configured_spec, gib
    from kvlab.plan.kv_formats import kv_dtype
    from kvlab.plan.ledger import kv_bytes
    from kvlab.plan.spec import spec_from_config
    from kvlab.runtime.provenance import available_memory_bytes

    loaded = isinstance(model, torch.nn.Module)
    try:
        spec = spec_from_config(model.config.to_dict()) if loaded else configured_spec(model)
        itemsize = kv_dtype(dtype, "bfloat16").bytes_per_element
        if spec is None:
            return None
        per_token = kv_bytes(spec, 1, kv=dtype) + 16  # K/V of one token, its id (a list and a tensor)
        need = kv_bytes(spec, tokens, kv=dtype) + 16 * tokens
    except (ValueError, TypeError, AttributeError, OSError):  # sizes unknown: the load or the run reports it
        return None
    weights = 0 if loaded else int((spec.num_parameters or 0) * itemsize)
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else available_memory_bytes()
    if free is not None and need + weights > free:
        fits = max(0, (free - weights) // per_token)
        where = "the GPU" if device.type == "cuda" else "the machine"
        raise ValueError(
            f"`{setting}` {echoed_value(asked, list_flag=setting == 'contexts')} cannot be held: its {tokens:,} prompt tokens need at least "
            f"{gib(need + weights)} (their K/V in {dtype}{' and the weights' if weights else ''}), {where} has "
            f"{gib(free)} free: at most about {fits} tokens fit"
        )
    limit = spec.max_position_embeddings
    if limit is None or tokens <= limit:
        return None
    note = (
        f"{tokens:,} prompt tokens pass the model's max_position_embeddings ({limit:,}): measured at positions it "
        f"was not trained on"
    )
    if progress:
        progress(f"note: {note}")
    return note


def load_prompted_model(model: Any, dtype: str, device: torch.device, tokens: int):
    """:func:`load_bench_model` and a prompt of ``tokens`` tokens for it (:func:`prompt_ids`) on ``device``.

    Returns:
        ``(model, description, ids, prompt_source)``; ``ids``: ``[1, tokens]`` token ids.
    """
    lm, tokenizer, model_desc = load_bench_model(model, dtype, device)
    ids_list, source = prompt_ids(tokenizer, lm.config.vocab_size, tokens)
    return lm, model_desc, torch.tensor([ids_list], device=device), source


def set_attention(model: Any, candidate: BenchCandidate) -> str:
    """Switch ``model`` to kvlab attention for fused KIVI, and for every cache while float32 GEMMs run (its SDPA is
    then float32 too: :func:`kvlab.runtime.dtypes.float32_attention`), to plain SDPA otherwise; return the name
    used."""
    if candidate.uses_kvlab_attention or float32_attention():
        from kvlab.attention import enable

        enable(model)
    elif getattr(model.config, "_attn_implementation", None) != "sdpa":
        model.set_attn_implementation("sdpa")
    return model.config._attn_implementation


def prefill(model: Any, ids: torch.Tensor, cache: Any, chunk_tokens: int) -> None:
    """Feed ``ids`` ``[1, T]`` through ``model`` into ``cache`` in chunks of ``chunk_tokens`` (last logits only)."""
    from kvlab.runtime.hf_api import cache_kwarg

    kw = cache_kwarg(model)
    for start in range(0, ids.shape[1], chunk_tokens):
        model(input_ids=ids[:, start : start + chunk_tokens], use_cache=True, logits_to_keep=1, **{kw: cache})


def decode_step(model: Any, token: torch.Tensor, cache: Any) -> torch.Tensor:
    """One single-token forward: ``token`` ``[1, 1]`` -> logits ``[1, 1, vocab]``."""
    from kvlab.runtime.hf_api import cache_kwarg

    return model(input_ids=token, use_cache=True, **{cache_kwarg(model): cache}).logits


def exact_prefill(model: Any, ids: torch.Tensor, chunk_tokens: int):
    """Prefill ``ids`` ``[1, T]`` into a ``DynamicCache`` with exact SDPA attention; return the cache."""
    from transformers import DynamicCache

    set_attention(model, BenchCandidate.parse("dynamic"))
    cache = DynamicCache()
    prefill(model, ids, cache, chunk_tokens)
    return cache


def fill_cache(cache: Any, source: Any) -> None:
    """Write the keys/values of ``source`` (a prefilled ``DynamicCache``) into the fresh ``cache``, one ``update``
    per layer: the state a single-chunk prefill of the same tokens leaves in ``cache`` (its first update sees the
    exact keys/values of the whole prompt). kvlab's :class:`KIVICache` takes them through its ``load``."""
    if hasattr(cache, "load"):
        cache.load((layer.keys, layer.values) for layer in source.layers)
        return
    for idx, layer in enumerate(source.layers):
        cache.update(layer.keys, layer.values, idx)
