"""CLI subcommands: one module per command family.

Each module defines ``register(subparsers) -> None``, which adds its parser(s) and sets
``func=<callable(args) -> int>`` as the parser default. ``kvlab.cli`` discovers modules here, so adding a
command never edits a shared file.

Every command reports a problem the same way: one line ``kvlab <command>: error: <message>`` on stderr (the
format argparse uses for a bad flag) and one exit status from this table:

====  =======================================================================================================
code  meaning
====  =======================================================================================================
0     done; every check the command makes passed
1     the command ran and something failed: a check or target not met, a model that could not be loaded (the
      result file records it), stdout closed early by the reader
2     bad input, nothing done: a flag value or setting refused, an input file missing or invalid, or an output
      file that exists (results are never overwritten without ``--force``)
130   interrupted (Ctrl-C) (128 + SIGINT, as a shell reports it); ``kvlab eval`` and ``kvlab tasks`` first
      record the interrupt and what they measured in their result file
143   ended by SIGTERM (128 + 15), for a command that records it first (``kvlab eval``, ``kvlab tasks``)
====  =======================================================================================================
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from kvlab.runtime.atomic import output_problem
from kvlab.runtime.checks import check_int
from kvlab.runtime.device import resolve_device  # torch-free until called: building the parser imports none

EXIT_OK = 0  # done, every check passed
EXIT_FAILED = 1  # ran, and a check, target or load failed
EXIT_USAGE = 2  # bad input (flags, settings, input files) or an output file that exists; nothing done
EXIT_FILE_EXISTS = EXIT_USAGE  # an output file exists and --force was not given: a bad input like any other
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, the status a shell gives a process SIGINT ended
EXIT_TERMINATED = 143  # SIGTERM (128 + 15), for a command that records the signal before it exits


def fail(args: argparse.Namespace | None, message: object, code: int = EXIT_USAGE) -> int:
    """Print ``<prog>: error: <message>`` on stderr and return ``code`` for the command to return.

    ``prog`` is the full command (``kvlab paging static``), set on every parser by :func:`kvlab.cli.build_parser`.
    A :class:`kvlab.models.ModelLoadError` (a damaged model folder) is said as ``--model <folder>: <reason>``.
    """
    prog = getattr(args, "kvlab_prog", None) or "kvlab"
    models = sys.modules.get("kvlab.models")  # not imported: no model was loaded, so this is no load error
    if models is not None and isinstance(message, models.ModelLoadError):  # the one wording, naming the flag
        message = f"--model {message.model}: {message.reason}"
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def file_exists_message(path: object, alternative: str = "") -> str:
    """The one wording of "an output file exists": ``<path> already exists; pass --force to replace it``."""
    more = f" or {alternative}" if alternative else ""
    return f"{path} already exists; pass --force to replace it{more}"


def force_without_output(args: argparse.Namespace, *flags: str) -> str | None:
    """The one wording of ``--force`` given when none of the output ``flags`` (``--html``) names a file, so nothing
    is written that it could replace: ``--force has no effect without --html: no file is written for it to replace``;
    None when one does or --force is not given."""
    if not getattr(args, "force", False):
        return None
    if any(getattr(args, f.lstrip("-").replace("-", "_"), None) not in (None, "-") for f in flags):
        return None
    return f"--force has no effect without {' or '.join(flags)}: no file is written for it to replace"


def empty_path_flag(args: argparse.Namespace, *flags: str, kind: str = "file") -> str | None:
    """The one wording of a path flag given empty: the first of ``flags`` (``--out``) whose value is ``''`` or blank,
    as ``--out must name a file, got ''`` (``kind``: ``"folder"`` for ``--results-dir``), else None. An empty path
    would silently mean "not given" (``if args.out:``) or the current folder (``Path('')`` is ``.``)."""
    for flag in flags:
        value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if value is not None and not str(value).strip():
            return f"{flag} must name a {kind}, got {value!r}"
    return None


def suffix_problem(flag: str, path: str | os.PathLike, suffixes: tuple[str, ...], what: str) -> str | None:
    """The one wording of an output file named with a suffix other than the format its writer writes, found before
    any work: ``--html r.txt must end in .html or .htm (the report is an HTML page), got .txt`` (``kvlab report
    --html r.txt`` wrote HTML into a .txt file; a JSON result named ``x.txt`` is missed by whatever looks for
    ``*.json``); None when the suffix, in any case, is one of ``suffixes``. ``what`` says why, in parentheses.
    Every writer of one format calls it: ``report --html``, the JSON results and records (``tasks --out``,
    ``sensitivity sweep --out``, ``bench --out``, ``inspect --json``), ``bench docs --out`` (Markdown) and the
    figures (``paging figure --out``, ``inspect --figure``, ``tasks --figure``). A file whose format is free
    (``paging simulate --save-trace``: a CSV under any name) is not checked."""
    suffix = Path(path).suffix
    if suffix.lower() in suffixes:
        return None
    expected = suffixes[0] if len(suffixes) == 1 else f"{', '.join(suffixes[:-1])} or {suffixes[-1]}"
    return f"{flag} {path} must end in {expected} ({what}), got {suffix or 'no suffix'}"


def device_problem(device: str | None) -> str | None:
    """The one wording of a ``--device`` this machine cannot run, found before any work: the message of
    :func:`kvlab.runtime.device.resolve_device` with the flag beside the setting, as ``kvlab bench`` names every
    setting ("`device` (--device) is 'cuda' but CUDA is not available", "`device` (--device) must be cpu, cuda,
    cuda:N or auto, got 'mps'"); None when it can run. ``kvlab eval``, ``tasks`` and ``inspect`` call it."""
    try:
        resolve_device(device)
    except ValueError as exc:
        return str(exc).replace("`device`", "`device` (--device)", 1)
    return None


def dtype_problem(dtype: object) -> str | None:
    """The one wording of a ``--dtype`` kvlab runs no model in, found before any work (a model load, a prefill):
    what the flag accepts, the short spellings too (:func:`kvlab.runtime.dtype_names.accepted_dtypes_text`), and the
    value ("--dtype must be one of ['bfloat16', 'float16', 'float32'] (or bf16, fp16, fp32; any case), got 'int8'");
    None when :func:`kvlab.runtime.dtypes.parse_dtype` takes it. Every command with a model ``--dtype`` calls it:
    ``kvlab eval``, ``tasks``, ``inspect``, ``bench``, ``lab`` (``--real``, ``eviction``) and ``sensitivity sweep``,
    which had three wordings of it."""
    from kvlab.runtime.dtype_names import accepted_dtypes_text
    from kvlab.runtime.dtypes import parse_dtype

    try:
        parse_dtype(dtype)
    except ValueError:
        return f"--dtype must be one of {accepted_dtypes_text()}, got {dtype!r}"
    return None


def read_dtype_aliases(parser) -> None:
    """Make every model ``--dtype`` of ``parser`` and its subcommands, at any depth, read ``bf16``/``fp16``/``fp32``
    as ``bfloat16``/``float16``/``float32`` (:func:`kvlab.runtime.dtype_names.canonical_dtype`): ``kvlab plan``
    takes the short spellings, and ``kvlab eval --dtype bf16`` was refused. The command then sees, checks
    (:func:`dtype_problem`) and records the full name; any other value reaches :func:`dtype_problem` unchanged.
    One walk over the parser (``kvlab.cli.build_parser`` calls it), so a new command's ``--dtype`` reads them too."""
    import argparse

    from kvlab.runtime.dtype_names import DTYPE_ALIASES, canonical_dtype

    for action in parser._actions:
        if "--dtype" in action.option_strings and action.type is None:
            action.type = canonical_dtype
            shorts = ", ".join(f"{a} = {full}" for a, full in DTYPE_ALIASES.items())
            action.help = f"{action.help}; also {shorts}; any case" if action.help else None
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                read_dtype_aliases(sub)


def output_folder_problem(folder: str | os.PathLike, flag: str) -> str | None:
    """Why the output folder ``flag`` names (``--out-dir``, ``--results-dir``, ``kvlab figures --out``) cannot take
    the files, found before any work; None when it can. The one rule for output folders: the folder itself may be
    new (the command creates it, one level), but its parent folder must exist, so a typo'd path
    (``/tmp/reslts/run1``) is refused as ``--out-dir /tmp/reslts/run1: folder /tmp/reslts does not exist`` rather
    than made. kvlab's own default folders (``results``, ``kvlab-results``, ``figures``) lie in the current folder,
    so a first run creates them. Also refused: a file where the folder should be, a parent that is not writable or
    takes no files (:func:`kvlab.runtime.atomic.output_problem`). An existing folder passes; the files written into
    it are checked by their writer."""
    path = Path(folder)
    if path.is_dir():
        return None
    if path.exists():
        return f"{flag} {path} is a file; pass a folder"
    return output_problem(path, flag, folder_must_exist=True)  # the folder to create, as a new entry of its parent


def flag_values(args: argparse.Namespace, *dests: str) -> dict:
    """``{dest: args.<dest>}`` for each argparse ``dest``: the flags that reach a library function as keyword
    arguments of their own name (``--outlier-factor`` -> ``outlier_factor=``)."""
    return {dest: getattr(args, dest) for dest in dests}


def table(title: object, *numbers: str, labels: tuple[str, ...] = (), **kwargs: object):
    """A rich ``Table`` titled ``title``: the ``labels`` columns first (text, left-aligned), then the ``numbers``
    columns right-aligned, as every kvlab table lines up its figures; ``kwargs`` go to ``rich.table.Table``
    (``caption=`` ...). The table is at least as wide as its title (up to the console's width), so the title
    does not wrap inside a narrower table. More columns may be added to the table returned."""
    from rich.table import Table

    if isinstance(title, str) and "min_width" not in kwargs:  # a title wider than the cells wrapped mid-phrase
        kwargs["min_width"] = max(len(line) for line in title.split("\n"))  # rich caps it at the console's width
    t = Table(title=title, **kwargs)
    for col in labels:
        t.add_column(col)
    for col in numbers:
        t.add_column(col, justify="right")
    return t


def add_command_group(
    subparsers, name: str, help: str, dest: str, metavar: str, description: str | None = None
):
    """Add command ``name`` whose work is done by its subcommands (``kvlab bench decode``) and return the action to
    add them to (``dest`` gets the subcommand's name, ``metavar`` lists them in the usage line). Given no
    subcommand, ``name`` prints its help and then the one error line naming its subcommands on stderr, and exits
    :data:`EXIT_USAGE`, as argparse does for a missing argument (usage first, the error line last)."""
    p = subparsers.add_parser(name, help=help, description=description)
    sub = p.add_subparsers(dest=dest, metavar=metavar)
    p.set_defaults(func=lambda args: missing_subcommand(p, sub, args))
    return sub


def missing_subcommand(parser: argparse.ArgumentParser, sub, args: argparse.Namespace | None) -> int:
    """``parser``'s help, then ``<prog>: error: choose a subcommand: a, b, ...`` (``sub``'s choices), on stderr;
    returns :data:`EXIT_USAGE`."""
    parser.print_help(sys.stderr)
    return fail(args, f"choose a subcommand: {', '.join(sub.choices)}")


class progress:
    """Progress of a run longer than a couple of seconds, on ``console`` (a rich Console, normally stderr): a rich
    progress bar on a terminal; otherwise (logs, CI, pipes) one plain line as each step starts, so the last line
    always names what is running: ``[k/total] <elapsed> s  <step>`` (step k, started at that many seconds).

    Two ways to drive it, inside ``with progress(console, total, title) as p:``

    * ``p.describe(msg)`` names the step now running and ``p.advance()`` marks it finished (``kvlab eval``);
    * ``p.start(msg)`` finishes the step running (if any) and starts the next; leaving the ``with`` block without
      an error finishes the last one. This is the callback handed to library code that reports the step it
      starts (``kvlab lab``, ``kvlab figures``, ``kvlab paging simulate``).

    One implementation for every command.

    Raises:
        ValueError: ``total`` < 0.
    """

    def __init__(self, console, total: int, title: str = "kvlab"):
        check_int("total", total, 0)
        self.console, self.total, self.title = console, total, title
        self.done, self.last, self.open, self.bar, self.task = 0, "", False, None, None

    def __enter__(self) -> progress:
        self.start_s = time.perf_counter()
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
            )
            self.bar.__enter__()
            self.task = self.bar.add_task(self.title, total=self.total)
        return self

    def describe(self, msg: str) -> None:
        """Name the step now running."""
        self.last = msg
        if self.bar is not None:
            self.bar.update(self.task, description=msg)
        else:
            elapsed = time.perf_counter() - self.start_s
            step = min(self.done + 1, self.total)
            self.console.print(f"[{step}/{self.total}] {elapsed:6.0f} s  {msg}", highlight=False)

    def advance(self) -> None:
        """Mark the step named last as finished."""
        self.done += 1
        self.open = False
        if self.bar is not None:
            self.bar.advance(self.task)

    def start(self, msg: str) -> None:
        """Finish the running step (if any) and start ``msg``."""
        if self.open:
            self.advance()
        self.describe(msg)
        self.open = True

    def __exit__(self, exc_type, *exc):
        if self.open and exc_type is None:
            self.advance()
        if self.bar is not None:
            self.bar.__exit__(exc_type, *exc)
        return False


