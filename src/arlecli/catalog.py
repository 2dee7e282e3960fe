"""The benchmark catalog: finding cards (a path, the user's dir, entry points, then the packaged
cards).

Search order for a name (first wins, so a user can shadow a packaged card):
1. a path to a `.yaml` file given on the command line;
2. `<ARLE_HOME>/benchmarks/*.yaml` (the user's own cards);
3. entry points in group `arle.benchmarks`: `name = "package"` or `"package:subdir"`, a
   folder of card files shipped by another Python package;
4. the cards packaged with arle (`benchmarks/` in the repo, `arlecli.benchmarks` installed).

The code a card names (reward, env, tools, transform, generator, rollout function) is found by
arlecli/plugins.py; `part_origins` says where each part of a card came from. Loading a card
holds what it names to the plugins' declarations (`check_declared`: reward params, metrics);
`resolve_references` checks, before a run, that everything it names exists. This module is
the one card module above envs, rewards and data (cards.py below them is plain data).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from arlecli.cards import Card, card_error, read_card_file
from arlecli.errors import ParamError, UserError, near_names

ENTRY_POINT_GROUP = "arle.benchmarks"


def load_card_file(path: Path) -> Card:
    """Read, parse and validate one card file: its structure (cards.read_card_file), then
    its reward params and metrics against the reward's declaration."""
    card = read_card_file(path)
    check_declared(card, path)
    return card


def _dir_cards(folder: Path) -> dict[str, Path]:
    if not folder.is_dir():
        return {}
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def _entry_point_dirs() -> list[Path]:
    return [d for d, _ in _entry_point_dirs_with_origin()]


def _entry_point_dirs_with_origin() -> list[tuple[Path, str]]:
    dirs = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        package, _, sub = ep.value.partition(":")
        try:
            base = Path(str(resources.files(package)))
        except (ModuleNotFoundError, TypeError) as exc:
            raise UserError(
                f"entry point '{ep.name}' in group {ENTRY_POINT_GROUP} names '{ep.value}', "
                f"which cannot be imported ({exc}); fix or uninstall that package"
            ) from None
        dist = getattr(ep, "dist", None)
        package = f" from {dist.name} {dist.version}" if dist is not None else ""
        dirs.append((base / sub if sub else base, f"entry point {ENTRY_POINT_GROUP} '{ep.name} = {ep.value}'{package}"))
    return dirs


def packaged_dir() -> Path:
    """The folder of cards that ship with arle."""
    return Path(str(resources.files("arlecli.benchmarks")))


def card_paths() -> dict[str, Path]:
    """Every known card name mapped to its file, by search order (first wins)."""
    from arlecli.config import arle_home

    found: dict[str, Path] = {}
    for folder in [arle_home() / "benchmarks", *_entry_point_dirs(), packaged_dir()]:
        for name, path in _dir_cards(folder).items():
            found.setdefault(name, path)
    return found


def load_card(name_or_path: str) -> Card:
    """Load a card by name or by path; unknown names suggest near ones."""
    if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
        path = Path(name_or_path)
        if not path.is_file():
            raise UserError(f"card file {path} does not exist")
        return load_card_file(path)
    paths = card_paths()
    if name_or_path not in paths:
        near = near_names(name_or_path, paths)
        hint = f"; did you mean {' or '.join(near)}?" if near else ""
        raise UserError(f"unknown benchmark '{name_or_path}'{hint} (see `arle bench list`)")
    return _load_named(name_or_path, paths[name_or_path])


def _load_named(name: str, path: Path) -> Card:
    card = load_card_file(path)
    if card.name != name:
        raise UserError(f"{card.path}: field 'name': '{card.name}' must match the file name '{name}'")
    return card


def list_cards() -> list[Card]:
    """All known cards, parsed and validated, sorted by name; the first broken one raises."""
    return sorted((load_card_file(p) for p in card_paths().values()), key=lambda c: c.name)


