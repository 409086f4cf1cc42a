"""The ``flashtune`` command: search, revalidate, list, show, export, import, bench, delete, db, info.

One click group in the style of sqlite-utils: every command has help, tables by
default and ``--json``/``--csv`` on request, user mistakes end in a one-line error with
the remedy (exit 1; usage errors exit 2). torch, triton, sqlalchemy and optuna are
imported inside the commands, so ``flashtune --help`` is instant.
"""

from __future__ import annotations

import click

from flashtune._version import __version__
from flashtune.cli._common import Group
from flashtune.cli.bench import bench_command
from flashtune.cli.db import db_group
from flashtune.cli.exchange import export_command, import_command
from flashtune.cli.info import info_command
from flashtune.cli.remove import delete_command, reset_command
from flashtune.cli.results import list_command, show_command
from flashtune.cli.revalidate import revalidate_command
from flashtune.cli.search import search_command

__all__ = ["cli", "main"]


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="flashtune", message="%(prog)s %(version)s")
def cli():
    """flashtune: FlashAttention kernels tuned for the GPU you have.

    \b
    Tune this GPU, then look at what was stored:
      flashtune search
      flashtune list
    Hand the tuned table to another team:
      flashtune export -o h200.json
      flashtune import h200.json
    After upgrading flashtune or triton, check the tuned table again:
      flashtune revalidate
    Without a GPU, `flashtune search --interpreter` runs a tiny CPU demo.
    """
    from flashtune.compat import version_problems

    errors, _ = version_problems()
    if errors:  # `import flashtune` refused them; a command run in-process says the same
        raise click.ClickException("; ".join(errors))


for command in (search_command, revalidate_command, list_command, show_command, export_command, import_command,
                bench_command, delete_command, db_group, info_command):
    cli.add_command(command)
db_group.add_command(reset_command)


def main(argv: list[str] | None = None) -> None:
    """The console script: ``flashtune = flashtune.cli:main``."""
    cli.main(args=argv, prog_name="flashtune")
