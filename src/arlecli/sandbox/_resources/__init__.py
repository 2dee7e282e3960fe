"""Programs that run inside the jail, kept as files: `harness_main.py` (the test harness) and
`launcher.py` (the limits every program starts under). Stdlib only; the host sends their text."""
