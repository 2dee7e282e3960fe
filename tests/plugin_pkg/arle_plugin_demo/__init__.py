"""A demo arle plugin: a reward, a tool, an env and an engine, which arle finds through this package's
entry points (see ../pyproject.toml), and a card (benchmarks/demo_shout.yaml) that uses them.

The reward registers itself with `@register` to declare its metrics; the tool and the env are
plain functions, registered by their entry points alone.
"""

from __future__ import annotations

from typing import Any

from arlecli.envs.tools import ToolEnv
from arlecli.rewards import register
from arlecli.types import Episode, Score, Task


@register("demo_exact", metrics=["exact", "chars"])
def exact(ignore_case: bool = True):
    """The final reply equals the target (stripped; case ignored unless `ignore_case` is false).

    Details: exact (0/1), chars (the reply's length)."""

    def score(task: Task, episode: Episode) -> Score:
        got, want = episode.completion.strip(), str(task.target).strip()
        same = got.casefold() == want.casefold() if ignore_case else got == want
        return Score(float(same), same, got, {"exact": int(same), "chars": len(got)})

    return score


def shout(text: str) -> str:
    """Repeat a text in capital letters.

    Args:
        text: The words to shout.
    """
    return text.upper()


def shout_env(card: Any, task: Task, exemplars: list[Task], native_tools: bool, max_turns: int = 2) -> ToolEnv:
    """The tools env with this package's own `demo_shout` tool (named by its entry point)."""
    return ToolEnv(card, task, exemplars, native_tools, tools=["demo_shout"], max_turns=max_turns)


def loud_hf_engine(spec: Any, **options: Any) -> Any:
    """A backend (`--backend demo_loud_hf`): arle's hf engine, announced on stderr so a test
    can see which engine ran."""
    import sys

    from arlecli.engine import ENGINES

    print("demo_loud_hf: running on arle's hf engine", file=sys.stderr)
    return ENGINES.get("hf")(spec, **options)
