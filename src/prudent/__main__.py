"""``python -m prudent`` is the ``prudent`` command."""

from prudent.cli import main

main()
