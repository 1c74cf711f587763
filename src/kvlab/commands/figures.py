"""``kvlab figures``: draw the mechanics chapter's four figures (memory ledger, roofline, paged layout, video), the lab's
append-cost curves and, with ``--result``, an eval result's figures and a tasks result's score-vs-bytes figure. Logic
lives in :mod:`kvlab.figures` and :mod:`kvlab.task_figures`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvlab.commands import (
    EXIT_FILE_EXISTS,
    empty_path_flag,
    fail,
    file_exists_message,
    output_folder_problem,
    progress,
    table,
)
from kvlab.runtime.atomic import special_input_problem

TASKS_FIGURE = "tasks_scores.png"  # a kvlab tasks result's figure (kvlab.task_figures.plot_task_scores)
SENSITIVITY_FIGURE = "sensitivity.png"  # a sweep's figure (kvlab.sensitivity_figure.plot_sensitivity)


def register(subparsers) -> None:
    """Add ``kvlab figures`` (output folder, eval/tasks results, sweep and plan files; run by :func:`run`) to
    ``subparsers``."""
    p = subparsers.add_parser(
        "figures",
        help="draw the memory-ledger, roofline, paged-layout, video and video-cache figures, and an eval result's figures",
        description="Compute every number with kvlab in this run and draw the figures as PNG files; the "
        "numbers drawn are written to figures.json next to them, all or nothing: they are drawn in a hidden "
        "folder beside --out and moved in at the end, so an interrupted or failed run leaves --out as it was. "
        "Files of the same names in --out are kept: the command refuses (exit 2) unless --force.",
    )
    p.add_argument(
        "--out",
        default="figures",
        help="output folder (default: ./figures, made on a first run); a new folder is made only in a folder "
        "that exists",
    )
    p.add_argument(
        "--result",
        action="append",
        default=None,
        metavar="FILE",
        help="a kvlab eval result JSON (its figures) or a kvlab tasks result JSON (score vs × dyn, "
        f"{TASKS_FIGURE}); give it twice for one of each",
    )
    p.add_argument(
        "--sweep",
        default=None,
        metavar="FILE",
        help=f"a kvlab sensitivity sweep JSON: per-layer KL of keys and values in each format ({SENSITIVITY_FIGURE})",
    )
    p.add_argument(
        "--plan",
        default=None,
        metavar="FILE",
        help="a plan file (kvlab sensitivity allocate) whose per-layer formats are drawn under the --sweep curves",
    )
    p.add_argument("--no-probe", action="store_true", help="roofline without this machine's probe panel")
    p.add_argument("--no-append", action="store_true", help="skip the append-cost measurement and figure")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("--force", action="store_true", help="replace figure files that exist in --out")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``kvlab figures``: refuse bad input and figure files that exist (exit 2) before any work, then draw each
    figure into ``--out``. ``--out`` is made if it is new, but only in a folder that exists
    (:func:`kvlab.commands.output_folder_problem`): the default ``./figures`` is made on a first run."""
    from rich.console import Console

    from kvlab.eval.io import read_results
    from kvlab.figures import figure_files, figure_steps
    from kvlab.runtime.atomic import staged_folder

    # a new --out is made in a folder that exists (./figures on a first run); a typo'd parent is refused
    problem = empty_path_flag(args, "--out", kind="folder") or output_folder_problem(args.out, "--out")
    inputs = [("--result", r, "a kvlab eval or tasks result JSON") for r in args.result or ()]
    inputs += [(f, p, "a JSON file") for f, p in (("--sweep", args.sweep), ("--plan", args.plan)) if p]
    for flag, path, what in inputs:  # /dev/null was "no result file at /dev/null"
        problem = problem or (special_input_problem(path, what) and f"{flag} {special_input_problem(path, what)}")
    if problem:
        return fail(args, problem)
    try:
        # validated, each by its own schema; "" is refused by read_result, not taken for "no result"
        result, tasks = read_results(args.result, flag="--result")
        sensitivity = _sensitivity_data(args.sweep, args.plan)
    except (ValueError, OSError) as exc:
        return fail(args, exc)
    if tasks is not None:
        from kvlab.task_figures import skip_reason

        if skip_reason(tasks):  # the other figures are still drawn
            print(f"kvlab figures: {TASKS_FIGURE} skipped: {skip_reason(tasks)}", file=sys.stderr)
            tasks = None
    if result is not None and not result.get("rows"):  # the other figures are still drawn
        why = "dry run" if result.get("status") == "dry_run" else f"status {result.get('status')}"
        print(
            f"kvlab figures: the eval result has no measured rows ({why}), so no eval figures",
            file=sys.stderr,
        )
    append = not args.no_append
    names = figure_files(result=result, append=append) + ([TASKS_FIGURE] if tasks else [])
    names += [SENSITIVITY_FIGURE] if sensitivity else []
    existing = [Path(args.out) / f for f in names]
    existing = [p for p in existing if p.exists()]
    if existing and not args.force:  # checked before any work: nothing is overwritten silently
        more = f" ({len(existing) - 1} more figure files exist there too)" if len(existing) > 1 else ""
        return fail(args, file_exists_message(existing[0], f"another --out{more}"), EXIT_FILE_EXISTS)
    total = figure_steps(result=result, append=append) + bool(tasks) + bool(sensitivity)
    folder = None  # the staging folder, made before any work: a folder that takes no files fails now
    try:  # all or nothing: an interrupt or an error leaves --out as it was (kvlab.runtime.atomic.staged_folder)
        with staged_folder(args.out) as folder:
            drawn = _draw(args, folder, result, tasks, sensitivity, total)
    except OSError as exc:
        return _write_failed(args, exc, folder)
    paths = {key: Path(args.out) / path.name for key, path in drawn.items()}
    err = Console(stderr=True)
    for warning in _probe_warnings(Path(args.out) / "figures.json"):  # its panel title says so too
        err.print(f"[yellow]warning: roofline probe: {warning}[/]")
    if args.json:
        print(json.dumps({name: str(path) for name, path in paths.items()}, indent=1))
        return 0
    t = table(f"Figures written to {args.out}", labels=("figure", "file"))
    for name, path in paths.items():
        t.add_row(name, str(path))
    Console().print(t)
    return 0


