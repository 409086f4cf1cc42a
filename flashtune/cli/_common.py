"""What the commands share: error handling, options, opening the store, output formats.

Nothing here imports torch, triton, sqlalchemy or optuna at module level: ``flashtune
--help`` must stay instant. Those load inside the commands that need them.
"""

from __future__ import annotations

import functools

import contextlib
import csv
import io
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click

from flashtune.keys import DTYPES, PASSES
from flashtune.protocol import (DEMO_DTYPES, DEMO_HEAD_DIMS, DEMO_SEQ_LENS, GRID_DTYPES, GRID_HEAD_DIMS,
                                GRID_SEQ_LENS)

DB_HELP = ("The store: a SQLite file path or a SQLAlchemy URL (sqlite:///PATH, postgresql+psycopg://...). "
           "Default: $FLASHTUNE_DB, else tuned.db in the user data directory.")


# -- errors ---------------------------------------------------------------------------------

def _user_error_types() -> tuple[type[BaseException], ...]:
    """The exceptions that mean "the user asked for something that cannot be done"."""
    types: list[type[BaseException]] = [ValueError, OSError]
    store = sys.modules.get("flashtune.store.errors")  # loaded once a command touched the store
    if store is not None:
        types.append(store.StoreError)
    return tuple(types)


def one_line(error: BaseException) -> str:
    text = str(error).strip()
    if isinstance(error, OSError) and error.strerror:
        text = f"{error.strerror}: {error.filename}" if error.filename else error.strerror
    return text.splitlines()[0] if text else type(error).__name__


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn an API's ValueError / StoreError / OSError into a one-line ``ClickException``."""
    try:
        yield
    except click.ClickException:
        raise
    except _user_error_types() as e:
        raise click.ClickException(one_line(e)) from e


# Ctrl-C: the shell's convention (128 + SIGINT), so scripts can tell it from a failure.
INTERRUPTED_EXIT = 130


def interrupted(message: str = "interrupted") -> click.exceptions.Exit:
    """Say why on stderr; the exception to raise ends the command with exit code 130."""
    click.echo(message, err=True)
    return click.exceptions.Exit(INTERRUPTED_EXIT)


