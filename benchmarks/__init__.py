"""Packaged benchmark cards (YAML) and their fixture rows; data, not code."""
