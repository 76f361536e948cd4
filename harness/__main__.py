"""python -m harness +experiment=NAME [key=value ...]: run a sweep (see README.md)."""

from harness.command.cli import main

main()
