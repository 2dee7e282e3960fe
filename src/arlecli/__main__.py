"""`python -m arlecli` runs the `arle` command."""

from arlecli.cli.main import main

# Guarded: vLLM's spawned workers re-import __main__ and must not re-run the CLI.
if __name__ == "__main__":
    main()
