"""A model folder's packed weights (engine.cpu_gemm's layout) kept in a file between runs and
mapped, not packed again.

Why: packing copies every weight into fresh memory, and on a VM that backs its memory lazily the
first touch of 540 MB of 2 MB pages costs ~1 s of system time at each start (perf/README.md): half
of `arle eval`'s start after the imports. A file the page cache holds maps in milliseconds, on 2 MB
pages where the file system keeps large folios (ext4 and xfs on recent kernels), so the decode
streams the weights as fast as from the packed copy; elsewhere (4 KB pages, where the decode's
linears are ~5% slower) each entry is copied into 2 MB pages, which still skips the packing.

What makes it safe to use: the file is named by the weight files it was packed from (each one's
size, inode, modification and change times, and bytes sampled across it), lives in a folder
only this user can write (it is data, not code, but it decides every number), and each entry must
have the shape of the weight asked for and equal it at SPOT_CHECKS places (another packing order
or layout: an older arle) before it is used. Anything else packs anew, and the file is rewritten
from what this run used. $ARLE_PACK_CACHE_BYTES caps the folder (default 4 GiB; 0: off); the
least recently used files go first, and a model whose packed weights exceed the cap is not kept.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import mmap
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arlecli.config import cache_dir, env_count
from arlecli.engine import cpu_gemm

log = logging.getLogger(__name__)

ENV_VAR = "ARLE_PACK_CACHE_BYTES"
DEFAULT_BYTES = 4 << 30
MAGIC = b"arle-packed-weights 1\n"
# The entries start 2 MB into the file: a mapping on 2 MB pages needs the file offset aligned too.
HEADER = 1 << 21
SPOT_CHECKS = 64
_SAMPLES = 16  # blocks of each weight file read into its name
_SAMPLE = 4096


@dataclass
class PackedStore:
    """The packed weights of one model folder: the entries its file holds (views of the mapping,
    in the order they were packed), and what this run's packing used, in order (`keep`)."""

    path: Path
    budget: int
    entries: list[Any] = field(default_factory=list)
    # Whether the mapping is on 2 MB pages; where it is not (a file system without large folios),
    # a taken entry is copied into 2 MB pages: the decode's linears are ~5% slower on 4 KB ones.
    mapped_huge: bool = True
    kept: list[Any] = field(default_factory=list)
    packed_now: int = 0  # of `kept`, the ones not taken from the file
    _taken: Any = None

    def take(self, weight: Any) -> Any | None:
        """The cached pack of `weight` ([n, k] fp32): the file's next entry where it has this
        shape and equals `weight` at SPOT_CHECKS places, else None (pack it now)."""
        if len(self.kept) >= len(self.entries):
            return None
        entry = self.entries[len(self.kept)]
        n, k = weight.shape
        if entry.numel() != n * k or not _spots_agree(entry, weight):
            return None
        self._taken = entry if self.mapped_huge else _copied(entry)
        return self._taken

    def keep(self, packed: Any) -> None:
        """`packed` (from `take`, or packed now) is the next weight this run uses."""
        self.kept.append(packed)
        self.packed_now += packed is not self._taken

    def save(self) -> None:
        """Write what this run used where the file does not hold exactly that (nothing cached yet,
        or an entry that did not fit), within the budget; a run that took every entry from the
        file marks it recently used. Never raises: without the file, the next run packs again."""
        if not self.kept:
            return
        try:
            if not self.packed_now and len(self.kept) == len(self.entries):
                os.utime(self.path)
                return
            self._write()
        except OSError as exc:
            log.debug("packed weights not cached (%s)", exc)

    def _write(self) -> None:
        size = HEADER + sum(t.numel() * 4 for t in self.kept)
        folder = self.path.parent
        if size > self.budget or shutil.disk_usage(folder).free < 2 * size:
            return
        _evict(folder, self.budget - size, keep=self.path)
        header = json.dumps({"sizes": [t.numel() for t in self.kept]}).encode()
        if len(MAGIC) + len(header) + 1 > HEADER:
            return
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".writing-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + header + b"\n")
                f.seek(HEADER)  # a hole, not 2 MB of zeros
                for t in self.kept:
                    f.write(memoryview(t.numpy()).cast("B"))
            os.replace(tmp, self.path)  # a reader maps a whole file or none
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _copied(entry: Any) -> Any:
    """`entry` copied into 2 MB pages (by address: the arena may be an inference-mode tensor)."""
    copy = cpu_gemm.huge_paged(entry.numel())
    ctypes.memmove(copy.data_ptr(), entry.data_ptr(), entry.numel() * 4)
    return copy


