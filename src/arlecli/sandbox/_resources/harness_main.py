"""The test harness's program: what runs inside each jail, as its main.py.

`arlecli.sandbox.harness` (whose docstring holds the threat model and the modes) sends this
file's text into every jail and reads back the verdict. It is a standalone program: stdlib only,
never importing arlecli, since the jail holds the standard library and this file alone. The host
imports its plain-data helpers (`to_plain` ... `value_digest`) from here, so both sides encode,
decode and digest the same way; importing it runs nothing (the program starts under `__main__`).
"""

import ast
import base64
import builtins
import ctypes
import decimal
import hashlib
import importlib
import json
import linecache
import math
import os
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import types

DIGEST_HEX = 12  # hex digits of an output digest: 48 bits; the program never sees the target
MSG = 300  # characters of any message in a verdict
MAX_MESSAGE = 64 << 20  # bytes of one message between the two processes
SOLUTION, PROMPT, TEST = "solution.py", "prompt.py", "test.py"


# ---------------------------------------------------------------------------------------
# Plain data: the only values that cross a process boundary. The host imports these, so
# both sides encode, decode and digest the same way.
# ---------------------------------------------------------------------------------------


class NotPlainData(TypeError):
    """A value that is not plain data (see `to_plain`)."""


def to_plain(value, depth=0):
    """`value` as JSON-ready tagged plain data, or NotPlainData.

    Plain data is None, bool, int, float (nan and inf included), str, bytes, and list,
    tuple, set, frozenset and dict of plain data, nested at most 100 deep, of exactly
    those types: a subclass (an int whose __eq__ always says True) is not plain data.
    Lists are JSON arrays; the other containers, and ints too big for a JSON number
    reader, are one-key objects: {"t": tuple items}, {"s": set}, {"f": frozenset},
    {"d": [[key, value], ...]}, {"b": base64 bytes}, {"x": hex int}.
    """
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is float:
        return value
    if kind is int:
        return value if -(1 << 63) <= value < (1 << 63) else {"x": format(value, "x")}
    if depth >= 100:
        raise NotPlainData("nested more than 100 deep")
    if kind is list:
        return [to_plain(v, depth + 1) for v in value]
    if kind is tuple or kind is set or kind is frozenset:
        tag = "t" if kind is tuple else "s" if kind is set else "f"
        return {tag: [to_plain(v, depth + 1) for v in value]}
    if kind is dict:
        return {"d": [[to_plain(k, depth + 1), to_plain(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"b": base64.b64encode(value).decode("ascii")}
    raise NotPlainData(f"a {getattr(kind, '__qualname__', '?')!s:.60} is not plain data")


def from_plain(data, depth=0):
    """The value `to_plain` encoded, from JSON-parsed `data`; ValueError for anything else."""
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is float or kind is str:
        return data
    if depth >= 100:
        raise ValueError("nested more than 100 deep")
    if kind is list:
        return [from_plain(v, depth + 1) for v in data]
    if kind is not dict or len(data) != 1:
        raise ValueError("not tagged plain data")
    ((tag, inner),) = data.items()
    if tag == "x" and type(inner) is str and 0 < len(inner) <= 100_000:
        return int(inner, 16)
    if tag == "b" and type(inner) is str:
        return base64.b64decode(inner, validate=True)
    if type(inner) is not list:
        raise ValueError("not tagged plain data")
    if tag == "d":
        if not all(type(p) is list and len(p) == 2 for p in inner):
            raise ValueError("a dict's items must be pairs")
        items = [(from_plain(k, depth + 1), from_plain(v, depth + 1)) for k, v in inner]
    else:
        items = [from_plain(v, depth + 1) for v in inner]
    try:
        if tag == "t":
            return tuple(items)
        if tag == "s":
            return set(items)
        if tag == "f":
            return frozenset(items)
        if tag == "d":
            return dict(items)
    except TypeError as exc:  # an unhashable key or member
        raise ValueError(str(exc)) from None
    raise ValueError(f"unknown tag {tag!r:.20}")


def dumps_plain(value):
    """`value` as tagged plain-data JSON text (ASCII), or NotPlainData."""
    return json.dumps(to_plain(value), separators=(",", ":"))


def loads_plain(text, limit=64 << 20):
    """The value in tagged plain-data JSON `text`; ValueError for anything odd (too long,
    too deep, not JSON, an unknown tag, an unhashable set member)."""
    if len(text) > limit:
        raise ValueError(f"more than {limit} bytes")
    try:
        return from_plain(json.loads(text))
    except (ValueError, TypeError, RecursionError, MemoryError) as exc:
        raise ValueError(f"not plain data: {exc}"[:200]) from None


def as_json(value):
    """A plain value as JSON would carry it (tuples as lists, sets as lists sorted by repr,
    dict keys as strings, bytes as their repr): what a return value looked like when the
    harness passed it through json, which `same_value` compares against."""

    def default(v):
        if isinstance(v, (set, frozenset)):
            return sorted(v, key=repr)
        return repr(v)

    return json.loads(json.dumps(value, default=default))


def canonical_output(text):
    """Program output as the comparison sees it: stripped lines, whitespace runs as one
    space. `same_output` gives the same answer on this as on the raw text."""
    return "\n".join(" ".join(line.split()) for line in text.strip().splitlines())


def _number_token(token):
    # A finite decimal as sign, digits without trailing zeros and exponent, so tokens
    # that are equal as decimals ("2.50", "2.5", "25e-1") read the same.
    try:
        number = decimal.Decimal(token)
    except (decimal.InvalidOperation, ValueError):
        return token
    if not number.is_finite():
        return token
    if number.is_zero():
        return "0"
    sign, digits, exponent = number.as_tuple()
    text = "".join(map(str, digits))
    stripped = text.rstrip("0")
    return f"{'-' if sign else ''}{stripped}e{exponent + len(text) - len(stripped)}"


def output_digest(text):
    """A short digest of output `text` that two outputs share exactly when `same_output`
    with no tolerance says they are the same (up to hash collisions)."""
    strict = "\n".join(" ".join(_number_token(t) for t in line.split()) for line in text.strip().splitlines())
    return hashlib.blake2b(strict.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()[:DIGEST_HEX]


def _canonical_value(value):
    # Equal texts exactly when `same_value` with no tolerance says equal: bools and
    # integral floats read as ints (True == 1 == 1.0), dicts in key order, nan as a token
    # the host never accepts (nan equals nothing; json escapes a real NUL in a string).
    kind = type(value)
    if value is None:
        return "n"
    if kind is bool or kind is int:
        return f"i{int(value)}"
    if kind is float:
        if value != value:
            return "\x00nan"
        if value in (math.inf, -math.inf) or not value.is_integer():
            return f"f{value!r}"
        return f"i{int(value)}"
    if kind is str:
        return "s" + json.dumps(value)
    if kind is list:
        return "[" + ",".join(_canonical_value(v) for v in value) + "]"
    if kind is dict:
        return "{" + ",".join(sorted(json.dumps(k) + ":" + _canonical_value(v) for k, v in value.items())) + "}"
    return "?" + repr(value)


def value_digest(value):
    """A short digest of a JSON-shaped value (see `as_json`) that two values share exactly
    when `same_value` with no tolerance says they are equal (up to hash collisions)."""
    text = _canonical_value(value)
    if "\x00" in text:
        return "nan"  # never equal, not even to itself
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()[:DIGEST_HEX]


def clip(text, n=MSG):
    text = str(text)
    return text if len(text) <= n else text[: n // 2] + " ... " + text[-n // 2 :]


def compile_source(source, filename):
    # Registered in linecache so tracebacks show the source's lines, not the harness's.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return compile(source, filename, "exec")


def fresh_main():
    # A real __main__ module, so pickling functions the program defines works.
    module = types.ModuleType("__main__")
    module.__file__ = SOLUTION
    sys.modules["__main__"] = module
    return module.__dict__


def print_error(exc, files=(SOLUTION,)):
    """Print the traceback's frames in `files` only (the harness's are noise) to stderr;
    return the one-line summary."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename in files]
    text = "".join(traceback.format_exception_only(type(exc), exc))
    if frames:
        text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames)) + text
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except BaseException:
        pass
    return clip("".join(traceback.format_exception_only(type(exc), exc)).strip())


def exec_program(source, namespace):
    """None when the program compiled and ran to its end, else a failure dict."""
    try:
        compiled = compile_source(source, SOLUTION)
    except (SyntaxError, ValueError) as exc:
        return {"kind": "compile_error", "message": print_error(exc)}
    try:
        exec(compiled, namespace)
    except SystemExit as exc:
        return {"kind": "exit", "message": f"the program called exit({clip(repr(exc.code), 60)}) before the tests ran"}
    except BaseException as exc:
        return {"kind": "runtime_error", "message": print_error(exc)}
    return None


# --- the process boundary ------------------------------------------------------------


def make_undumpable():
    # PR_SET_DUMPABLE 0: the model's processes (same uid, no capabilities) can then neither
    # ptrace this one nor open its /proc/<pid>/mem, fd or environ.
    LIBC.prctl(4, 0, 0, 0, 0)


def drop_privileges():
    """Before model code runs in a process: no capabilities, none regained by exec (the
    jail already drops them; this holds where it could not, e.g. run as root)."""
    LIBC.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    for cap in range(64):
        LIBC.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (fails harmlessly without CAP_SETPCAP)
    LIBC.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    LIBC.capset(ctypes.byref(Header(0x20080522, 0)), ctypes.byref((Data * 2)()))


def close_fds(keep):
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = range(3, 1024)
    for fd in fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


class Stop(BaseException):
    """Ends a verdict from inside the test code. A BaseException, so that a test's
    `except Exception` cannot swallow it."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind, self.message = kind, clip(message)


class Channel:
    """Length-prefixed JSON messages over a pipe pair. The harness's side waits at most
    until `deadline`; the solution's side blocks."""

    def __init__(self, rfd, wfd, deadline=None):
        self.r, self.w, self.deadline, self.buf = rfd, wfd, deadline, bytearray()
        if deadline is not None:
            os.set_blocking(wfd, False)

    def _wait(self, fd, write):
        if self.deadline is None:
            return
        left = self.deadline - time.monotonic()
        ready = select.select([], [fd], [], max(left, 0))[1] if write else select.select([fd], [], [], max(left, 0))[0]
        if not ready:
            raise Stop("timeout", "the solution did not answer within the time budget")

    def send(self, obj):
        data = json.dumps(obj, separators=(",", ":")).encode("ascii")
        view = memoryview(b"%d\n" % len(data) + data)
        while view:
            self._wait(self.w, True)
            try:
                n = os.write(self.w, view)
            except BlockingIOError:
                continue
            except OSError:
                raise Stop("solution_died", "the solution's process is gone") from None
            view = view[n:]

    def _fill(self):
        self._wait(self.r, False)
        chunk = os.read(self.r, 1 << 16)
        if not chunk:
            raise Stop("solution_died", "the solution's process ended before the tests finished")
        self.buf += chunk

    def recv(self):
        while b"\n" not in self.buf:
            if len(self.buf) > 12:
                raise Stop("protocol_error", "the solution's process sent something odd")
            self._fill()
        head = bytes(self.buf[: self.buf.index(b"\n")])
        if not head.isdigit() or int(head) > MAX_MESSAGE:
            raise Stop("protocol_error", "the solution's process sent something odd")
        start, size = len(head) + 1, int(head)
        while len(self.buf) < start + size:
            self._fill()
        data = bytes(self.buf[start : start + size])
        del self.buf[: start + size]
        try:
            return json.loads(data)
        except (ValueError, RecursionError):
            raise Stop("protocol_error", "the solution's process sent something odd") from None


# --- the solution's process (M): runs the model's code, answers calls ----------------


def solution_process(job, rfd, wfd, output):
    """The forked child that runs the model's program; never returns. `output`: the write
    end of the pipe the harness relays to its stderr."""
    code = 0
    try:
        # Its prints and tracebacks go into a pipe of its own, never to the jail's stdout (the
        # verdict) nor to the jail's stderr: that file is open read-write, and the harness
        # writes the test's prints and compile warnings there, expected values included.
        os.dup2(output, 1)
        os.dup2(output, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # stdin held the job; the secret part must stay out of reach
        close_fds({0, 1, 2, rfd, wfd})
        drop_privileges()
        os.chdir(PROGRAM_CWD)  # the harness left it for the read-only root
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
        chan = Channel(rfd, wfd)
        chan.recv()  # the go-ahead: the harness has read, and erased, the secret part
        namespace = fresh_main()
        failure = exec_program(job["program"], namespace)
        if failure is not None:
            chan.send({"failure": failure})
        elif job["mode"] == "unittest":
            chan.send({"unittest": run_unittest(namespace, job.get("test_class") or "TestCases")})
        else:
            chan.send({"names": describe(namespace)})
            serve(chan, namespace)
    except BaseException:
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(code)


def describe(namespace):
    """{name: how the harness may bind it}: ["module", name] (it imports the module
    itself), ["import", module, qualname] (an object a module defines: it takes the
    module's own), ["value", plain data], or ["call"] (a proxy that calls in here)."""
    out = {}
    for name, value in list(namespace.items()):
        if name.startswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            out[name] = ["module", getattr(value, "__name__", "")]
        elif callable(value):
            module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
            found = None
            if type(module) is str and type(qualname) is str and module != "__main__" and module in sys.modules:
                found = sys.modules[module]
                for part in qualname.split("."):
                    found = getattr(found, part, None)
            out[name] = ["import", module, qualname] if found is value else ["call"]
        else:
            try:
                out[name] = ["value", to_plain(value)]
            except NotPlainData:
                pass
    return out


def serve(chan, namespace):
    while True:
        try:
            request = chan.recv()
        except Stop:
            return  # the harness is done with us
        try:
            name, args, kwargs = request["c"], from_plain(request["a"]), from_plain(request["k"])
            fn = namespace[name]
        except (KeyError, TypeError, ValueError) as exc:
            chan.send({"e": ["NameError", f"no function {clip(exc, 80)}"]})
            continue
        try:
            value = fn(*args, **kwargs)
        except SystemExit as exc:
            chan.send({"x": clip(repr(exc.code), 60)})
            continue
        except BaseException as exc:
            print_error(exc)
            chan.send({"e": [type(exc).__name__, clip(str(exc))]})
            continue
        try:
            reply = {"r": to_plain(value)}
        except NotPlainData as exc:
            reply = {"p": f"{name}() returned {clip(exc, 120)}"}
        chan.send(reply)


def run_unittest(namespace, class_name):
    import unittest

    case = namespace.get(class_name)
    if not (isinstance(case, type) and issubclass(case, unittest.TestCase)):
        return {"passed": 0, "total": 1, "failure": {"kind": "no_tests", "message": "no TestCase class"}}
    result = unittest.TestResult()
    unittest.TestLoader().loadTestsFromTestCase(case).run(result)
    bad = result.failures + result.errors
    for test, text in bad:
        print(f"FAIL: {test.id()}\n{text}", file=sys.stderr)
    failure = None
    if bad or not result.testsRun:
        test, text = bad[0] if bad else (None, "no tests ran")
        failure = {
            "kind": "test_failed",
            "test": test.id() if test else None,
            "message": clip(text.strip().splitlines()[-1] if text.strip() else text),
        }
    return {"passed": result.testsRun - len(bad), "total": max(result.testsRun, 1), "failure": failure}


# --- the harness's process (T): runs the tests, decides the verdict ------------------

EXIT_KINDS = {"compile_error", "runtime_error", "exit"}


class Proxy:
    """Stands in, in the harness, for a function of the solution: arguments go to the
    solution's process as plain data, the return value comes back as plain data."""

    def __init__(self, chan, name):
        self._chan, self.__name__ = chan, name

    def __repr__(self):
        return f"<solution function {self.__name__}>"

    def __call__(self, *args, **kwargs):
        name = self.__name__
        try:
            request = {"c": name, "a": to_plain(list(args)), "k": to_plain(dict(kwargs))}
        except NotPlainData as exc:
            raise TypeError(f"arle passes only plain data to the solution's {name}(): {exc}") from None
        self._chan.send(request)
        reply = self._chan.recv()
        if type(reply) is not dict or len(reply) != 1:
            raise Stop("protocol_error", f"the solution's process answered {name}() with something odd")
        ((tag, body),) = reply.items()
        if tag == "r":
            try:
                return from_plain(body)
            except ValueError as exc:
                raise Stop("not_plain_data", f"{name}() returned something that is not plain data: {exc}") from None
        if tag == "p" and type(body) is str:
            raise Stop("not_plain_data", body)
        if tag == "x" and type(body) is str:
            raise Stop("exit", f"the solution called exit({body}) in {name}()")
        if tag == "e" and type(body) is list and len(body) == 2 and all(type(b) is str for b in body):
            raise rebuilt_exception(*body)
        raise Stop("protocol_error", f"the solution's process answered {name}() with something odd")


# Exceptions that steer the test's own control flow rather than fail it: a StopIteration
# raised into a test's `all(map(candidate, ...))` or `zip(...)` loop ends the iteration early
# and the test passes. They arrive as RuntimeError (as PEP 479 turns one leaving a generator).
CONTROL_FLOW = {"StopIteration", "StopAsyncIteration"}


def rebuilt_exception(kind, message):
    """The solution's exception, as the builtin exception of that name (so a test that
    expects ValueError sees one), else RuntimeError."""
    cls = getattr(builtins, kind, None) if kind.isidentifier() and kind not in CONTROL_FLOW else None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(clip(message))
        except BaseException:
            pass
    return RuntimeError(f"{clip(kind, 60)}: {clip(message)}")


# The only modules the harness imports because the solution's side named them (a test that
# uses `math` the solution imported, as MBPP's do; a function the solution took from one):
# standard modules that run nothing when imported. Any other name would let the solution
# choose code for this process to run: `unittest.__main__` runs test discovery in the cwd,
# `antigravity` opens a browser, `this` prints; a solution must never pick those.
BINDABLE_MODULES = frozenset(
    {
        "array",
        "bisect",
        "calendar",
        "cmath",
        "collections",
        "collections.abc",
        "copy",
        "dataclasses",
        "datetime",
        "decimal",
        "enum",
        "fractions",
        "functools",
        "hashlib",
        "heapq",
        "itertools",
        "json",
        "math",
        "numbers",
        "operator",
        "random",
        "re",
        "statistics",
        "string",
        "textwrap",
        "typing",
        "unicodedata",
    }
)


def trusted_import(name):
    """The module of that name as this process imports it (the jail's read-only system
    path) when it is one of BINDABLE_MODULES, else None; never the solution's object."""
    if type(name) is not str or name not in BINDABLE_MODULES:
        return None
    try:
        return importlib.import_module(name)
    except BaseException:
        return None


def resolve(module, qualname):
    """The trusted module's own object at `qualname` (a public function or class, or a
    public attribute of one of its classes), else None. The solution chose both names: a
    path through another module (`enum.bltns.eval`: builtins' eval) or a private name would
    let it pick any function for this process to run as its answer."""
    found = trusted_import(module)
    if found is None or type(qualname) is not str:
        return None
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        if not part.isidentifier() or part.startswith("_"):
            return None
        found = getattr(found, part, None)
        if found is None or isinstance(found, types.ModuleType) or (i < len(parts) - 1 and not isinstance(found, type)):
            return None
    return found


def names_in(source):
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


def bind(namespace, names, chan, wanted, entry_point, prompt_names):
    """Bind the solution's top-level names the test uses into the test's namespace.
    Builtins are never rebound (a solution's `abs = lambda x: 0` must not judge), nor are
    the prompt's own helpers other than the entry point (the test calls the trusted ones)."""
    builtin_names = set(dir(builtins))
    for name in wanted:
        entry = names.get(name)
        if type(entry) is not list or not entry or name in builtin_names:
            continue
        if name != entry_point and name in prompt_names:
            continue
        kind = entry[0]
        value = None
        if kind == "module" and len(entry) == 2:
            value = trusted_import(entry[1])
        elif kind == "import" and len(entry) == 3:
            value = resolve(entry[1], entry[2]) or Proxy(chan, name)
        elif kind == "call":
            value = Proxy(chan, name)
        elif kind == "value" and len(entry) == 2:
            try:
                value = from_plain(entry[1])
            except ValueError:
                continue
        else:
            continue
        if value is not None or kind == "value":
            namespace[name] = value


def reported_failure(failure):
    if type(failure) is not dict or failure.get("kind") not in EXIT_KINDS or type(failure.get("message")) is not str:
        raise Stop("protocol_error", "the solution's process sent something odd")
    return {"passed": 0, "total": 1, "failure": {"kind": failure["kind"], "message": clip(failure["message"])}}


def receive_report(chan, key):
    """The solution's process's one report, {key: dict} or {"failure": ...}: (the dict,
    None), or (None, the failure verdict). Anything else is a protocol error."""
    report = chan.recv()
    if type(report) is not dict or len(report) != 1:
        raise Stop("protocol_error", "the solution's process sent something odd")
    if "failure" in report:
        return None, reported_failure(report["failure"])
    payload = report.get(key)
    if type(payload) is not dict:
        raise Stop("protocol_error", "the solution's process sent something odd")
    return payload, None


def run_script(secret, chan):
    """The test source runs here, against proxies of the solution's functions."""
    try:
        names, failed = receive_report(chan, "names")
        if failed:
            return failed
        namespace = {"__name__": "__main__", "__builtins__": builtins}
        try:
            exec(compile_source(secret["prompt"] or "", PROMPT), namespace)
        except BaseException as exc:
            failure = {"kind": "prompt_error", "message": print_error(exc, (PROMPT,))}
            return {"passed": 0, "total": 1, "failure": failure}
        entry_point = secret.get("entry_point")
        wanted = names_in(secret["test"]) | ({entry_point} if entry_point else set())
        bind(namespace, names, chan, wanted, entry_point, set(namespace))
        exec(compile_source(secret["test"], TEST), namespace)
        if entry_point:
            exec(compile_source(f"check({entry_point})\n", "check.py"), namespace)
    except Stop as stop:
        return {"passed": 0, "total": 1, "failure": {"kind": stop.kind, "message": stop.message}}
    except SystemExit as exc:
        return {
            "passed": 0,
            "total": 1,
            "failure": {"kind": "exit", "message": f"the test called exit({clip(repr(exc.code), 60)})"},
        }
    except BaseException as exc:
        return {
            "passed": 0,
            "total": 1,
            "failure": {"kind": "runtime_error", "message": print_error(exc, (TEST, PROMPT, "check.py"))},
        }
    return {"passed": 1, "total": 1, "failure": None}


def check_unittest(chan):
    """The solution's process ran the tests (they patch its module, so they must run
    there) and reports the counts: checked for shape only, so this verdict is forgeable."""
    try:
        counts, failed = receive_report(chan, "unittest")
        if failed:
            return failed
        passed, total, failure = counts.get("passed"), counts.get("total"), counts.get("failure")
        if type(passed) is not int or type(total) is not int or not 0 <= passed <= total <= 1_000_000 or total < 1:
            raise Stop("protocol_error", "the solution's process sent odd test counts")
        if failure is not None:
            if type(failure) is not dict or failure.get("kind") not in ("test_failed", "no_tests"):
                raise Stop("protocol_error", "the solution's process sent an odd failure")
            test = failure.get("test")
            failure = {
                "kind": failure["kind"],
                "test": clip(test, 200) if type(test) is str else None,
                "message": clip(failure.get("message") if type(failure.get("message")) is str else ""),
            }
        elif passed != total:
            raise Stop("protocol_error", "the solution's process sent odd test counts")
        return {"passed": passed, "total": total, "failure": failure}
    except Stop as stop:
        return {"passed": 0, "total": 1, "failure": {"kind": stop.kind, "message": stop.message}}


def relay(source, target):
    """Copy what the solution's process prints to this process's stderr, until it is gone."""
    try:
        while chunk := os.read(source, 1 << 16):
            os.write(target, chunk)
    except OSError:
        pass
    finally:
        os.close(source)


def run_solution(job, secret_reader):
    """script and unittest modes: fork the solution's process M, then read (and erase)
    the secret part of the job, which M therefore never had in memory nor can reread,
    then let M run the solution, then judge."""
    deadline = time.monotonic() + float(job["budget_s"])
    m_reads, t_writes = os.pipe()
    t_reads, m_writes = os.pipe()
    relay_reads, m_output = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(t_writes)
        os.close(t_reads)
        os.close(relay_reads)
        solution_process(job, m_reads, m_writes, m_output)
    os.close(m_reads)
    os.close(m_writes)
    os.close(m_output)
    relaying = threading.Thread(target=relay, args=(relay_reads, 2), daemon=True)
    relaying.start()
    chan = Channel(t_reads, t_writes, deadline)
    try:
        secret = secret_reader()
        try:
            chan.send({"go": 1})
        except Stop as stop:
            verdict = {"passed": 0, "total": 1, "failure": {"kind": stop.kind, "message": stop.message}}
        else:
            verdict = check_unittest(chan) if job["mode"] == "unittest" else run_script(secret, chan)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
        relaying.join(1.0)  # M is gone, so the pipe ends: its last prints land before the verdict
    return verdict, secret


# --- io mode: each test in a forked child; outputs go back as data -------------------


def resolve_function(namespace, name):
    # LeetCode style (a method of `Solution`) first, then a top-level function.
    cls = namespace.get("Solution")
    if isinstance(cls, type) and hasattr(cls, name):
        return getattr(cls(), name)
    if callable(namespace.get(name)):
        return namespace[name]
    raise NameError(f"the program defines no function or Solution method named {name!r}")


def child(compiled, prelude, test, files, fn_name):
    """Runs in the forked child: one test; exit status 0 (ran), 1 (error), 3 (the return
    value is not plain data). `files`: the harness's open fds for in, out, err and result."""
    for name, fd in (("in", 0), ("out", 1), ("err", 2)):
        os.dup2(files[name], fd)
    result_fd = files["result"]
    close_fds({0, 1, 2, result_fd})
    drop_privileges()
    os.chdir(PROGRAM_CWD)
    sys.stdin = open(0, "r", encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
    namespace = fresh_main()
    status = 0
    try:
        if prelude is not None and test["kind"] == "call":
            exec(prelude, namespace)
        exec(compiled, namespace)
        if test["kind"] == "call":
            result = resolve_function(namespace, fn_name)(*test["args"])
            try:
                text = dumps_plain(result)
            except NotPlainData as exc:
                print(f"the return value is not plain data: {exc}", file=sys.stderr)
                status = 3
            else:
                with open(result_fd, "w", encoding="ascii", closefd=False) as f:
                    f.write(text)
        for thread in threading.enumerate():  # programs that run main() in a big-stack thread
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    except SystemExit as exc:
        status = 0 if exc.code in (None, 0) else 1
        if status:
            print(f"exit({exc.code!r})", file=sys.stderr)
    except BaseException as exc:
        print_error(exc)
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        status = 1
    return status


def run_child(fn, timeout_s):
    """Fork, run fn in the child (its own process group), wait up to timeout_s; the exit
    code, or None on timeout. Whatever the child started is killed with it."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setpgid(0, 0)
            code = fn()
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout_s
    delay = 0.0005
    code = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() >= deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.01)
    try:
        os.killpg(pid, 9)
    except OSError:
        pass
    return code


def read_file(fd, limit=None):
    """What the file behind `fd` holds, from its start (pread: whatever the child did to the
    shared offset); None when it holds more than `limit` bytes or cannot be read."""
    parts, at = [], 0
    try:
        while True:
            chunk = os.pread(fd, 1 << 20, at)
            if not chunk:
                break
            parts.append(chunk)
            at += len(chunk)
            if limit is not None and at > limit:
                return None
    except OSError:
        return None
    return b"".join(parts).decode("utf-8", errors="replace")


def run_case(compiled, prelude, test, work, fn_name, timeout_s):
    """(status, payload): ("o", canonical output text or the return value), or
    ("t" | "e" | "p", message) for a timeout, an error, a value that is not plain data."""
    files = {}
    try:
        for name in ("in", "out", "err", "result"):
            fd, path = tempfile.mkstemp(dir=work)
            os.unlink(path)  # before the child exists: it never sees a path to replace
            files[name] = fd
        os.pwrite(files["in"], (test.get("input", "") if test["kind"] == "stdin" else "").encode("utf-8"), 0)
        code = run_child(lambda: child(compiled, prelude, test, files, fn_name), timeout_s)
        if code is None:
            return "t", f"no answer within {timeout_s:.1f}s"
        if code != 0:
            err = (read_file(files["err"]) or "").strip()
            return ("p" if code == 3 else "e"), clip(err.splitlines()[-1] if err else f"exit status {code}")
        if test["kind"] == "stdin":
            return "o", canonical_output(read_file(files["out"]) or "")
        text = read_file(files["result"], MAX_MESSAGE)
        if not text:
            return "e", "the function returned no result"
        try:
            return "o", loads_plain(text)
        except ValueError as exc:
            return "p", clip(exc)
    finally:
        for fd in files.values():
            os.close(fd)


def scratch_dirs():
    """{writable folder: the names it held before any test}: what `between_tests` resets.
    The program's cwd always; in the jail also /tmp (taken after the harness's `work` is made
    there, so it is kept) and /dev/shm. A degraded run's /tmp is the host's: never touched."""
    folders = [PROGRAM_CWD]
    if os.environ.get("ARLE_SANDBOX_NET") in ("namespaces", "host"):
        folders += ["/tmp", "/dev/shm"]
    kept = {}
    for folder in folders:
        try:
            kept[folder] = set(os.listdir(folder))
        except OSError:
            pass
    return kept


def between_tests(scratch):
    """Each io test starts from nothing a previous one left: every process but this one is
    killed (a child that left its process group with setsid() went on working on later tests'
    inputs, making the per-test limit a limit on the total), and the files tests wrote are
    removed (answers computed in an earlier test's time, picked up by a later one)."""
    kill_the_rest()
    while True:  # as pid 1 the orphans are ours to reap
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    for folder, kept in scratch.items():
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if name in kept:
                continue
            path = os.path.join(folder, name)
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)
            except OSError:
                pass


def run_io(job):
    """Per-test results, compact enough for the jail's captured stdout: a status letter
    per test, a digest of each output, the outputs themselves while they fit."""
    tests = job["tests"]
    try:
        compiled = compile_source(job["program"], SOLUTION)
    except (SyntaxError, ValueError) as exc:
        return {"failure": {"kind": "compile_error", "message": print_error(exc)}}
    prelude = None
    if job.get("prelude") and any(t["kind"] == "call" for t in tests):
        prelude = compile(job["prelude"], "<prelude>", "exec")
        exec(prelude, {})  # import its modules once, before the forks share them
    work = tempfile.mkdtemp()
    scratch = scratch_dirs()  # after mkdtemp: `work` is among what is kept
    deadline = time.monotonic() + float(job["budget_s"])
    statuses, digests, texts, messages, out_of_time = [], [], {}, {}, False
    for i, test in enumerate(tests):
        left = deadline - time.monotonic()
        if left <= 0:
            out_of_time = True
            break
        status, payload = run_case(
            compiled, prelude, test, work, job.get("fn_name"), min(float(job["test_timeout_s"]), left)
        )
        between_tests(scratch)
        digest = "-" * DIGEST_HEX
        if status == "o" and test["kind"] == "stdin":
            digest = output_digest(payload)
            text = payload
        elif status == "o":
            try:
                digest, text = value_digest(as_json(payload)), dumps_plain(payload)
            except (ValueError, TypeError, RecursionError) as exc:
                status, payload = "e", clip(f"the return value cannot be compared: {exc}")
        statuses.append(status)
        digests.append(digest)
        if status == "o":
            if len(text) < job["line_budget"]:
                texts[i] = text
        elif not messages:  # ASCII, so the escaped message stays as short as it looks
            messages[i] = clip(payload.encode("ascii", "replace").decode("ascii"), 200)
        if status != "o" and job.get("stop_on_failure", True):
            break
    result = {"s": "".join(statuses), "d": "".join(digests), "m": messages, "late": out_of_time, "o": {}}
    size = len(json.dumps(result))
    for i, text in texts.items():  # the outputs themselves, in test order, while they fit
        cost = len(json.dumps(text)) + len(str(i)) + 6  # "i": "text", (the key's quotes, ": " and ", ")
        if size + cost > job["line_budget"]:
            break
        result["o"][i] = text
        size += cost
    while result["o"] and len(json.dumps(result)) > job["line_budget"]:  # the budget is a hard cap
        result["o"].popitem()
    return result


# --- main ----------------------------------------------------------------------------


def read_exact(n):
    parts, left = [], n
    while left:
        chunk = os.read(0, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the job ended early")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def read_public():
    # Byte by byte up to the newline, then exactly the length: nothing of the secret part
    # that follows may be read (and so sit in memory) before the solution's process forks.
    head = b""
    while not head.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte or len(head) > 20:
            raise EOFError("no job")
        head += byte
    return json.loads(read_exact(int(head)))


def read_secret():
    parts = []
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        parts.append(chunk)
    erase_stdin()
    return json.loads(b"".join(parts))


def erase_stdin():
    """Empty the file behind stdin before the model's code runs. The harness is undumpable,
    so no other process can reopen it through /proc/<harness>/fd/0; this is the second lock
    (a jail whose init held fds 0-2, as bubblewrap's does without --as-pid-1, would leak it)."""
    try:
        fd = os.open("/proc/self/fd/0", os.O_WRONLY)
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)
    except OSError:
        pass  # a pipe, or not ours to truncate: nothing left to read there either way


def kill_the_rest():
    """Kill every other process in the jail before the verdict is written, so none (a
    daemon the solution left) can tamper with it. Only where this process is the first of
    a PID namespace of its own (bubblewrap --as-pid-1: pid 1; under a bwrap init: pid 2,
    parent 1): elsewhere kill(-1) would reach the host's processes."""
    if os.getpid() != 1 and (os.getpid() != 2 or os.getppid() != 1):
        return
    try:
        os.kill(-1, signal.SIGKILL)  # in a PID namespace: all but init and ourselves
    except OSError:
        pass


def out_of_reach():
    """Keep the solution's files away from this process's imports: the cwd (the jail's
    writable /sandbox, PROGRAM_CWD) becomes the read-only root, and no directory the solution
    could write stays on sys.path (so nothing it leaves there can shadow what the prompt or
    test imports). The solution's processes go back to PROGRAM_CWD."""
    try:
        os.chdir("/")
    except OSError:
        pass
    # In the jail (bubblewrap sets ARLE_SANDBOX_NET to one of these) only the three tmpfs
    # mounts are writable, and access() says which. A degraded run, as a plain child, has no
    # such line to draw (as root everything is writable): it contains accidents only.
    if os.environ.get("ARLE_SANDBOX_NET") in ("namespaces", "host"):
        sys.path[:] = [p for p in sys.path if p and not os.access(p, os.W_OK)]
        sys.path_importer_cache.clear()


def main():
    verdict_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints (the test's, the prompt's) must not crowd the verdict
    make_undumpable()
    sys.dont_write_bytecode = True
    out_of_reach()
    secret = None
    try:
        job = read_public()
        if job["mode"] == "io":
            verdict = run_io(job)
        else:
            verdict, secret = run_solution(job, read_secret)
    except BaseException as exc:  # a verdict even when the harness itself breaks
        verdict = {"passed": 0, "total": 1, "failure": {"kind": "harness_error", "message": clip(repr(exc))}}
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    kill_the_rest()
    try:
        secret = secret or read_secret()  # io mode: only now, after every child is gone
        line = "\n" + secret["marker"] + json.dumps(verdict) + "\n"
        os.write(verdict_fd, line.encode("ascii"))
    finally:
        os._exit(0)  # no atexit handlers or lingering threads


if __name__ == "__main__":
    # Set when the program runs, not on import (the host imports this module for its helpers).
    LIBC = ctypes.CDLL(None, use_errno=True)
    PROGRAM_CWD = os.getcwd()  # the jail's /sandbox: where the model's code runs
    main()
