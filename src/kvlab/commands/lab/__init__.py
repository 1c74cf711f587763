"""``kvlab lab``: the mechanics chapter's toy decoder (cached vs full recompute, FLOPs, append cost) or ``--real``: a
real model decoded through every exact cache (:mod:`.decode`); ``kvlab lab video``: the autoregressive video KV
cache lab (:mod:`.video`); ``kvlab lab eviction``: sinks + window vs recompute (:mod:`.eviction`). What they
share is in :mod:`.common`; the logic lives in :mod:`kvlab.lab`."""

from __future__ import annotations

import argparse

from kvlab.commands import fail
from kvlab.commands.lab import decode, eviction, video

GIVEN = "lab_options_given"  # the `kvlab lab` options typed: (option string, dest, value set), in order


def register(subparsers) -> None:
    """Add ``kvlab lab`` (:func:`kvlab.commands.lab.decode.register`) and its subcommands ``video`` and ``eviction``
    to ``subparsers``; a ``kvlab lab`` option typed before a subcommand that ignores it is refused."""
    p = decode.register(subparsers)
    for action in p._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            action.__class__ = _recorded(type(action))
    sub = p.add_subparsers(dest="lab_command", metavar="{video,eviction}", parser_class=video.VideoParser)
    video.register(sub)
    eviction.register(sub)
    for name, parser in sub.choices.items():
        parser.set_defaults(func=_refusing_lab_options(name, parser))


def _recorded(base: type) -> type:
    """``base`` (an argparse action class) that also notes what it set in ``args.lab_options_given``."""

    class Recorded(base):
        def __call__(self, parser, namespace, values, option_string=None):
            super().__call__(parser, namespace, values, option_string)
            value = getattr(namespace, self.dest, None)
            setattr(namespace, GIVEN, [*getattr(namespace, GIVEN, []), (option_string, self.dest, value)])

    return Recorded


def _refusing_lab_options(name: str, parser: argparse.ArgumentParser):
    """The run of ``kvlab lab <name>`` (``parser``'s), refusing an option of ``kvlab lab`` typed before ``<name>``
    that the subcommand ignores: one it does not take (``--real``), or one whose value its own default replaced
    (``kvlab lab --model smollm2-135m eviction`` ran the bundled model). One that reaches it (``--json``) passes."""
    run, dests = parser.get_default("func"), {action.dest for action in parser._actions}

    def guarded(args: argparse.Namespace) -> int:
        recorded = getattr(args, GIVEN, [])
        ignored = [flag for flag, dest, value in recorded if dest not in dests or getattr(args, dest) != value]
        given = list(dict.fromkeys(ignored))
        if given:
            return fail(
                args,
                f"{', '.join(given)} before '{name}' {'is an option' if len(given) == 1 else 'are options'} of "
                f"kvlab lab itself, which kvlab lab {name} ignores; put kvlab lab {name}'s options after "
                f"'{name}' (kvlab lab {name} --help lists them)",
            )
        return run(args)

    return guarded