@dataclass
class BrokenCard:
    """A card file that does not load: its name (the file's stem), file and the one-line reason."""

    name: str
    path: Path
    reason: str


def scan_cards() -> tuple[list[Card], list[BrokenCard]]:
    """Every known card, sorted by name, and the broken ones apart, so that one bad file in
    `$ARLE_HOME/benchmarks` hides nothing else from `arle bench list`."""
    cards, broken = [], []
    for name, path in card_paths().items():
        try:
            cards.append(_load_named(name, path))
        except UserError as exc:
            broken.append(BrokenCard(name, path, str(exc)))
    return sorted(cards, key=lambda c: c.name), sorted(broken, key=lambda b: b.name)


def card_origin(path: Path) -> str:
    """Where the card file `path` was found: the user's dir, a package's entry point, arle's
    own cards, or a path given on the command line."""
    from arlecli.config import arle_home

    folder = path.resolve().parent
    if folder == (arle_home() / "benchmarks").resolve():
        return f"$ARLE_HOME/benchmarks ({path})"
    for ep_dir, origin in _entry_point_dirs_with_origin():
        if folder == ep_dir.resolve():
            return f"{origin} ({path})"
    if folder == packaged_dir().resolve():
        return f"builtin ({path})"
    return f"path {path}"


def part_origins(card: Card) -> dict[str, str]:
    """Where each part of `card` comes from: {"card": ..., "reward": "builtin arlecli.rewards.math",
    "env": ..., "tools.python": ..., "transform": ..., "generator": ..., "rollout": ...}.
    A part that does not load says why instead."""
    from arlecli.data.generators import GENERATORS, find_generator
    from arlecli.data.transforms import TRANSFORMS
    from arlecli.envs import ENVS
    from arlecli.envs.tools import TOOLS
    from arlecli.rewards import REWARDS
    from arlecli.agent import ROLLOUTS

    base = card.path.parent if card.path is not None else None

    def where(registry: Any, spec: str) -> str:
        try:
            return str(registry.origin(spec, base))
        except UserError as exc:
            return f"not found: {exc}"

    out = {
        "card": card_origin(card.path) if card.path is not None else "(not from a file)",
        "reward": where(REWARDS, card.reward),
        "env": where(ENVS, card.env),
    }
    tools = card.env_params.get("tools")
    if isinstance(tools, list):
        out.update({f"tools.{t}": where(TOOLS, str(t)) for t in tools})
    function = card.env_params.get("function")
    if isinstance(function, str) and card.env == "rollout":
        out["rollout"] = where(ROLLOUTS, function)
    if card.transform:
        out["transform"] = where(TRANSFORMS, card.transform)
    if card.loglikelihood is not None and card.loglikelihood.transform:
        out["loglikelihood.transform"] = where(TRANSFORMS, card.loglikelihood.transform)
    if card.source.kind == "generator":
        try:
            _, member = find_generator(card.source.path, base)
            head = card.source.path.partition(":")[0] if member is not None else card.source.path
            out["generator"] = where(GENERATORS, head)
        except UserError as exc:
            out["generator"] = f"not found: {exc}"
    return out


def check_declared(card: Card, path: Path | str) -> None:
    """Hold the card's reward params and metrics to what the reward declares (its factory's
    signature, its `metrics=`).

    Done on every card loaded (listing cards too). An unknown reward name is left to
    `resolve_references`, which reports it with near names, and so is a reward named by
    "module:attr" or "file.py:attr" (listing cards runs no user code)."""
    from arlecli.rewards import check_params

    if ":" in card.reward:
        return
    try:
        check_params(card.reward, card.reward_params)
    except ParamError as exc:
        raise card_error(path, f"reward.params.{exc.param}", exc.reason) from None
    except UserError:
        return
    _check_metrics(card, path)