def open_store(weight_files: list[Path]) -> PackedStore | None:
    """The store for a model packed from `weight_files`, with the entries of its cached file
    where there is a usable one; None where caching is off or has no private folder."""
    budget = env_count(ENV_VAR, DEFAULT_BYTES, "give a size in bytes for the packed-weights cache (0 turns it off)")
    if not budget or cpu_gemm.library() is None:  # nothing packs in its layout here
        return None
    try:
        name = _name(weight_files)
        cache = cache_dir() / "packed"
        cache.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not (cpu_gemm.private_path(cache) and cpu_gemm.private_path(cache.parent)):
            return None
    except OSError:
        return None
    path = cache / f"{name}.bin"
    entries = _mapped(path)
    return PackedStore(path, budget, entries, bool(entries) and _on_huge_pages(entries[0]))


def _name(weight_files: list[Path]) -> str:
    """A digest of what the packed weights come from: each file's identity and sampled bytes."""
    h = hashlib.sha256(MAGIC)
    for path in weight_files:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            h.update(
                f"{path.resolve()}|{st.st_size}|{st.st_ino}|{st.st_dev}|{st.st_mtime_ns}|{st.st_ctime_ns}".encode()
            )
            for i in range(_SAMPLES):
                h.update(os.pread(f.fileno(), _SAMPLE, st.st_size * i // _SAMPLES))
    return h.hexdigest()[:32]


def _mapped(path: Path) -> list[Any]:
    """The entries of the cached file at `path` as fp32 tensors over a private mapping of it
    (writes, which nothing makes, would copy), or [] where there is no whole, private one."""
    import torch

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return []
    try:
        st = os.fstat(fd)
        head = os.pread(fd, HEADER, 0)
        if not (cpu_gemm.private_path(path) and head.startswith(MAGIC)):
            return []
        sizes = json.loads(head[len(MAGIC) :].split(b"\n", 1)[0])["sizes"]
        if not all(isinstance(s, int) and s > 0 and s % 16 == 0 for s in sizes):
            return []
        if st.st_size != HEADER + 4 * sum(sizes):
            return []  # cut short: rewritten by this run
        mapping = mmap.mmap(fd, st.st_size - HEADER, access=mmap.ACCESS_COPY, offset=HEADER)
        data = torch.frombuffer(mapping, dtype=torch.float32)
    except (OSError, ValueError, KeyError, TypeError):
        return []
    finally:
        os.close(fd)
    return list(data.split(sizes))


def _on_huge_pages(data: Any) -> bool:
    """Whether the mapping that starts at tensor `data` is mapped on 2 MB pages (after touching
    its first page): the FilePmdMapped of its entry in /proc/self/smaps (read up to that entry: 2 ms
    here, ~30 ms for the whole file in a process that has loaded torch; Linux only, elsewhere False)."""
    float(data[0])
    start = f"{data.data_ptr():08x}-"
    try:
        with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
            inside = False
            for line in f:
                if not inside:
                    inside = line.startswith(start)
                elif line.startswith("FilePmdMapped:"):
                    return int(line.split()[1]) > 0
                elif line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                    return False  # the next mapping: this kernel does not say
    except (OSError, ValueError, IndexError):
        pass
    return False


def _spots_agree(entry: Any, weight: Any) -> bool:
    """Whether `entry` holds `weight` ([n, k]) in cpu_gemm's packed layout (p[n / 16][k][16]) at
    SPOT_CHECKS places spread over it, bit for bit."""
    import torch

    n, k = weight.shape
    i = torch.arange(SPOT_CHECKS, dtype=torch.int64)
    rows, cols = (i * 7919 + n // 3) % n, (i * 104729 + k // 2) % k
    at = (rows // 16) * 16 * k + cols * 16 + rows % 16
    return torch.equal(entry[at].view(torch.int32), weight.detach()[rows, cols].contiguous().view(torch.int32))


def _evict(folder: Path, room: int, keep: Path) -> None:
    """Delete the least recently used cached files in `folder` until the rest take at most `room`
    bytes (`keep` is left alone: it is about to be replaced), and files a killed run left half
    written an hour ago or more."""
    files = []
    for p in folder.iterdir():
        try:
            st = p.lstat()
        except OSError:
            continue
        if p.name.startswith(".writing-") and st.st_mtime < time.time() - 3600:
            p.unlink(missing_ok=True)
        elif p.suffix == ".bin" and p != keep:
            files.append((st.st_mtime, st.st_size, p))
    total = sum(size for _, size, _ in files)
    for _, size, p in sorted(files):
        if total <= room:
            break
        p.unlink(missing_ok=True)
        total -= size
