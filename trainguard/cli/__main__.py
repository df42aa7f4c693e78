"""``python -m trainguard.cli``: the same command line as the ``trainguard`` script."""

from trainguard.cli import main

main()
