"""`python -m trainguard.cli`: the same as the `trainguard` command."""

from trainguard.cli import main

main()
