"""`arle model ...`: set up, list, show and remove named model profiles.

Profiles are stored by arlecli.config; an API key is never stored, only the name of the
environment variable that holds it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer
from rich.table import Table

from arlecli import config, efficiency
from arlecli.cli import options
from arlecli.cli.output import make_console
from arlecli.errors import UserError

app = typer.Typer(help="Set up and manage named models (local folders, hub ids, endpoints).", no_args_is_help=True)


def stdin_is_tty() -> bool:
    """Whether stdin is a terminal (the model prompt asks only there)."""
    # A function so tests can drive the interactive path.
    return sys.stdin.isatty()


def _print_table(table: Table) -> None:
    console = make_console(highlight=False)  # profile fields are shown with control characters escaped
    if console.is_terminal:
        console.print(table)
        return
    # In a pipe or a log: no colour, no folding of long paths at 80 columns, no padding at
    # line ends, so grep/awk see one whole record per line.
    plain = make_console(highlight=False, width=1000, no_color=True)
    with plain.capture() as captured:
        plain.print(table)
    for line in captured.get().splitlines():
        typer.echo(line.rstrip())


def _profile_json(profile: config.ModelProfile, default: str | None) -> dict:
    return {
        "name": profile.name,
        "kind": profile.kind,
        "location": profile.location,
        **profile.to_dict(),
        "default": profile.name == default,
    }


def _api_key_status(env_name: str) -> str:
    # Say whether the variable is set; never read out its value.
    if os.environ.get(env_name):
        return f"read from ${env_name} (set now)"
    return f"read from ${env_name} (not set now: export {env_name}=... before use)"


def _print_profile(profile: config.ModelProfile, default: str | None) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    table.add_row("name", profile.name + ("  (default)" if profile.name == default else ""))
    table.add_row("kind", profile.kind)
    table.add_row({"path": "path", "hub": "hub id", "endpoint": "base url"}[profile.kind], profile.location)
    if profile.kind == "endpoint":
        table.add_row("model", profile.model or "(asked from the endpoint)")
        table.add_row("api key", _api_key_status(profile.api_key_env) if profile.api_key_env else "none")
        timeout, retries = profile.request_timeout, profile.max_retries
        table.add_row(
            "request timeout",
            f"{timeout:g} s" if timeout is not None else f"{config.DEFAULT_REQUEST_TIMEOUT_S:g} s (default)",
        )
        table.add_row("max retries", str(retries) if retries is not None else f"{config.DEFAULT_MAX_RETRIES} (default)")
    table.add_row("backend", profile.backend or "auto")
    if profile.price_input is not None and profile.price_output is not None:
        table.add_row("prices", f"${profile.price_input:g} in / ${profile.price_output:g} out per 1M tokens")
    table.add_row("think tags", profile.think_tags or "auto (the tokenizer's own, else <think>,</think>)")
    if profile.chat_template_kwargs:
        switches = profile.chat_template_kwargs.items()
        table.add_row("chat template", " ".join(f"{k}={json.dumps(v)}" for k, v in switches))
    _print_table(table)


def _ask_missing(
    name: str | None,
    path: str | None,
    hub_id: str | None,
    base_url: str | None,
    model: str | None,
    api_key_env: str | None,
) -> tuple[str, str | None, str | None, str | None, str | None, str | None]:
    """Prompt for what `setup` needs and was not given (TTY only)."""
    needs_source = not (path or hub_id or base_url)
    if not name or needs_source:
        if not stdin_is_tty():
            if not name:
                raise UserError("arle model setup needs a profile name: pass --name NAME")
            raise UserError(
                "arle model setup needs a model: pass one of --path DIR, --hub-id ORG/NAME or --base-url URL"
            )
    from rich.prompt import Prompt

    if not name:
        name = Prompt.ask("Profile name")
    if needs_source:
        kind = Prompt.ask("Where is the model", choices=["path", "hub", "endpoint"], default="hub")
        if kind == "path":
            path = Prompt.ask("Local model folder")
        elif kind == "hub":
            hub_id = Prompt.ask("Hub id (org/name)")
        else:
            base_url = Prompt.ask("Endpoint base URL", default="http://localhost:8000/v1")
            model = model or Prompt.ask("Served model name (empty: ask the endpoint)", default="") or None
            api_key_env = (
                api_key_env or Prompt.ask("Name of the env var holding the API key (empty: none)", default="") or None
            )
    return name, path, hub_id, base_url, model, api_key_env


@app.command()
def setup(
    name: str | None = typer.Option(None, "--name", help="Profile name, e.g. my-qwen."),
    path: str | None = typer.Option(None, "--path", help="A local model folder."),
    hub_id: str | None = typer.Option(None, "--hub-id", help="A hub id, e.g. Qwen/Qwen2.5-0.5B-Instruct."),
    base_url: str | None = typer.Option(
        None, "--base-url", help="An OpenAI-compatible endpoint, e.g. http://localhost:8000/v1."
    ),
    model: str | None = typer.Option(
        None, "--model", help="Served model name at --base-url (default: ask the endpoint)."
    ),
    api_key_env: str | None = typer.Option(
        None,
        "--api-key-env",
        help="NAME of the env var holding the endpoint's API key (the key itself is never stored).",
    ),
    backend: str | None = typer.Option(None, "--backend", help="hf, vllm or openai (default: automatic)."),
    request_timeout: str | None = options.REQUEST_TIMEOUT,
    max_retries: str | None = options.MAX_RETRIES,
    price_input: str | None = options.PRICE_INPUT,
    price_output: str | None = options.PRICE_OUTPUT,
    think_tags: str | None = options.THINK_TAGS,
    chat_template_kwargs: list[str] | None = options.CHAT_TEMPLATE_KWARGS,
    default: bool = typer.Option(False, "--default", help="Use this profile when --model is not given."),
) -> None:
    """Save a named model profile (asks for what is missing when run in a terminal)."""
    # Checked before any prompt: a bad number should not cost the user an interactive session.
    timeout_s = config.check_request_timeout(request_timeout)
    retries = config.check_max_retries(max_retries)
    prices = (
        efficiency.check_price(price_input, "--price-input"),
        efficiency.check_price(price_output, "--price-output"),
    )
    efficiency.make_prices(*prices, "arle model setup")
    template_kwargs = config.parse_template_kwargs(chat_template_kwargs) or None
    if think_tags is not None:
        from arlecli.thinking import parse_option

        parse_option(think_tags)
    name, path, hub_id, base_url, model, api_key_env = _ask_missing(name, path, hub_id, base_url, model, api_key_env)
    replaced = name in config.load_profiles()
    profile = config.save_profile(
        config.ModelProfile(
            name=name,
            path=path,
            hub_id=hub_id,
            base_url=base_url,
            model=model,
            api_key_env=api_key_env,
            backend=backend,
            request_timeout=timeout_s,
            max_retries=retries,
            price_input=prices[0],
            price_output=prices[1],
            think_tags=think_tags,
            chat_template_kwargs=template_kwargs,
        ),
        make_default=default,
    )
    typer.echo(f"{'replaced' if replaced else 'saved'} profile {profile.name} in {config.profiles_path()}")
    if profile.path and not any((Path(profile.path) / f).is_file() for f in config.MODEL_CONFIG_FILES):
        typer.echo(
            f"note: {profile.path} holds no config.json (nor adapter_config.json) yet: `arle eval` will refuse it "
            "until a model is there",
            err=True,
        )
    _print_profile(profile, config.default_profile_name())


@app.command("list")
def list_profiles(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the saved model profiles."""
    profiles = config.load_profiles()
    default = config.default_profile_name()
    if json_out:
        typer.echo(json.dumps([_profile_json(p, default) for _, p in sorted(profiles.items())], indent=2))
        return
    if not profiles:
        typer.echo(
            "no model profiles yet: add one with `arle model setup` "
            "(without one, --model defaults to the embedded SmolLM2-135M-Instruct)"
        )
        return
    table = Table("name", "kind", "location", "backend", "default", box=None, pad_edge=False)
    for name, profile in sorted(profiles.items()):
        table.add_row(name, profile.kind, profile.location, profile.backend or "auto", "yes" if name == default else "")
    _print_table(table)