class Command(click.Command):
    """A command whose user mistakes end in a one-line error (exit 1), never a traceback;
    Ctrl-C ends it with exit code 130."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with user_errors():
                return super().invoke(ctx)
        except KeyboardInterrupt:
            raise interrupted() from None


class Group(click.Group):
    """The command group: with ``--json`` among the arguments, an error ends in a JSON object on
    standard output (``{"error": {"message", "kind", "exit_code"}}``, ``kind`` one of "usage",
    "error", "aborted") with the exit code it would have had, so a script reading the JSON reads
    failures too."""

    command_class = Command
    group_class = type  # subgroups are Groups too

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        args = list(sys.argv[1:] if args is None else args)
        if not standalone_mode or not wants_json(args):
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as e:
            kind = "usage" if isinstance(e, click.UsageError) else "error"
            _echo_json_error(e.format_message(), kind, e.exit_code)
            sys.exit(e.exit_code)
        except click.Abort:
            _echo_json_error("aborted", "aborted", 1)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def wants_json(args: Sequence[str]) -> bool:
    """Whether the command line asks for JSON output (``--json`` before any ``--``)."""
    args = list(args)
    return "--json" in (args[:args.index("--")] if "--" in args else args)


def _echo_json_error(message: str, kind: str, exit_code: int) -> None:
    click.echo(json.dumps({"error": {"message": message, "kind": kind, "exit_code": exit_code}}, indent=2))


# -- options --------------------------------------------------------------------------------

db_option = click.option("--db", metavar="PATH|URL", help=DB_HELP)


FILTER_OPTIONS = {"gpu": "--gpu", "dtype": "--dtype", "head_dim": "--head-dim", "seq_q": "--seq-len",
                  "seq_k": "--seq-k", "group": "--group", "batch_heads": "--batch-heads", "causal": "--causal/--full",
                  "pass_": "--pass"}


def filter_options(f):
    """--gpu --dtype --head-dim --seq-len --seq-k --group --batch-heads --causal/--full --pass:
    each narrows the selection; the command gets them as one ``where`` (a ResultFilter)."""
    options = [
        click.option("--gpu", metavar="KEY", help="GPU key, e.g. 'NVIDIA H200@sm90' (`flashtune info` shows this "
                     "GPU's)."),
        click.option("--dtype", metavar="DTYPE", callback=dtype_callback,
                     help=f"Only this dtype ({DTYPE_HELP})."),
        click.option("--head-dim", type=click.IntRange(min=1), help="Only this head dim."),
        click.option("--seq-len", "seq_q", type=click.IntRange(min=1), help="Only this query length."),
        click.option("--seq-k", type=click.IntRange(min=1), help="Only this key length."),
        click.option("--group", type=click.IntRange(min=1), help="Only this grouped-query ratio (query heads per "
                     "key/value head)."),
        click.option("--batch-heads", type=click.IntRange(min=1), help="Only this batch x query heads bucket (a "
                     "power of two)."),
        click.option("--causal/--full", "causal", default=None, help="Only causal, or only full (non-causal) "
                     "attention."),
        click.option("--pass", "pass_", type=click.Choice(PASSES), help="Only the forward or the backward pass."),
    ]

    @functools.wraps(f)
    def command(**kwargs):
        from flashtune.store import ResultFilter

        return f(where=ResultFilter(**{name: kwargs.pop(name) for name in FILTER_OPTIONS}), **kwargs)

    for option in reversed(options):
        command = option(command)
    return command


def matches(where, key) -> bool:
    """Whether a key passes the filters (the store applies them to its rows; other rows here)."""
    return all(getattr(where, name) is None or getattr(where, name) == getattr(key, name) for name in FILTER_OPTIONS)


def _split(values: Sequence[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def ints_callback(ctx, param, values):
    """``--seq-len 512,1024 --seq-len 2048`` -> [512, 1024, 2048]."""
    out = []
    for part in _split(values):
        try:
            number = int(part)
        except ValueError:
            raise click.BadParameter(f"{part!r} is not an integer") from None
        if number < 1:
            raise click.BadParameter(f"{number} is not a positive integer")
        out.append(number)
    return list(dict.fromkeys(out))


# What --dtype takes: torch's names and their usual short forms.
DTYPE_ALIASES = {"float16": "float16", "fp16": "float16", "half": "float16",
                 "bfloat16": "bfloat16", "bf16": "bfloat16",
                 "float32": "float32", "fp32": "float32"}
DTYPE_HELP = "float16 (fp16, half), bfloat16 (bf16), float32 (fp32)"
assert set(DTYPE_ALIASES.values()) == set(DTYPES)


def dtype_of(text: str) -> str:
    """The dtype a --dtype value names (an alias such as fp16 included); BadParameter otherwise."""
    found = DTYPE_ALIASES.get(text.strip().lower())
    if found is None:
        raise click.BadParameter(f"{text!r} is not a dtype: expected one of {DTYPE_HELP}")
    return found


def dtype_callback(ctx, param, value):
    return None if value is None else dtype_of(value)


def dtypes_callback(ctx, param, values):
    """``--dtype fp16,bf16 --dtype float32`` -> ["float16", "bfloat16", "float32"]."""
    return list(dict.fromkeys(dtype_of(part) for part in _split(values)))


def choices_callback(choices: Sequence[str]):
    def callback(ctx, param, values):
        out = _split(values)
        for part in out:
            if part not in choices:
                raise click.BadParameter(f"{part!r} is not one of {', '.join(choices)}")
        return list(dict.fromkeys(out))
    return callback


def key_grid_options(f):
    """--head-dim/--dtype/--seq-len/--causal/--full/--pass, several values each (a grid of keys)."""
    options = [
        click.option("--head-dim", "head_dims", multiple=True, callback=ints_callback, metavar="D[,D...]",
                     help=f"Head dims. [default: {','.join(map(str, GRID_HEAD_DIMS))}; interpreter: "
                     f"{','.join(map(str, DEMO_HEAD_DIMS))}]"),
        click.option("--dtype", "dtypes", multiple=True, callback=dtypes_callback, metavar="DTYPE[,...]",
                     help=f"Dtypes ({DTYPE_HELP}). [default: {','.join(GRID_DTYPES)}; interpreter: "
                     f"{','.join(DEMO_DTYPES)}]"),
        click.option("--seq-len", "seq_lens", multiple=True, callback=ints_callback, metavar="N[,N...]",
                     help=f"Sequence lengths. [default: {','.join(map(str, GRID_SEQ_LENS))}; interpreter: "
                     f"{','.join(map(str, DEMO_SEQ_LENS))}]"),
        click.option("--causal/--full", "causal", default=None,
                     help="Only causal or only full attention. [default: both]"),
        click.option("--pass", "passes", multiple=True, callback=choices_callback(PASSES), metavar="PASS[,PASS]",
                     help="fwd, bwd or both. [default: both]"),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def grid(head_dims, dtypes, seq_lens, causal, passes, *, interpreter: bool) -> dict[str, list]:
    """The values of each key field: the given ones, else the defaults for the mode."""
    return {
        "head_dims": head_dims or list(DEMO_HEAD_DIMS if interpreter else GRID_HEAD_DIMS),
        "dtypes": dtypes or list(DEMO_DTYPES if interpreter else GRID_DTYPES),
        "seq_lens": seq_lens or list(DEMO_SEQ_LENS if interpreter else GRID_SEQ_LENS),
        "causal": [False, True] if causal is None else [causal],
        "passes": passes or list(PASSES),
    }


CSV_HELP = "Output CSV (booleans as true/false as in the JSON, empty cells for none, configs as JSON)."


def output_options(f):
    f = click.option("--csv", "as_csv", is_flag=True, help=CSV_HELP)(f)
    return click.option("--json", "as_json", is_flag=True, help="Output JSON.")(f)


# -- devices --------------------------------------------------------------------------------

_NEEDS_GPU = {"search": "tunes and times GPU kernels", "bench": "times GPU kernels",
              "revalidate": "checks and times GPU kernels"}


def interpreter_options(f):
    f = click.option("--device", metavar="DEVICE", help="The CUDA device, e.g. cuda:1, or cpu for the interpreter "
                     "demo. [default: cuda]")(f)
    return click.option("--interpreter", is_flag=True, help="Run a tiny demo under the Triton interpreter on the "
                        "CPU (no GPU needed; timings are not GPU timings).")(f)


def choose_device(command: str, device: str | None, interpreter: bool) -> tuple[str, bool]:
    """The torch device to run on and whether it is the interpreter; no GPU is an error.

    ``command`` is "search", "revalidate" or "bench", for the message.
    """
    import os

    if interpreter or device == "cpu":
        if "flashtune.kernels.common" not in sys.modules:
            os.environ["TRITON_INTERPRET"] = "1"  # read by triton and the kernels at import
        return "cpu", True
    import torch

    if not torch.cuda.is_available():
        raise click.ClickException(
            f"no CUDA GPU found (torch {torch.__version__} sees none): `flashtune {command}` {_NEEDS_GPU[command]}; "
            f"run `flashtune {command} --interpreter` for a tiny demo under the Triton interpreter on the CPU"
        )
    from flashtune.device import resolve_device

    return str(resolve_device(device or "cuda")), False


# -- the store ------------------------------------------------------------------------------

def missing_store(db: str | None) -> Path | None:
    """The SQLite file of ``db`` if it does not exist (yet); None otherwise."""
    from flashtune.store import resolve_url

    url = resolve_url(db)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    path = Path(url.database)
    return None if path.exists() else path


# How long a command waits for a lock on the store before it says what holds it.
LOCK_TIMEOUT_S = 10.0


def open_store(db: str | None, *, create: bool = False):
    """The store at ``db``; without ``create``, a missing SQLite file is an error that says what to do
    (and a file this process cannot write is read read-only)."""
    from flashtune.store import NoStoreError, Store, resolve_url

    remedy = "tune with `flashtune search`, import a file with `flashtune import FILE`, or point --db at another store"
    path = None if create else missing_store(db)
    if path is not None:
        raise click.ClickException(f"no flashtune store at {path}: {remedy}")
    try:
        return Store(resolve_url(db), create=create, lock_timeout_s=None if create else LOCK_TIMEOUT_S)
    except NoStoreError as e:
        raise click.ClickException(f"{e}; {remedy}") from e


def stale_note(stale: int, total: int, db: str | None = None) -> str:
    """What a listing says under its table when some results are stale, and the command that fixes it."""
    one = stale == 1
    return (f"note: {stale} of {plural(total, 'result')} {'is' if one else 'are'} stale (tuned under other kernel "
            f"sources or another triton): get_tuned_attention() serves {'it' if one else 'them'} once "
            f"`flashtune revalidate{f' --db {db}' if db else ''}` has checked {'it' if one else 'them'} again here")


def read_results(store, where) -> list:
    """The results that match ``where``; a damaged row is skipped with a warning naming it."""
    damaged: list[str] = []
    results = store.list_results(where, damaged=damaged)
    for problem in damaged:
        click.echo(f"warning: skipped {problem}", err=True)
    return results


# -- output ---------------------------------------------------------------------------------

def fmt(value: Any, digits: int = 4) -> str:
    """A cell of a readable table."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def tflops(value: float | None) -> float | str | None:
    """A TFLOPS cell: one decimal (456.7); "<0.1" for the interpreter's tiny figures."""
    if value is None:
        return None
    return "<0.1" if 0 < value < 0.05 else round(value, 1)