def _draw(args: argparse.Namespace, folder: Path, result, tasks, sensitivity, total: int) -> dict[str, Path]:
    """Draw every figure of this run into ``folder`` (the staging folder of ``--out``) under a progress bar;
    returns ``{name: path}`` (:func:`kvlab.figures.write_figures`, plus the tasks and sensitivity figures)."""
    from rich.console import Console

    from kvlab.figures import write_figures

    with progress(Console(stderr=True), total, "kvlab figures") as bar:
        paths = write_figures(
            folder, result=result, run_probe=not args.no_probe, append=not args.no_append, progress=bar.start
        )
        if tasks:
            from kvlab.task_figures import plot_task_scores

            bar.start("tasks result: score vs × dyn")
            paths["tasks_scores"] = plot_task_scores(tasks, folder / TASKS_FIGURE)
        if sensitivity:
            from kvlab.sensitivity_figure import plot_sensitivity

            bar.start("sensitivity sweep: per-layer KL and the plan")
            paths["sensitivity"] = plot_sensitivity(sensitivity, folder / SENSITIVITY_FIGURE)
    return paths


def _write_failed(args: argparse.Namespace, exc: OSError, folder: Path | None) -> int:
    """The error of a run whose files could not be written (exit 2): ``--out`` could not take the staging folder
    (``folder`` None: no permission, a folder such as /proc that takes no files), or a figure could not be
    written or moved in (a full disk), named as the file of ``--out`` it would have been. Nothing was written.

    Raises:
        OSError: ``exc`` itself where it names no file of this run (not a writing problem of ``--out``).
    """
    if folder is None:
        return fail(args, f"--out {args.out}: cannot create the folder ({exc.strerror or exc})")
    if exc.filename is None or Path(exc.filename).parent not in (folder, Path(args.out)):
        raise exc
    name = Path(args.out) / Path(exc.filename).name
    return fail(args, f"--out {args.out}: cannot write {name} ({exc.strerror or exc}); nothing was written")


def _probe_warnings(numbers: Path) -> list[str]:
    """The roofline probe's busy-machine warnings (:func:`kvlab.plan.probe.probe`) in the ``figures.json`` just
    written (``[]`` with ``--no-probe``, on a quiet machine, or where no roofline was drawn: a run of only a tasks
    result or a sensitivity sweep writes no ``figures.json``)."""
    if not numbers.is_file():
        return []
    panels = (json.loads(numbers.read_text(encoding="utf-8")).get("roofline") or {}).get("panels", [])
    return [w for panel in panels for w in (panel.get("probe") or {}).get("warnings", ())]


def _sensitivity_data(sweep: str | None, plan: str | None) -> dict | None:
    """:func:`kvlab.sensitivity_figure.sensitivity_figure_data` of the ``--sweep`` file (and ``--plan``), or None
    without ``--sweep``.

    Raises:
        ValueError: ``--plan`` without ``--sweep``, a file that cannot be read or is not JSON, or what
            :func:`~kvlab.sensitivity_figure.sensitivity_figure_data` refuses, each naming the flag and file.
    """
    if sweep is None:
        if plan is not None:
            raise ValueError(f"--plan {plan} draws a plan under a sweep's curves; pass --sweep FILE too")
        return None
    from kvlab.plan.mixed import read_plan
    from kvlab.sensitivity_figure import sensitivity_figure_data

    try:
        data = json.loads(Path(sweep).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"--sweep {sweep}: cannot be read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:  # a binary file is not JSON either
        raise ValueError(f"--sweep {sweep}: not JSON ({exc})") from None
    try:
        return sensitivity_figure_data(data, None if plan is None else read_plan(plan))
    except ValueError as exc:
        raise ValueError(f"--sweep {sweep}" + (f" --plan {plan}" if plan else "") + f": {exc}") from None
