"""``kvlab lab``: the mechanics chapter's toy decoder (cached vs full recompute, FLOPs, append cost) or ``--real``: a
real model decoded through every exact cache (:mod:`.decode`); ``kvlab lab video``: the autoregressive video KV
cache lab (:mod:`.video`); ``kvlab lab eviction``: sinks + window vs recompute (:mod:`.eviction`). What they
share is in :mod:`.common`; the logic lives in :mod:`kvlab.lab`."""

from __future__ import annotations

from kvlab.commands.lab import decode, eviction, video


def register(subparsers) -> None:
    p = decode.register(subparsers)
    sub = p.add_subparsers(dest="lab_command", metavar="{video,eviction}", parser_class=video.VideoParser)
    video.register(sub)
    eviction.register(sub)
