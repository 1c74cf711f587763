"""``kvlab report RESULT.json``: the summary of an eval result, from the file alone."""

from __future__ import annotations

import argparse
import json

from kvlab.commands import EXIT_FILE_EXISTS, fail, file_exists_message


def register(sub) -> None:
    p = sub.add_parser("report", help="print (or render to HTML) the summary of a kvlab eval result file")
    p.add_argument("result", help="path to a results/<label>.json written by kvlab eval")
    p.add_argument("--json", action="store_true", help="print the validated result JSON")
    p.add_argument("--html", metavar="OUT.html", default=None, help="write a self-contained HTML report")
    p.add_argument("--force", action="store_true", help="overwrite an existing --html file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from kvlab.eval.io import read_result

    err = Console(stderr=True)
    if args.html is not None and not args.html.strip():  # '' is not "no --html"
        return fail(args, f"--html must name a file, got {args.html!r}")
    try:
        result = read_result(args.result)
    except (FileNotFoundError, ValueError) as exc:
        return fail(args, exc)
    if args.html:
        out = Path(args.html)
        if out.is_dir():
            return fail(args, f"{out} is a directory; --html needs a file name")
        if out.exists() and out.resolve() == Path(args.result).resolve():
            return fail(
                args, f"--html {out} is the result file itself; the report would replace its own input"
            )
        if out.exists() and not args.force:
            return fail(args, file_exists_message(out), EXIT_FILE_EXISTS)
        from kvlab.report_html import write_html_report

        try:
            write_html_report(result, out, overwrite=args.force)
        except OSError as exc:
            return fail(args, f"could not write {out}: {exc}")
        err.print(f"HTML report written to {out}")
    if args.json:
        print(json.dumps(result, indent=1))
    elif not args.html:
        from kvlab.eval.render import print_summary

        print_summary(result)
    return 0
