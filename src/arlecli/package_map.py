"""`importlib.metadata.packages_distributions()`, kept on disk from one arle command to the next.

Why: transformers calls it when it is imported (transformers.utils.import_utils), and it reads the
file list of every installed distribution: 0.36 s of each command's start-up in a virtual
environment of 266 packages, for an answer that changes only when packages are installed or
removed. Kept in the cache folder under a key of the interpreter and each import path folder's
modification time (installing, upgrading or removing a package adds or removes entries in its
site-packages folder, which changes that time), so a changed environment computes it afresh.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from arlecli import safeio

CACHE_FILE = "packages_distributions.json"


def install() -> None:
    """Have `importlib.metadata.packages_distributions` answer from the cache where it is current
    (for this process; a second call changes nothing)."""
    real = importlib.metadata.packages_distributions
    if getattr(real, "arle_cached", False):
        return

    def cached() -> Mapping[str, list[str]]:
        return _cached(real)

    cached.arle_cached = True  # type: ignore[attr-defined]
    cached.__doc__, cached.__wrapped__ = real.__doc__, real  # type: ignore[attr-defined]
    importlib.metadata.packages_distributions = cached


def _key() -> list[Any]:
    """The interpreter and each import path folder with its modification time, but the working
    folder (`python -m` puts it first): its time moves with every file a run writes there, and a
    distribution's metadata does not live in it."""
    here = os.getcwd()
    entries = []
    for entry in sys.path:
        if entry in ("", ".", here):
            continue
        try:
            entries.append([entry, os.stat(entry).st_mtime_ns])
        except OSError:
            entries.append([entry, None])
    return [sys.version, sys.prefix, entries]


def _cached(real: Any) -> Mapping[str, list[str]]:
    from arlecli.config import cache_dir

    path = cache_dir() / CACHE_FILE
    key = _key()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        mapping = data["map"]
        if data["key"] == key and _well_formed(mapping):
            return mapping
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, unreadable or damaged: computed afresh below
    mapping = real()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # whole or not at all, for a command starting beside this one
        safeio.write_atomic(path, json.dumps({"key": key, "map": mapping}))
    except OSError:
        pass  # an unwritable cache costs the 0.36 s again next time, nothing else
    return mapping


def _well_formed(mapping: Any) -> bool:
    return isinstance(mapping, dict) and all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(d, str) for d in v) for k, v in mapping.items()
    )