@app.command()
def show(
    name: str = typer.Argument(..., help="Profile name."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one model profile."""
    profile = config.get_profile(name)
    default = config.default_profile_name()
    if json_out:
        data = _profile_json(profile, default)
        if profile.api_key_env:
            data["api_key_env_set"] = bool(os.environ.get(profile.api_key_env))
        typer.echo(json.dumps(data, indent=2))
        return
    _print_profile(profile, default)


@app.command()
def remove(name: str = typer.Argument(..., help="Profile name.")) -> None:
    """Delete a model profile."""
    was_default = config.remove_profile(name)
    typer.echo(f"removed profile {name}" + (" (it was the default; none is set now)" if was_default else ""))


@app.command("default")
def default_cmd(
    name: str | None = typer.Argument(None, help="Profile to use when --model is not given."),
    unset: bool = typer.Option(False, "--unset", help="Clear the default (use the embedded model)."),
) -> None:
    """Show or set the default model profile."""
    if unset:
        config.set_default(None)
        typer.echo("no default profile: --model defaults to the embedded SmolLM2-135M-Instruct")
    elif name:
        config.set_default(name)
        typer.echo(f"default profile: {name}")
    else:
        current = config.default_profile_name()
        typer.echo(current or "none (the embedded SmolLM2-135M-Instruct)")
