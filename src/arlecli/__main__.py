"""`python -m arlecli` runs the `arle` command."""

from arlecli.cli.main import main

main()
