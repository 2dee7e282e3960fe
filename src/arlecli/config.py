"""User settings: where arle keeps its files, and named model profiles.

Profiles live in `<arle_home>/models.yaml`:

    default: local-qwen
    profiles:
      local-qwen: {hub_id: Qwen/Qwen2.5-0.5B-Instruct, backend: hf}
      my-server:  {base_url: http://localhost:8000/v1, model: qwen, api_key_env: MY_KEY,
                   request_timeout: 120, max_retries: 2, price_input: 0.15, price_output: 0.6}
      qwen3:      {hub_id: Qwen/Qwen3-0.6B, think_tags: "<think>,</think>",
                   chat_template_kwargs: {enable_thinking: false}}

An API key is never written anywhere: a profile stores only the NAME of the environment
variable that holds it, and the engine reads the variable when it connects.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from arlecli import safeio
from arlecli.efficiency import check_price, make_prices
from arlecli.errors import UserError, near_names

PROFILES_FILE = "models.yaml"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+$")

# An endpoint's limits when neither the command line nor the profile sets them. 600 s is
# OpenAI's own client default: a long generation on a busy server can take minutes.
DEFAULT_REQUEST_TIMEOUT_S = 600.0
DEFAULT_MAX_RETRIES = 5
# A day: beyond it a "timeout" is no limit at all (and overflows some socket APIs).
MAX_REQUEST_TIMEOUT_S = 86400.0
# Backoff doubles per retry; more than this would only park a run for days.
MAX_MAX_RETRIES = 100


def arle_home() -> Path:
    """The directory for arle's settings: $ARLE_HOME, else the platform's user config dir."""
    env = os.environ.get("ARLE_HOME")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_config_dir

    return Path(user_config_dir("arle"))


def cache_dir() -> Path:
    """The directory for regenerable files (converted models): $ARLE_HOME/cache, else the user cache dir."""
    env = os.environ.get("ARLE_HOME")
    if env:
        return Path(env).expanduser() / "cache"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("arle"))


def env_count(name: str, default: int, fix: str) -> int:
    """A whole number >= 0 from environment variable `name` (unset or blank: `default`); any
    other value is a UserError that ends with `fix` (what to set it to)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise UserError(f"{name}={raw!r}: {fix}")
    return value


def profiles_path() -> Path:
    """The YAML file that holds the model profiles."""
    return arle_home() / PROFILES_FILE


