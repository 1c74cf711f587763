"""One forward context per forward pass: how a kvlab cache hands something to the attention of the same layer.

A fused-mode cache (``KIVICache(attention="fused")``, ``FP8Cache(attention="fused")``) returns only part of a
layer's history as K/V and files the rest for that layer's attention (a :class:`Handoff`); a query-scored cache
(SnapKV, TOVA, KIVI+SnapKV) asks for the step's queries (an observer). Both go into the one :class:`ForwardContext`
of the forward pass under way, keyed by layer index, and kvlab attention
(:func:`kvlab.attention.interface.kvlab_attention_forward`) takes them out. The context is opened and closed once per
forward by hooks :func:`kvlab.attention.enable` puts on the model (:func:`install_hooks`), or by a caller around its
own calls (:func:`forward_context`); closing it raises if a hand-off, or a request that asked to be answered, was
left unread (the model does not run kvlab attention, or changed the K/V before its attention read them), so an
unread entry always fails the forward that left it, its last layer included, and nothing outlives the forward.

The pattern is vLLM's: ``vllm/forward_context.py`` (``set_forward_context`` / ``get_forward_context``) sets one
``ForwardContext`` per forward whose ``attn_metadata`` maps each attention layer to what it reads; see
https://docs.vllm.ai/en/latest/api/vllm/forward_context.html.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

_local = threading.local()


def same_tensor(key: torch.Tensor, handed: torch.Tensor | None) -> bool:
    """Whether ``key`` is ``handed`` (the key window a cache returned), or a view of it with the same shape and
    start: a model that changed the returned K/V before its attention (e.g. repeated them per expert) fails it."""
    return (
        handed is None or key is handed or (key.shape == handed.shape and key.data_ptr() == handed.data_ptr())
    )


@dataclass(kw_only=True)
class Handoff:
    """What a fused-mode cache layer hands to the attention of the same layer in the same forward (read once).

    Subclasses name the cache and what they hand off (for the error) and implement :meth:`attend`.
    """

    cache: ClassVar[str] = "a fused kvlab cache"  # the cache as the error names it (when no ``owner``)
    what: ClassVar[str] = "history"  # what it hands off, as the error names it
    # the keys the cache returned with this entry: the entry belongs to that call only
    key: torch.Tensor | None = None
    # the class name of the cache whose layer filed it ("MixedCache"), named in the error; None: ``cache``
    owner: str | None = None

    def matches(self, key: torch.Tensor) -> bool:
        """Whether ``key`` ``[B, Hkv, t, D]`` is the key window this entry was handed off with (:func:`same_tensor`)."""
        return same_tensor(key, self.key)

    def check_call(self, dropout: float, kwargs: dict) -> None:
        """Refuse (``ValueError``) an attention call this entry cannot serve, before it is taken (hook)."""

    def attend(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        """Attention of ``query [B, Hq, q, D]`` over what was handed off and the window ``key/value [B, Hkv, t,
        D]`` -> ``([B, q, Hq, D], None)`` (hook: each kind of hand-off reads its own history)."""
        raise NotImplementedError(f"{type(self).__name__} must implement attend")

    @classmethod
    def unread_error(
        cls, layer_idx: int | None, no_context: bool = False, owner: str | None = None
    ) -> RuntimeError:
        """The error of an entry of this kind for layer ``layer_idx`` that no kvlab attention read: left unread at
        the end of a forward, or (``no_context``) filed while no forward context was open; ``owner`` names the
        cache whose layer filed it (``"MixedCache"`` -> ``MixedCache(attention='fused')``), else :attr:`cache`."""
        if no_context:
            why = (
                f"layer {layer_idx}'s {cls.what} has no forward to be read in: kvlab attention opens one per forward "
                f"of an enabled model; a cache updated outside a model's forward must be inside "
                f"kvlab.attention.context.forward_context()"
            )
        else:
            why = (
                f"layer {layer_idx}'s {cls.what} was never read; if kvlab attention is enabled, the model changed "
                f"the K/V the cache returned before its attention read them, e.g. repeated them per expert, and "
                f"this cache cannot run on it"
            )
        cache = cls.cache if owner is None else f"{owner}(attention='fused')"
        return RuntimeError(
            f"{cache} needs kvlab attention on the model: call kvlab.attention.enable(model) first ({why})"
        )


Observer = Callable[[torch.Tensor, torch.Tensor, "float | None"], None]


@dataclass
class ForwardContext:
    """The hand-offs and query requests of one forward pass, keyed by layer index.

    ``handoff[layer]``: a :class:`Handoff` for that layer's attention, taken by it (:meth:`take`).
    ``observers[layer]``: ``callback(query [B, Hq, q, D], key [B, Hkv, kv, D], scale or None)``, called once after
    that layer's attention with the query states it used (SnapKV's observation window reads them); a callback with
    an ``unread_error()`` method must be answered in the forward (:meth:`check_read`), a plain one may go unanswered.
    """

    handoff: dict[int | None, Handoff] = field(default_factory=dict)
    observers: dict[int | None, Observer] = field(default_factory=dict)

    def hand_off(self, layer_idx: int | None, entry: Handoff) -> None:
        """File ``entry`` for the attention of ``layer_idx`` in this forward.

        Raises:
            RuntimeError: an entry of that layer is still unread (the layer's attention did not run between two
                updates of its cache: the model does not run kvlab attention).
        """
        old = self.handoff.get(layer_idx)
        if old is not None:
            self.handoff.clear()
            raise old.unread_error(layer_idx, owner=old.owner)
        self.handoff[layer_idx] = entry

    def take(self, layer_idx: int | None, key: torch.Tensor) -> Handoff | None:
        """The entry of ``layer_idx`` handed off with ``key`` (None when there is none or another key came: the
        attention then runs SDPA and the entry stays, unread, for :meth:`check_read`); the caller removes it with
        :meth:`done` once it has accepted the call."""
        entry = self.handoff.get(layer_idx)
        return entry if entry is not None and entry.matches(key) else None

    def done(self, layer_idx: int | None) -> None:
        """Drop the entry of ``layer_idx``: read once; the context must not keep the cache's blocks alive."""
        del self.handoff[layer_idx]

    def check_read(self) -> None:
        """Raise for the first entry this forward left unread (the context is cleared first).

        Raises:
            RuntimeError: a hand-off nobody read (:meth:`Handoff.unread_error`), or a request with an
                ``unread_error()`` that no attention answered (its own error, e.g. a query-scored cache's).
        """
        errors = [entry.unread_error(idx, owner=entry.owner) for idx, entry in self.handoff.items()]
        errors += [obs.unread_error() for obs in self.observers.values() if hasattr(obs, "unread_error")]
        self.handoff.clear()
        self.observers.clear()
        if errors:
            raise errors[0]


