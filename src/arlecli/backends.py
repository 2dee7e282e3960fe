"""The registry of engine backends: a name (`--backend hf|vllm|openai|...`) to its factory.

It sits below config and models, which check a backend's name when a profile is saved or a
model resolved, and below `arlecli.engine`, which registers arle's own backends in it (the
registry imports that package by name on the first lookup, as every plugin registry loads
its built-ins) and builds engines from it. Packages add backends through `arle.engines`
entry points (arlecli/plugins.py).
"""

from __future__ import annotations

from typing import Any, Callable

from arlecli.errors import UserError
from arlecli.plugins import Registry

# A factory `(spec, *, batch_size, concurrency, vllm_options) -> Engine`.
EngineFactory = Callable[..., Any]
ENGINES: Registry[EngineFactory] = Registry("engines", "backend", builtin=["arlecli.engine"])


def register_engine(name: str | None = None) -> Callable[[EngineFactory], EngineFactory]:
    """Register an engine factory `(spec, *, batch_size, concurrency, vllm_options) -> Engine`
    under `name` (default: its own name)."""
    return ENGINES.decorator(name)


def engine_names() -> list[str]:
    """The known backends (arle's, decorated in imported modules, entry points)."""
    return ENGINES.names()


def check_backend(name: str) -> None:
    """Refuse a `--backend` no engine is registered under (arle's or a package's), in one line."""
    if not ENGINES.has(name):
        raise UserError(f"unknown backend {name!r}: pass --backend {', '.join(engine_names())} (or leave it out)")
