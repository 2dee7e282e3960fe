"""What every perf script records about the machine it ran on (imported by the scripts in perf/)."""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows (may be empty)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


def package_versions(packages: tuple[str, ...]) -> dict[str, str]:
    """Python's version and each installed package's (missing ones are left out)."""
    versions = {"python": platform.python_version()}
    for pkg in packages:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return versions


def perf_model(quick: bool, work: Path, model: str | None = None) -> tuple[str, str]:
    """(path, display name) of the model a script runs: `model` when given, else the tests'
    tiny model (built under `work`) for --quick, else the embedded SmolLM2-135M-Instruct."""
    if model:
        return model, model
    if quick:
        sys.path.insert(0, str(ROOT / "tests"))
        from helpers.tiny_model import build_tiny_model

        return str(build_tiny_model(work / "tiny-model")), "tiny Qwen2 test model (random weights)"
    from arlecli.models import EMBEDDED_NAME, embedded_default_model

    return str(embedded_default_model()), EMBEDDED_NAME


def write_result(result: dict, out: Path, work: Path, keep: bool) -> None:
    """Write a script's result JSON to `out`, then remove its scratch dir `work` unless `keep`."""
    import json
    import shutil

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nwrote {out}" + (f"; run directories in {work}" if keep else ""))
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