@dataclass
class ModelProfile:
    """A named model: a local folder, a hub id, or an OpenAI-compatible endpoint (exactly one)."""

    name: str
    path: str | None = None  # local model folder (stored absolute)
    hub_id: str | None = None  # e.g. Qwen/Qwen2.5-0.5B-Instruct
    base_url: str | None = None  # OpenAI-compatible endpoint, e.g. http://localhost:8000/v1
    model: str | None = None  # served model name at base_url; None: ask the endpoint
    api_key_env: str | None = None  # NAME of the env var holding the key, never the key
    backend: str | None = None  # "hf" | "openai" | "vllm"; None: chosen automatically
    request_timeout: float | None = None  # endpoint: seconds for one whole attempt; None: the default
    max_retries: int | None = None  # endpoint: retries after a failed attempt; None: the default
    price_input: float | None = None  # USD per 1M prompt tokens (results.json's cost block); None: no cost
    price_output: float | None = None  # USD per 1M completion tokens; set with price_input or not at all
    think_tags: str | None = None  # START,END or none (thinking.parse_option); None: from the tokenizer
    chat_template_kwargs: dict[str, Any] | None = None  # the chat template's switches (enable_thinking: false)

    @property
    def kind(self) -> str:
        """ "path", "hub" or "endpoint"."""
        if self.base_url:
            return "endpoint"
        return "path" if self.path else "hub"

    @property
    def location(self) -> str:
        """The folder, hub id or URL this profile points at."""
        return self.base_url or self.path or self.hub_id or ""

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, without the name (it is the YAML key)."""
        return {k: v for k, v in asdict(self).items() if v is not None and k != "name"}


def validate_profile(profile: ModelProfile) -> ModelProfile:
    """Check a profile and return it normalised (absolute path, no trailing slash on the URL)."""
    if not _NAME_RE.match(profile.name or ""):
        raise UserError(
            f"invalid profile name {profile.name!r}: use letters, digits, '.', '_' or '-' "
            "(up to 64, starting with a letter or digit), e.g. --name my-model"
        )
    sources = [
        flag
        for flag, value in (("--path", profile.path), ("--hub-id", profile.hub_id), ("--base-url", profile.base_url))
        if value
    ]
    if len(sources) != 1:
        got = "none" if not sources else " and ".join(sources)
        raise UserError(f"profile {profile.name!r} needs exactly one of --path, --hub-id or --base-url (got {got})")
    if profile.backend is not None:
        from arlecli.backends import check_backend  # arle's backends and any a package registers

        check_backend(profile.backend)

    if profile.path:
        path = Path(profile.path).expanduser().resolve()
        if path.is_file():
            raise UserError(f"--path {profile.path}: a file, not a folder (pass the model's folder)")
        if not path.is_dir():
            raise UserError(f"--path {profile.path}: no such folder (pass a local model folder)")
        _check_model_folder(path, profile.path)
        profile.path = str(path)
    if profile.hub_id and not HUB_ID_RE.match(profile.hub_id):
        raise UserError(
            f"--hub-id {profile.hub_id!r} is not a hub id: pass it as org/name, e.g. Qwen/Qwen2.5-0.5B-Instruct"
        )
    if profile.base_url:
        profile.base_url = _check_base_url(profile.base_url)
        if profile.backend not in (None, "openai"):
            raise UserError(f"--base-url is served through the openai backend, not {profile.backend!r}: drop --backend")
    else:
        if profile.backend == "openai":
            raise UserError("--backend openai needs --base-url (the endpoint to talk to)")
        if profile.model:
            raise UserError("--model (the served model name) only applies with --base-url")
        if profile.api_key_env:
            raise UserError("--api-key-env only applies with --base-url")
        if profile.request_timeout is not None or profile.max_retries is not None:
            raise UserError("--request-timeout and --max-retries only apply with --base-url")
    profile.request_timeout = check_request_timeout(profile.request_timeout)
    profile.max_retries = check_max_retries(profile.max_retries)
    profile.price_input = check_price(profile.price_input, "--price-input")
    profile.price_output = check_price(profile.price_output, "--price-output")
    make_prices(profile.price_input, profile.price_output, f"profile {profile.name!r}")
    if profile.think_tags is not None:
        from arlecli.thinking import parse_option

        parse_option(profile.think_tags)
    profile.chat_template_kwargs = parse_template_kwargs(profile.chat_template_kwargs) or None
    if profile.api_key_env and not _ENV_NAME_RE.match(profile.api_key_env):
        # Also catches a pasted key ("sk-..."): we never want the value on disk.
        raise UserError(
            "--api-key-env takes the NAME of an environment variable (e.g. OPENAI_API_KEY), not the key itself"
        )
    return profile


_KWARG_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_template_kwargs(value: Any, what: str = "--chat-template-kwargs") -> dict[str, Any]:
    """Chat-template switches as a dict: from KEY=VALUE strings (the command line, repeatable;
    a VALUE is a YAML scalar, so `enable_thinking=false` is False) or a mapping (a profile, a
    recipe). A key that is no template variable name is a UserError naming `what`; whether
    the model's template reads it is checked when the model loads (engine.tokens)."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = [value]
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [_template_kwarg(v, what) for v in value]
    else:
        raise UserError(f"{what} must be KEY=VALUE items or a mapping, e.g. enable_thinking=false (got {value!r})")
    for key, _ in items:
        if not isinstance(key, str) or not _KWARG_RE.match(key):
            raise UserError(
                f"{what}: {key!r} is not a template variable name (letters, digits and '_'), e.g. enable_thinking=false"
            )
    return dict(items)


def _template_kwarg(item: str, what: str) -> tuple[str, Any]:
    import yaml

    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise UserError(f"{what} {item!r}: write KEY=VALUE, e.g. enable_thinking=false")
    try:
        return key.strip(), safeio.load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        return key.strip(), raw  # not YAML (an unbalanced bracket): the plain string


