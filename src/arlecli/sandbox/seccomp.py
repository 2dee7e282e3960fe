"""A seccomp filter for jailed programs (bubblewrap loads it with `--seccomp FD`).

Namespaces do not separate everything. The kernel keyring is per user, not per namespace:
without a filter a program reads arle's session keys, overwrites them, plants keys that a
later sample reads (a channel between samples), and lists the user's other keys. No test
needs the keyring, nor the other interfaces refused here: tracing other processes (the
harness is undumpable already; this is the second lock), eBPF, userfaultfd (a staple of
kernel exploits), perf events and io_uring (large attack surfaces that bypass no namespace
but have had many holes). Each is answered EPERM, as if the kernel refused it.

Syscalls of another ABI than the interpreter's (i386 through `int 0x80` on x86-64, x32) are
refused wholesale: a filter by number would be bypassed through them.

The filter is classic BPF, built here (8 bytes an instruction) rather than through libseccomp,
which would be a compiled dependency for ~20 instructions. `program()` is None on an
architecture without a table below; the jail then runs without a filter and says so.
"""

from __future__ import annotations

import functools
import platform
import struct

# What is refused, by name (the docstring says why).
DENIED = (
    "add_key",
    "request_key",
    "keyctl",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "bpf",
    "userfaultfd",
    "perf_event_open",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
)

# Per architecture: the AUDIT_ARCH value, the syscall numbers of DENIED, and the lowest
# number of a second ABI on the same audit arch (x32 on x86-64), or None.
_TABLES: dict[str, tuple[int, dict[str, int], int | None]] = {
    "x86_64": (
        0xC000003E,
        {
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "bpf": 321,
            "userfaultfd": 323,
            "perf_event_open": 298,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
        },
        0x40000000,
    ),
    "aarch64": (
        0xC00000B7,
        {
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "bpf": 280,
            "userfaultfd": 282,
            "perf_event_open": 241,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
        },
        None,
    ),
}

# Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_EPERM = 1
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


@functools.cache
def program() -> bytes | None:
    """The filter as bytes for `bwrap --seccomp`, or None where no table fits this machine."""
    table = _TABLES.get(platform.machine())
    if table is None:
        return None
    arch, numbers, second_abi = table
    denied = [numbers[name] for name in DENIED]
    # Layout: check arch; load nr; (x32 check); one jeq per denied nr; ALLOW; DENY.
    checks = len(denied) + (1 if second_abi is not None else 0)
    to_deny = checks + 1  # from the instruction after the arch check's load, jumps land past ALLOW
    out = [
        _insn(_LD_W_ABS, 0, 0, _ARCH),
        _insn(_JEQ_K, 0, to_deny + 1, arch),  # another ABI: straight to DENY
        _insn(_LD_W_ABS, 0, 0, _NR),
    ]
    left = checks
    if second_abi is not None:
        left -= 1
        out.append(_insn(_JGE_K, left + 1, 0, second_abi))
    for nr in denied:
        left -= 1
        out.append(_insn(_JEQ_K, left + 1, 0, nr))
    out += [_insn(_RET_K, 0, 0, _ALLOW), _insn(_RET_K, 0, 0, _ERRNO | _EPERM)]
    return b"".join(out)