def current() -> ForwardContext | None:
    """This thread's open forward context, or None outside a forward (vLLM's ``get_forward_context``)."""
    return getattr(_local, "context", None)


@contextlib.contextmanager
def forward_context() -> Iterator[ForwardContext]:
    """Open this thread's forward context for the block, or join the one already open (then the opener checks it):
    for callers that run a forward with observers set beforehand, or update a cache outside a forward and read
    what it filed themselves. On leaving normally, :meth:`ForwardContext.check_read`; on an exception, the context
    is dropped unchecked and the exception goes on.

    Raises:
        RuntimeError: as :meth:`ForwardContext.check_read`, when this call opened the context.
    """
    ctx = current()
    if ctx is not None:
        yield ctx
        return
    ctx = _local.context = ForwardContext()
    try:
        yield ctx
    finally:
        _local.context = None
    ctx.check_read()


def _open(module: torch.nn.Module, args: Any) -> None:
    """Forward pre-hook: open a context unless one is open (an inner module of the same forward joins it)."""
    opened = current() is None
    if opened:
        _local.context = ForwardContext()
    _local.__dict__.setdefault("opened", []).append(opened)


def _close(module: torch.nn.Module, args: Any, output: Any) -> None:
    """Forward hook (always called): close the context this module's pre-hook opened and check it; after an
    exception in the forward (``output`` None) it is dropped unchecked."""
    stack = _local.__dict__.get("opened")
    if not stack or not stack.pop():
        return
    ctx, _local.context = current(), None
    if ctx is not None and output is not None:
        ctx.check_read()


_HOOKS = "_kvlab_forward_context_hooks"


def install_hooks(model: Any) -> None:
    """Open one forward context per forward of ``model`` (and of its ``base_model``, for a caller running the bare
    decoder): a pre-hook opens it, an always-called forward hook closes and checks it. Idempotent.

    Raises:
        RuntimeError: at the end of a forward, as :meth:`ForwardContext.check_read`.
    """
    modules = [model]
    base = getattr(model, "base_model", None)
    if isinstance(base, torch.nn.Module) and base is not model:
        modules.append(base)
    for module in modules:
        if getattr(module, _HOOKS, None) is None:
            handles = (
                module.register_forward_pre_hook(_open),
                module.register_forward_hook(_close, always_call=True),
            )
            setattr(module, _HOOKS, handles)
