"""One plugin mechanism: a `Registry` for each kind of part a card names.

Kinds: rewards, envs, tools, transforms, generators, engines, rollouts, algorithms (training:
arlecli.train.algorithm). Each kind's registry lives beside it; every one looks a name up the
same way:

    exact                   a registered name: arle's own (its modules are imported on the first
                            lookup, so `arle --help` stays fast), one a decorator registered in a
                            module already imported, or an installed package's entry point in
                            group `arle.<kind>` (`exact = "mypkg.rewards:exact"`, imported only
                            when that name is looked up)
    mypkg.rewards:exact     an attribute of an importable module
    my_reward.py:exact      an attribute of a Python file; a relative path is relative to the
                            card's folder (`anchor` makes it absolute when the card loads)

Registering one name twice is an error that names both origins; an unknown name suggests near
ones. Modelled on lm-eval's `lm_eval/api/registry.py` (one generic registry, lazy
"module:attr" entries, entry-point placeholders) without its class hierarchy.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar

from arlecli.errors import UserError, near_names

T = TypeVar("T")
GROUP_PREFIX = "arle."

# Modules loaded from a file path (generated module name -> file), so a decorator that runs
# inside one records the file as its origin.
_FILE_MODULES: dict[str, Path] = {}
_LOCK = threading.RLock()  # rollouts look names up from agent threads


@dataclass(frozen=True)
class Origin:
    """Where a plugin came from: `how` is "builtin", "module", "file" or "entry point"."""

    how: str
    where: str

    def __str__(self) -> str:
        return f"{self.how} {self.where}"


def is_file_spec(spec: str) -> bool:
    """Whether `spec` names a Python file's attribute (`path/to/file.py:attr`)."""
    where, sep, attr = spec.rpartition(":")
    return bool(sep and attr) and where.endswith(".py")


def anchor(spec: str, base: Path | None) -> str:
    """`spec` with a relative `file.py:attr` made absolute against `base` (a card's folder);
    every other spec is returned unchanged."""
    if base is None or not is_file_spec(spec):
        return spec
    where, _, attr = spec.rpartition(":")
    path = Path(where).expanduser()
    return f"{path if path.is_absolute() else (base / path).resolve()}:{attr}"


def origin_of(obj: Any) -> Origin:
    """Where `obj` (a function or class) was defined: arle itself, a module, or a file."""
    module = getattr(obj, "__module__", None) or "?"
    if module in _FILE_MODULES:
        return Origin("file", str(_FILE_MODULES[module]))
    if module == "arlecli" or module.startswith("arlecli."):
        return Origin("builtin", module)
    return Origin("module", module)