# kineto's (the torch profiler's) lowest level shown: its levels run VERBOSE 0 .. ERROR 4, USDT 5, so 6 shows none
# (at its default it prints "USDT: ... profiler_start" / "profiler_stop" on stderr around every profile)
KINETO_QUIET = "6"

# third-party modules whose warnings (deprecations, advice) are not kvlab's output unless --verbose
# (by the module a warning is attributed to: matplotlib's own warnings name the kvlab line that called it, so figure
# code avoids them at the cause, e.g. kvlab.figures.base.legend)
THIRD_PARTY_WARNINGS = r"(transformers|torch|huggingface_hub|accelerate|hqq|optimum|matplotlib|numpy)(\.|$)"


class Terminated(BaseException):  # not an Exception: a step that catches Exception must not swallow it
    """SIGTERM inside :func:`sigterm_raises`: a command records it as it records an interrupt."""


def configured_limit(model: str | None) -> int | None:
    """The ``max_position_embeddings`` of ``model`` (a ``--model`` value; None: the bundled model) read from its
    files without loading it (:func:`kvlab.lab.longrun.configured_max_positions`), for a refusal of sizes past it
    before any work (``--dry-run`` included; ``kvlab eval``, ``kvlab tasks``); None when no file states one (a hub
    id not cached here: checked again once it is loaded) or the model cannot be read (the load reports it)."""
    from kvlab.lab.longrun import configured_max_positions

    try:
        return configured_max_positions(model)
    except (OSError, ValueError):
        return None