def _check_metrics(card: Card, path: Path | str) -> None:
    """Each of the card's `metrics` must be one its reward declares (or accuracy, pass@k):
    aggregation reads a missing one as 0.0, so a typo would pass unnoticed."""
    from arlecli.rewards import declared_metrics, reward_factory, reward_metrics, unknown_metrics

    bad = unknown_metrics(card.reward, card.reward_params, card.metrics)
    if not bad:
        return
    metric, near = bad[0]
    hint = f"did you mean '{near[0]}'? " if near else ""
    known = ", ".join([*reward_metrics(card.reward, card.reward_params), "pass@k"])
    how = (
        ""
        if declared_metrics(reward_factory(card.reward)) is not None
        else " (a reward declares more with @register(..., metrics=[...]))"
    )
    raise card_error(
        path, "metrics", f"reward '{card.reward}' does not report '{metric}'; {hint}it reports: {known}{how}"
    )


def _check_env_params(card: Card, where: Path | str) -> None:
    """The card's env params, held to its env kind's own check (the tools a `tools` env names,
    the function a `rollout` env names, a `textarena` env's game), so a typo fails at load
    with the near name, not at the first episode."""
    from arlecli.envs import env_kind

    check = env_kind(card.env).check
    if check is None:
        return
    try:
        check(card.env_params, card.path.parent if card.path is not None else None)
    except ParamError as exc:
        raise card_error(where, f"env.params.{exc.param}", exc.reason) from None
    except UserError as exc:
        raise card_error(where, "env.params", str(exc)) from None
    except Exception as exc:  # a plugin's check with a bug: still one line, naming the env
        raise card_error(
            where, "env.params", f"env '{card.env}' could not check its params: {type(exc).__name__}: {exc}"
        ) from None


def resolve_references(card: Card) -> None:
    """Check that everything the card names exists (reward, transform, generator, metrics).

    Done at load time for the card being run, and for every card in the catalog test,
    so a card that names something missing fails CI rather than a user's run.
    """
    from arlecli.data.transforms import get_transform
    from arlecli.envs import env_kind
    from arlecli.rewards import get_reward

    where = card.path or card.name
    try:
        env_kind(card.env)
    except UserError as exc:
        raise card_error(where, "env", str(exc)) from None
    try:
        get_reward(card.reward, card.reward_params)
    except UserError as exc:
        raise card_error(where, "reward", str(exc)) from None
    _check_metrics(card, where)
    _check_env_params(card, where)
    if card.transform:
        try:
            get_transform(card.transform)
        except UserError as exc:
            raise card_error(where, "transform", str(exc)) from None
    if card.loglikelihood and card.loglikelihood.transform:
        try:
            get_transform(card.loglikelihood.transform)
        except UserError as exc:
            raise card_error(where, "loglikelihood.transform", str(exc)) from None
    if card.source.kind == "generator":
        from arlecli.data.generators import generate_rows

        try:
            generate_rows(card.source.path, seed=0, size=1, params=card.source.params)
        except Exception as exc:  # any failure means the card names a generator that can't run
            raise card_error(where, "source.path", f"generator '{card.source.path}' failed: {exc}") from None


def card_runs_code(card: Card) -> bool:
    """Whether the card's reward or one of its tools runs programs in the sandbox, as each
    declares at registration (`@register(runs_code=True)`, `@register_tool(runs_code=True)`,
    a plugin's too), so its isolation is checked, and under `--sandbox require` enforced,
    before any generation."""
    from arlecli.envs.tools import tool_runs_code
    from arlecli.rewards import runs_code

    base = card.path.parent if card.path is not None else None
    tools = card.env_params.get("tools")
    return runs_code(card.reward) or (isinstance(tools, list) and any(tool_runs_code(str(t), base) for t in tools))


def card_forgeable(card: Card) -> bool:
    """Whether code written to cheat can forge the card's verdict (its reward declares
    `forgeable`: the tests run inside the model's own interpreter)."""
    from arlecli.rewards import forgeable

    return forgeable(card.reward)
