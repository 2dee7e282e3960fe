"""Solver then judge: one model plays two roles in one episode.

Turn 1 (solver): the card's prompt; the model proposes an answer. Turn 2 (judge): the env
replies with a user message that switches the model to the judge role, shows the
proposal and asks it to check it and give a verdict and the final answer; the episode ends
after that turn ("judged"). The judge's instructions come as that user message rather
than a new system prompt, so the conversation (and its token ids) only grows, as
training on whole episodes needs.

The judge message is the `judge` param, a template filled like the card's prompt: any
task column (`{numbers}`, `{target}`, `{input}`) and `{proposal}`, the solver's last
`<answer>` content (else its whole reply, clipped). The judge's reply is the episode's
final completion, which the card's reward scores; `info` records the proposal and the
verdict read from a "Verdict: correct|incorrect" line.

    env: {name: judge, params: {judge: "You are now the judge ... Proposal: {proposal}"}}
"""

from __future__ import annotations

import re
from typing import Any

from arlecli.envs import Step, register_env
from arlecli.cards import fill, render_prompt
from arlecli.errors import UserError
from arlecli.rewards.procedural import answer_tag
from arlecli.types import Task

MAX_PROPOSAL_CHARS = 1000  # an untagged proposal is the whole reply: keep the judge prompt short
DEFAULT_JUDGE = (
    "Now switch roles: you are the judge. Check the solver's proposal for the problem above "
    'step by step. End with a line "Verdict: correct" or "Verdict: incorrect", then the final '
    "answer inside <answer></answer> tags: the proposal if it is correct, else a corrected one.\n\n"
    "Proposal: {proposal}"
)
_VERDICT = re.compile(r"verdict\s*:\s*\**\s*(correct|incorrect)", re.IGNORECASE)


def proposal_of(text: str) -> str:
    """The solver's proposal: its last `<answer>` content, else its whole reply (clipped)."""
    tagged = answer_tag(text)
    body = tagged if tagged is not None else text.strip()
    if len(body) > MAX_PROPOSAL_CHARS:
        body = body[-MAX_PROPOSAL_CHARS:]  # the end of a reasoning reply is where the answer is
    return body or "(no proposal)"


def verdict_of(text: str) -> str | None:
    """ "correct" or "incorrect" from the judge's last "Verdict:" line, else None."""
    found = _VERDICT.findall(text)
    return found[-1].lower() if found else None


class SolverJudgeEnv:
    """Two turns: the solver's proposal, then the same model judging it."""

    tools: list[dict[str, Any]] | None = None
    max_turns = 2

    def __init__(self, card: Any, task: Task, exemplars: list[Task], judge: str = DEFAULT_JUDGE) -> None:
        self.card, self.task, self.exemplars, self.judge = card, task, exemplars, judge
        self.proposal: str | None = None
        self.verdict: str | None = None

    def reset(self) -> list[dict[str, Any]]:
        rendered = render_prompt(self.card.prompt, self.task, self.exemplars)
        if isinstance(rendered, str):
            raise UserError(f"{self.card.name}: env 'judge' needs a chat card (prompt.format: chat)")
        return rendered

    def step(self, completion: str) -> Step:
        if self.proposal is None:  # the solver's turn just ended
            self.proposal = proposal_of(completion)
            fields = {**self.task.fields, "proposal": self.proposal}
            task = Task(self.task.id, self.task.input, self.task.target, fields)
            return Step([{"role": "user", "content": fill(self.judge, task, "env.params.judge")}])
        self.verdict = verdict_of(completion)
        return Step(done=True, reason="judged")

    def info(self) -> dict[str, Any]:
        return {"proposal": self.proposal, "verdict": self.verdict}


@register_env("judge")
def judge_env(
    card: Any, task: Task, exemplars: list[Task], native_tools: bool, judge: str = DEFAULT_JUDGE
) -> SolverJudgeEnv:
    """Env factory for `env: {name: judge, params: {judge: "<template with {proposal}>"}}`."""
    return SolverJudgeEnv(card, task, exemplars, judge)