def stop_exit_code(exc: BaseException) -> int:
    """The shell's status of a run stopped by ``exc``: :data:`EXIT_INTERRUPTED` (130) for Ctrl-C
    (``KeyboardInterrupt``), :data:`EXIT_TERMINATED` (143) for SIGTERM (:class:`Terminated`)."""
    return EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else EXIT_TERMINATED


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` ("terminated by signal 15") where the program is,
    so a long command can record what it measured before it exits :data:`EXIT_TERMINATED`; the previous handler
    is restored after. Call it from the main thread (:func:`signal.signal`'s rule)."""
    import signal

    def handler(signum, frame):
        raise Terminated(f"terminated by signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def quiet_third_party(verbose: bool = False) -> Iterator[None]:
    """Keep other libraries' progress bars, logging and warnings out of kvlab's output inside the ``with`` block
    (``kvlab --verbose`` keeps them): Hugging Face hub / transformers progress bars (e.g. "Loading weights") and
    info logging off, the torch profiler's native log lines off (kineto writes ``USDT: ... profiler_start`` /
    ``profiler_stop`` to stderr around every ``torch.profiler.profile``, e.g. ``kvlab bench decode
    --profile-context``; :data:`KINETO_QUIET` also hides its error lines, whose failures still raise), and Python
    warnings raised inside :data:`THIRD_PARTY_WARNINGS` modules ignored. kvlab's own messages are unaffected.
    Settings the user made in the environment (``HF_HUB_DISABLE_PROGRESS_BARS``, ``TRANSFORMERS_VERBOSITY``,
    ``KINETO_LOG_LEVEL``) win. Everything is restored on exit (``kvlab.cli.main`` called in-process leaves no
    trace; kineto reads its level when a process first profiles and keeps it).
    """
    if verbose:
        yield
        return
    import warnings

    keys = (
        "HF_HUB_DISABLE_PROGRESS_BARS",
        "TRANSFORMERS_VERBOSITY",
        "TRANSFORMERS_NO_ADVISORY_WARNINGS",
        "KINETO_LOG_LEVEL",
    )
    saved_env = {k: os.environ.get(k) for k in keys}
    user_bars, user_level = saved_env[keys[0]] is not None, saved_env[keys[1]] is not None
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)
    restore = []
    if "transformers" in sys.modules:  # already imported: its environment was read, so set it directly
        from transformers.utils import logging as hf_logging

        if not user_level:
            level = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()
            restore.append(lambda: hf_logging.set_verbosity(level))
        if not user_bars and hf_logging.is_progress_bar_enabled():
            hf_logging.disable_progress_bar()
            restore.append(hf_logging.enable_progress_bar)
    if "huggingface_hub" in sys.modules and not user_bars:
        from huggingface_hub.utils import (
            are_progress_bars_disabled,
            disable_progress_bars,
            enable_progress_bars,
        )

        if not are_progress_bars_disabled():
            disable_progress_bars()
            restore.append(enable_progress_bars)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=THIRD_PARTY_WARNINGS)
            yield
    finally:
        for undo in reversed(restore):
            undo()
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