def import_file(path: Path) -> ModuleType:
    """Import a Python file once per process (every later lookup shares the module)."""
    path = path.resolve()
    name = f"arle_plugin_{path.stem}_{abs(hash(str(path))):x}"
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise ImportError(f"no file {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    _FILE_MODULES[name] = path
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_attr(spec: str, base: Path | None = None) -> tuple[Any, Origin]:
    """The object `"module:attr"` or `"file.py:attr"` names (a file relative to `base`), and its
    origin. Raises what the import raises."""
    where, _, attr = spec.rpartition(":")
    if where.endswith(".py"):
        path = Path(where).expanduser()
        path = path if path.is_absolute() or base is None else base / path
        module = import_file(path)
        return getattr(module, attr), Origin("file", f"{path.resolve()}:{attr}")
    return getattr(importlib.import_module(where), attr), Origin("module", spec)


def _definition(obj: Any) -> tuple[str, str]:
    return getattr(obj, "__module__", "?"), getattr(obj, "__qualname__", repr(obj))


class Registry(Generic[T]):
    """Named plugins of one kind, looked up by name, `module:attr` or `file.py:attr`.

    Args:
        kind: the plural noun, which names the entry point group (`arle.<kind>`).
        label: what an error calls one ("reward", "rollout function").
        builtin: arle's modules that register this kind on import; "pkg.*" is every module
            of package `pkg`. Imported on the first lookup.
        wrap: turns an object found by `module:attr`, file or entry point into the registry's
            value (envs wrap a plain factory in an EnvKind); default: the object itself.
    """

    def __init__(
        self, kind: str, label: str, builtin: Sequence[str] = (), wrap: Callable[[Any, str], T] | None = None
    ) -> None:
        self.kind, self.label, self.group = kind, label, GROUP_PREFIX + kind
        self._builtin = tuple(builtin)
        self._wrap = wrap
        self._objs: dict[str, T] = {}
        self._origins: dict[str, Origin] = {}
        self._defs: dict[str, tuple[str, str]] = {}
        self._eps: dict[str, Any] | None = None  # entry points by name, once scanned
        self._scanning = False

    # -- registering

    def add(self, name: str, obj: T, source: Any = None) -> None:
        """Register `obj` under `name`; `source` is the function it was made from (for its
        origin), default `obj`. Raises UserError if another definition holds the name."""
        source = obj if source is None else source
        origin, definition = origin_of(source), _definition(source)
        with _LOCK:
            if name in self._objs and self._objs[name] is not obj and self._defs[name] != definition:
                raise self._duplicate(name, self._origins[name], origin)
            ep = (self._eps or {}).get(name)
            if ep is not None and not _same_package(ep.module, definition[0]):
                raise self._duplicate(name, self._ep_origin(ep), origin)
            self._objs[name], self._origins[name], self._defs[name] = obj, origin, definition

    def decorator(self, name: str | None = None) -> Callable[[Any], Any]:
        """`@registry.decorator("name")`: register a function unchanged (name default: its own)."""

        def deco(fn: Any) -> Any:
            self.add(name or fn.__name__, fn)
            return fn

        return deco

    # -- looking up

    def names(self) -> list[str]:
        """Every name this registry knows: builtin, registered and entry points (not loaded)."""
        self._ensure()
        return sorted({*self._objs, *(self._eps or {})})

    def has(self, name: str) -> bool:
        """Whether `name` is a registered name (builtin, registered or an entry point)."""
        self._ensure()
        return name in self._objs or name in (self._eps or {})

    def get(self, spec: str, base: Path | None = None) -> T:
        """The plugin `spec` names (see the module doc); `base` anchors a relative file."""
        return self.resolve(spec, base)[0]

    def origin(self, spec: str, base: Path | None = None) -> Origin:
        """Where the plugin `spec` names comes from (loading it if need be)."""
        return self.resolve(spec, base)[1]

    def resolve(self, spec: str, base: Path | None = None) -> tuple[T, Origin]:
        """The plugin `spec` names and its origin. Raises UserError (one line) for an unknown
        name, a module or file that does not import, or an attribute that is missing."""
        self._ensure()
        if spec in self._objs:
            return self._objs[spec], self._origins[spec]
        if self._eps and spec in self._eps:
            return self._load_entry_point(spec)
        if ":" not in spec:
            raise self.unknown(spec)
        try:
            obj, origin = load_attr(spec, base)
        except UserError:
            raise
        except Exception as exc:  # the user's module failing to import is the user's to fix
            raise UserError(f"cannot load {self.label} '{spec}': {type(exc).__name__}: {exc}") from None
        return self._value(obj, spec, f"{self.label} '{spec}'"), origin

    def unknown(self, spec: str) -> UserError:
        """The error for a name nobody registered: near names, the known ones, the other forms."""
        names = self.names()
        near = near_names(spec, names)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        return UserError(
            f"unknown {self.label} '{spec}'{hint}; known: {', '.join(names) or 'none'}; "
            f"or name one as 'module:attr' or 'file.py:attr'"
        )

    # dict-style access to registered names, for callers and tests that index the registry
    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.has(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def refresh(self) -> None:
        """Read the entry points again on the next lookup (after installing or removing a
        package); names loaded from entry points are forgotten."""
        with _LOCK:
            for name in [n for n, o in self._origins.items() if o.how == "entry point"]:
                del self._objs[name], self._origins[name], self._defs[name]
            self._eps = None

    # -- internals

    def _value(self, obj: Any, name: str, what: str) -> T:
        if not callable(obj):
            raise UserError(f"{what} is not a function or class (got {type(obj).__name__})")
        return self._wrap(obj, name) if self._wrap is not None else obj

    def _ensure(self) -> None:
        if self._eps is not None:
            return
        with _LOCK:  # reentrant: a builtin module that looks a name up while importing returns here
            if self._eps is not None or self._scanning:
                return
            self._scanning = True
            try:
                for module in self._builtin:
                    _import_builtin(module)
                self._eps = self._scan_entry_points()
            finally:
                self._scanning = False

    def _scan_entry_points(self) -> dict[str, Any]:
        from importlib import metadata

        eps: dict[str, Any] = {}
        for ep in metadata.entry_points(group=self.group):
            prev = eps.get(ep.name)
            if prev is not None and prev.value != ep.value:
                raise self._duplicate(ep.name, self._ep_origin(prev), self._ep_origin(ep))
            eps[ep.name] = ep
        for name, ep in eps.items():
            if name not in self._objs:
                continue
            if not _same_package(ep.module, self._defs[name][0]):
                raise self._duplicate(name, self._origins[name], self._ep_origin(ep))
            self._origins[name] = self._ep_origin(ep)  # its package was imported first (for its cards)
        return eps

    def _load_entry_point(self, name: str) -> tuple[T, Origin]:
        assert self._eps is not None
        ep = self._eps[name]
        origin = self._ep_origin(ep)
        with _LOCK:
            try:
                obj = ep.load()
            except UserError:
                raise
            except Exception as exc:
                raise UserError(
                    f"cannot load {self.label} '{name}' from {origin}: {type(exc).__name__}: {exc}; "
                    f"fix or uninstall that package"
                ) from None
            # Its module may have registered the name itself on import (with its metadata).
            value = self._objs[name] if name in self._objs else self._value(obj, name, f"{self.label} '{name}'")
            self._objs[name], self._origins[name], self._defs[name] = value, origin, _definition(obj)
        return value, origin

    def _ep_origin(self, ep: Any) -> Origin:
        dist = getattr(ep, "dist", None)
        package = f" from {dist.name} {dist.version}" if dist is not None else ""
        return Origin("entry point", f"{self.group} '{ep.name} = {ep.value}'{package}")

    def _duplicate(self, name: str, first: Origin, second: Origin) -> UserError:
        return UserError(
            f"{self.label} '{name}' is registered twice: by {first} and by {second}; "
            f"rename one of them (or uninstall the package that clashes)"
        )


def _same_package(a: str, b: str) -> bool:
    # An entry point's own package registering its name with a decorator is one plugin, not two.
    return a.split(".")[0] == b.split(".")[0]


def _import_builtin(module: str) -> None:
    if not module.endswith(".*"):
        importlib.import_module(module)
        return
    package = importlib.import_module(module[:-2])
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")