def check_request_timeout(value: Any, what: str = "--request-timeout") -> float | None:
    """`value` as seconds for one whole request to an endpoint (None stays None).

    Anything but a finite number above 0 and at most a day is a UserError naming `what`."""
    if value is None:
        return None
    number = _number(value)
    if number is None or not math.isfinite(number) or not 0 < number <= MAX_REQUEST_TIMEOUT_S:
        raise UserError(
            f"{what} must be a number of seconds above 0 and at most {MAX_REQUEST_TIMEOUT_S:g} "
            f"(got {value!r}), e.g. --request-timeout 120"
        )
    return number


def check_max_retries(value: Any, what: str = "--max-retries") -> int | None:
    """`value` as a retry count for endpoint requests (None stays None); a UserError naming `what`
    unless it is a whole number from 0 to MAX_MAX_RETRIES."""
    if value is None:
        return None
    number = _number(value)
    if number is None or number != int(number) or not 0 <= number <= MAX_MAX_RETRIES:
        raise UserError(
            f"{what} must be a whole number from 0 to {MAX_MAX_RETRIES} (got {value!r}), e.g. --max-retries 2"
        )
    return int(number)


def _number(value: Any) -> float | None:
    # The CLI passes its text through: typer's own parse error would be a usage screen, not a line.
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    # bool is an int to Python, but `max_retries: true` in a YAML file is a mistake.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an int too big for a float
        return math.inf


MODEL_CONFIG_FILES = ("config.json", "adapter_config.json")  # a model folder, or a LoRA adapter's


def _check_model_folder(path: Path, given: str) -> None:
    """UserError when the folder's config.json (or a LoRA adapter's adapter_config.json) is not
    JSON: caught when the profile is saved, not at the first eval. A folder without either is
    saved (a checkpoint may land there later); `arle model setup` says so."""
    import json

    for name in MODEL_CONFIG_FILES:
        if (path / name).is_file():
            try:
                json.loads(safeio.read_text(path / name, "model config"))
            except ValueError as exc:
                raise UserError(f"--path {given}: {name} is not valid JSON ({exc}): fix the folder") from None


def _check_base_url(url: str) -> str:
    parsed = urlparse(url)
    if parsed.password or parsed.username or parsed.query or parsed.fragment:
        # A key inside the URL (user:key@, ?api_key=) would end up in models.yaml in clear text and
        # in every error naming the endpoint; and arle appends /models, /chat/completions to it.
        raise UserError(
            "--base-url must be the API's base, without credentials, a query (?...) or a fragment (#...): "
            "put a key in an env var and pass --api-key-env NAME"
        )
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UserError(f"--base-url {url!r} is not an http(s) URL: pass e.g. http://localhost:8000/v1")
    return url.rstrip("/")


_NUMERIC_FIELDS = ("request_timeout", "max_retries", "price_input", "price_output")
_MAPPING_FIELDS = ("chat_template_kwargs",)


