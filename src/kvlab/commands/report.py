"""``kvlab report RESULT.json [TASKS.json]``: the summary of an eval result and/or a tasks result, from the files
alone (text, JSON or one HTML page)."""

from __future__ import annotations

import argparse
import json

from kvlab.commands import (
    EXIT_FILE_EXISTS,
    empty_path_flag,
    fail,
    file_exists_message,
    force_without_output,
    suffix_problem,
)


def register(sub) -> None:
    """Add ``kvlab report RESULT...`` (``--json``, ``--html``; run by :func:`run`) to ``sub``."""
    p = sub.add_parser(
        "report",
        help="print (or render to HTML) the summary of a kvlab eval result and/or a kvlab tasks result",
    )
    p.add_argument(
        "result",
        nargs="+",
        help="a results/<label>.json written by kvlab eval, a result of kvlab tasks, or one of each",
    )
    p.add_argument("--json", action="store_true", help="print the validated result JSON")
    p.add_argument("--html", metavar="OUT.html", default=None, help="write a self-contained HTML report")
    p.add_argument("--force", action="store_true", help="overwrite an existing --html file")
    p.set_defaults(func=run)


def _html(args: argparse.Namespace, result: dict | None, tasks: dict | None, err) -> int | None:
    """Write the page; an exit code when refused, None when written."""
    from pathlib import Path

    from kvlab.runtime.atomic import output_problem

    out = Path(args.html)
    if out.is_dir():
        return fail(args, f"{out} is a directory; --html needs a file name")
    problem = output_problem(out, "--html", folder_must_exist=True)  # as tasks, paging and inspect: no new folders
    if problem:
        return fail(args, problem)
    if out.exists() and any(out.resolve() == Path(r).resolve() for r in args.result):
        return fail(args, f"--html {out} is the result file itself; the report would replace its own input")
    if out.exists() and not args.force:
        return fail(args, file_exists_message(out), EXIT_FILE_EXISTS)
    problem = suffix_problem("--html", out, (".html", ".htm"), "the report is an HTML page")
    if problem:
        return fail(args, problem)
    try:
        if tasks is None:
            from kvlab.report_html import write_html_report

            write_html_report(result, out, overwrite=args.force)
        else:
            from kvlab.report_tasks import write_report

            write_report(out, result, tasks, overwrite=args.force)
    except OSError as exc:
        return fail(args, f"could not write {out}: {exc}")
    if tasks is not None:
        from kvlab.task_figures import skip_reason

        if skip_reason(tasks):  # the page has the rest; say why its figure is missing
            err.print(f"tasks figure skipped: {skip_reason(tasks)}", highlight=False)
    err.print(f"HTML report written to {out}")
    return None


def run(args: argparse.Namespace) -> int:
    """``kvlab report``: print the summary of an eval result and/or a tasks result, their JSON, or an HTML report.
    Exit 2 for more than two files, a missing or invalid result file, or a bad or existing ``--html`` file."""
    from rich.console import Console

    from kvlab.eval.io import read_results

    err = Console(stderr=True)
    problem = empty_path_flag(args, "--html") or force_without_output(args, "--html")  # '' is not "no --html"
    if problem:
        return fail(args, problem)
    if len(args.result) > 2:
        return fail(
            args, f"give one or two result files (an eval and a tasks result), got {len(args.result)}"
        )
    try:
        result, tasks = read_results(args.result, flag=None)  # RESULT is positional: the files are named
    except (FileNotFoundError, ValueError) as exc:
        return fail(args, exc)
    if args.html:
        code = _html(args, result, tasks, err)
        if code is not None:
            return code
    if args.json:
        both = {"eval": result, "tasks": tasks}
        print(json.dumps(both if result and tasks else result or tasks, indent=1))
    elif not args.html:
        if result is not None:
            from kvlab.eval.render import print_summary

            print_summary(result)
        if tasks is not None:
            from kvlab.eval.tasks_render import print_tasks_table

            print_tasks_table(tasks)
    return 0
