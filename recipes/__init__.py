"""Packaged training recipes (YAML)."""