def _read() -> tuple[dict[str, ModelProfile], str | None]:
    path = profiles_path()
    if not path.exists():
        return {}, None
    import yaml

    text = safeio.read_text(path, "model profiles file")
    try:
        # Aliases and deep nesting are refused (safeio): a hand-edited profile cannot expand to gigabytes.
        data = safeio.load_yaml(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        why = "; ".join(filter(None, [f"line {mark.line + 1}" if mark else "", getattr(exc, "problem", None)]))
        raise UserError(
            f"{path}: not valid YAML{f' ({why})' if why else ''}: fix the file or "
            f"delete it and rerun `arle model setup`"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("profiles", {}), dict):
        raise UserError(f"{path}: expected `default:` and a `profiles:` mapping: fix the file or delete it")
    profiles = {}
    fields = set(ModelProfile.__dataclass_fields__) - {"name"}
    for name, entry in (data.get("profiles") or {}).items():
        if not isinstance(entry, dict) or set(entry) - fields:
            unknown = sorted(set(entry) - fields) if isinstance(entry, dict) else []
            raise UserError(
                f"{path}: profile {name!r} is malformed{f' (unknown keys {unknown})' if unknown else ''}: "
                f"fix it or run `arle model remove {name}`"
            )
        values: dict[str, Any] = {
            k: (None if v is None or k in _NUMERIC_FIELDS + _MAPPING_FIELDS else str(v)) for k, v in entry.items()
        }
        try:
            # Numbers stay numbers; a hand-edited bad value is named with its file and profile.
            values["request_timeout"] = check_request_timeout(entry.get("request_timeout"), "request_timeout")
            values["max_retries"] = check_max_retries(entry.get("max_retries"), "max_retries")
            values["price_input"] = check_price(entry.get("price_input"), "price_input")
            values["price_output"] = check_price(entry.get("price_output"), "price_output")
            make_prices(values["price_input"], values["price_output"], "it")
            values["chat_template_kwargs"] = (
                parse_template_kwargs(entry.get("chat_template_kwargs"), "chat_template_kwargs") or None
            )
            from arlecli.thinking import parse_option

            parse_option(values.get("think_tags"), "think_tags")
        except UserError as exc:
            raise UserError(f"{path}: profile {name!r}: {exc}") from None
        profiles[str(name)] = ModelProfile(name=str(name), **values)
    default = data.get("default")
    return profiles, (str(default) if default is not None else None)


def _write(profiles: dict[str, ModelProfile], default: str | None) -> None:
    import yaml

    home = arle_home()
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"cannot write arle's settings folder {home} ({exc.strerror}): set ARLE_HOME to a writable folder"
        ) from None
    text = yaml.safe_dump(
        {"default": default, "profiles": {n: p.to_dict() for n, p in sorted(profiles.items())}},
        sort_keys=False,
    )
    # mkstemp creates the file 0600 before any byte is written; fchmod pins it against
    # odd umasks. os.replace makes the swap atomic: a reader sees the old or the new file.
    fd, tmp = tempfile.mkstemp(dir=home, prefix=f".{PROFILES_FILE}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, profiles_path())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_profiles() -> dict[str, ModelProfile]:
    """All saved profiles by name (empty when none are set up)."""
    return _read()[0]


def default_profile_name() -> str | None:
    """The name of the default profile, or None."""
    profiles, default = _read()
    return default if default in profiles else None


def default_profile() -> ModelProfile | None:
    """The default profile, or None when no default is set."""
    profiles, default = _read()
    return profiles.get(default) if default else None


def unknown_profile_error(name: str, names: list[str] | None = None) -> UserError:
    """A UserError for an unknown profile name that suggests near names."""
    names = sorted(load_profiles()) if names is None else names
    close = near_names(name, names)
    if close:
        hint = f"did you mean {', '.join(close)}?"
    elif names:
        hint = f"profiles: {', '.join(names)}"
    else:
        hint = "no profiles yet: add one with `arle model setup`"
    return UserError(f"unknown model profile {name!r}: {hint}")


def get_profile(name: str) -> ModelProfile:
    """The profile called `name`; a UserError that suggests near names when there is none."""
    profiles = load_profiles()
    if name not in profiles:
        raise unknown_profile_error(name, sorted(profiles))
    return profiles[name]


def save_profile(profile: ModelProfile, make_default: bool = False) -> ModelProfile:
    """Validate and save `profile` (replacing one with the same name); return it normalised."""
    profile = validate_profile(profile)
    profiles, default = _read()
    profiles[profile.name] = profile
    _write(profiles, profile.name if make_default else default)
    return profile


def remove_profile(name: str) -> bool:
    """Delete a profile; return True when it was the default (which is then unset)."""
    profiles, default = _read()
    if name not in profiles:
        raise unknown_profile_error(name, sorted(profiles))
    del profiles[name]
    was_default = default == name
    _write(profiles, None if was_default else default)
    return was_default


def set_default(name: str | None) -> None:
    """Make `name` the default profile (None: no default, use the embedded model)."""
    profiles, _ = _read()
    if name is not None and name not in profiles:
        raise unknown_profile_error(name, sorted(profiles))
    _write(profiles, name)
