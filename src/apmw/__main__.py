"""`python -m apmw` runs the CLI, as the `apmw` command does."""

from apmw.cli import main

main()