def plural(count: int, word: str, words: str | None = None) -> str:
    """"1 key", "2 keys" (``words`` where the plural is not ``word + "s"``)."""
    return f"{count} {word if count == 1 else words or word + 's'}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A table drawn by rich: numbers right, text left, one rule under the header, no frame.

    On a terminal it fits the terminal's width (bold header); elsewhere (a pipe, a log, a test) it
    takes its natural width, so no cell is wrapped and each row stays one line of plain text."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    cells = [[fmt(c) for c in row] for row in rows]
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, highlight=False,
                  header_style="bold" if _terminal() else "")
    for i, header in enumerate(headers):
        present = [row[i] for row in rows if row[i] not in (None, "-")]
        numeric = bool(present) and all(_is_number(v) for v in present)
        table.add_column(header, justify="right" if numeric else "left", no_wrap=not _terminal())
    for row in cells:
        table.add_row(*row)
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=_terminal(), color_system="standard" if _terminal() else None,
                      highlight=False, width=100_000)
    width = console.measure(table).maximum
    if _terminal():
        import shutil

        width = min(width, shutil.get_terminal_size().columns)
    console.width = width
    console.print(table)
    return "\n".join(line.rstrip() for line in buffer.getvalue().rstrip("\n").split("\n"))


def _terminal() -> bool:
    """Whether standard output is a terminal (tables are drawn for it)."""
    return sys.stdout.isatty()


def _is_number(value: Any) -> bool:
    """A number, a ratio such as "1.25x", or a bound such as "<0.1"."""
    if isinstance(value, str) and (value.endswith("x") or value.startswith("<")):
        value = value.strip("x<")
        return value.replace(".", "", 1).isdigit()
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, allow_nan=False, default=str))


def echo_csv(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(headers)
    for row in rows:
        writer.writerow(["" if v is None else json.dumps(v) if isinstance(v, (dict, list, bool)) else v
                         for v in row])
    click.echo(buffer.getvalue(), nl=False)


def check_one_format(as_json: bool, as_csv: bool) -> None:
    if as_json and as_csv:
        raise click.UsageError("--json and --csv exclude each other: choose one")
