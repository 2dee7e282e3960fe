"""The `arle` command line: one module per command group (main wires them; output and options are shared)."""
