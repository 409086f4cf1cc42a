"""``python -m flashtune``: the command line, where the console script is not installed."""

from flashtune.cli import main

main()
