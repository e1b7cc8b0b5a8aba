"""``python -m memd`` runs the memd command."""

from memd.cli import main

main()
