"""Rollout engines. `make_engine` picks the backend for a resolved model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from arlecli.engine.base import Completion, Engine, GenerationRequest, SamplingParams
from arlecli.errors import UserError

if TYPE_CHECKING:
    from arlecli.models import ModelSpec

__all__ = ["Completion", "Engine", "GenerationRequest", "SamplingParams", "make_engine"]


def make_engine(spec: ModelSpec, *, batch_size: int = 16, concurrency: int = 8) -> Engine:
    """Build the engine for `spec`: an endpoint gets `openai`, weights get `hf` (vllm: later)."""
    if spec.kind == "openai":
        from arlecli.engine.openai import OpenAIEngine

        return OpenAIEngine(spec.base_url or "", spec.model, api_key_env=spec.api_key_env, concurrency=concurrency)
    backend = spec.backend or "hf"
    if backend == "vllm":
        raise UserError("the vllm backend is not available in this version yet; use --backend hf")
    from arlecli.engine.hf import HFEngine

    return HFEngine(spec.path_or_id or "", batch_size=batch_size)
