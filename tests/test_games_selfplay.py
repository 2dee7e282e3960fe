"""Self-play GRPO on a two-player game (tictactoe, the tiny model): both seats of each game are
the policy and each seat's moves carry loss, with that seat's own outcome and a baseline of its
own seat (role-conditioned advantages); the other seat's moves and the game's messages do not."""

from __future__ import annotations

import contextlib
import json
import re

import pytest

from arlecli.engine.base import Completion
from arlecli.errors import UserError
from arlecli.train.grpo import seat_advantages

from helpers.train import train_in_process


class LegalMoves:
    """The policy engine with each reply replaced by a free cell (which one depends on the
    sampled text, so games differ). Random tiny weights never write a legal move, and a game
    whose first mover forfeits on its second move never lets seat 1 play at all."""

    def __init__(self, engine, tokenizer) -> None:
        self.engine, self.tokenizer, self.name = engine, tokenizer, engine.name

    def generate(self, requests):
        for i, comp in self.engine.generate(requests):
            seen = requests[i].messages[-1]["content"]
            free = re.findall(r"'\[(\d)\]'", seen.rsplit("Available Moves:", 1)[-1])
            text = f"[{free[len(comp.text) % len(free)]}]"
            ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id]
            yield i, Completion(text=text, token_ids=ids, prompt_token_ids=comp.prompt_token_ids)

    def close(self) -> None:
        self.engine.close()


def test_self_play_grpo_trains_each_seat_on_its_own_moves_and_outcome(tmp_path, tiny_model, monkeypatch):
    import arlecli.train.grpo as grpo
    import arlecli.train.batches as train_batches

    over, sequences, advantage = (
        train_batches.PolicyBackend.over,
        train_batches.Rollouts.sequences,
        grpo.seat_advantages,
    )
    batches, computed = [], []

    @contextlib.contextmanager
    def legal_over(self, model, tokenizer, version):
        with over(self, model, tokenizer, version) as engine:
            yield LegalMoves(engine, tokenizer)

    def recording(self, *args, **kwargs):
        batches.append(sequences(self, *args, **kwargs))
        return batches[-1]

    def recording_advantages(rewards, seats, group, scale="group"):
        computed.append((list(rewards), list(seats), advantage(rewards, seats, group, scale)))
        return computed[-1][2]

    monkeypatch.setattr(train_batches.PolicyBackend, "over", legal_over)
    monkeypatch.setattr(train_batches.Rollouts, "sequences", recording)
    monkeypatch.setattr(grpo, "seat_advantages", recording_advantages)
    run = tmp_path / "run"
    train_in_process(
        "tictactoe",
        "--algo",
        "grpo",
        "--model",
        str(tiny_model),
        "--limit",
        "2",
        "--num-generations",
        "4",
        "--set",
        "per_device_train_batch_size=4",
        "--max-tokens",
        "6",
        "--max-steps",
        "2",
        "--lora-rank",
        "4",
        "--learning-rate",
        "1e-3",
        "--eval-limit",
        "2",
        "--set",
        "eval_max_tokens=4",
        "--output",
        str(run),
    )

    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert len(batches) == 2 and len(computed) == 2
    tokenizer = _tokenizer(tiny_model)
    for batch in batches:
        episodes = batch.episodes
        for j in range(0, len(episodes), 2):  # samples 2m and 2m+1 of a task: one game, seats 0 and 1
            a, b = episodes[j].info, episodes[j + 1].info
            assert (a["seat"], b["seat"]) == (0, 1) and a["seed"] == b["seed"] and a["opponent"] == "self"
            assert {a["outcome"], b["outcome"]} in ({"win", "loss"}, {"draw"})
        for r, episode in enumerate(episodes):
            own = [t for turn in episode.turns for t in turn.token_ids]
            mask, ids = batch.env_mask[r], batch.completion_ids[r]
            assert own and [t for t, m in zip(ids, mask) if m] == own  # this seat's moves, all of them, only them
            env_text = tokenizer.decode([t for t, m in zip(ids, mask) if not m])
            other = episodes[r + 1 if episode.info["seat"] == 0 else r - 1]
            # The other seat's moves between this seat's turns are environment tokens here.
            seen = (
                other.turns[: len(episode.turns) - 1]
                if episode.info["seat"] == 0
                else other.turns[1 : len(episode.turns)]
            )
            assert seen and all(f"[Player {other.info['seat']}] {t.completion}" in env_text for t in seen)
    for rewards, seats, adv in computed:
        assert len(set(seats)) == 2
        for start in range(0, len(rewards), 4):
            for seat in (0, 1):
                idx = [i for i in range(start, start + 4) if seats[i] == seat]
                assert abs(float(adv[idx].sum())) < 1e-4  # each seat against its own baseline
    # Held-out evaluations play the card's own opponent, not the policy.
    sample = json.loads((run / "eval" / "step-0" / "samples.jsonl").read_text().splitlines()[0])
    assert sample["env_info"]["opponent"] == "random" and sample["end_reason"]


def _tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def test_seat_advantages_center_each_seat_within_each_group():
    adv = seat_advantages([1, -1, 1, -1, 0, 0, 1, -1], [0, 1, 0, 1, 0, 1, 0, 1], group=4)
    # Seat 0 won both games of group 1 (no signal), seat 1 lost both; group 2: a draw and a win.
    assert adv[:4].abs().max() < 1e-6
    assert adv[4] < 0 < adv[6] and adv[7] < 0 < adv[5]
    unscaled = seat_advantages([1, -1, -1, 1], [0, 1, 0, 1], group=4, scale="none")
    assert unscaled.tolist() == [1, -1, -1, 1]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algo", "rloo"], "self-play trains with --algo grpo"),
        (["--opponent", "gpt-4o"], "training plays self, random or scripted"),
    ],
)
def test_self_play_settings_are_refused_in_one_line(tmp_path, tiny_model, args, message):
    with pytest.raises(UserError, match=message):
        train_in_process("tictactoe", "--model", str(tiny_model), *args, "--output", str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_opponent_on_a_single_player_card_is_refused(tmp_path, tiny_model):
    with pytest.raises(UserError, match="--opponent applies to two-player game cards"):
        train_in_process(
            "tower_of_hanoi", "--model", str(tiny_model), "--opponent", "random", "--output", str(tmp_path / "run")
        )


def test_self_play_with_a_seat_that_never_moves(tmp_path, tiny_model):
    """The tiny model's gibberish loses every game on seat 0's second invalid move, before seat 1
    moves: seat 1's episodes have no turns, no token to train and no place in a baseline, and
    the step still runs."""
    run = tmp_path / "run"
    train_in_process(
        "tictactoe",
        "--model",
        str(tiny_model),
        "--limit",
        "1",
        "--num-generations",
        "4",
        "--set",
        "per_device_train_batch_size=4",
        "--max-tokens",
        "4",
        "--max-steps",
        "1",
        "--eval-limit",
        "0",
        "--output",
        str(run),
    )
    lines = [json.loads(x) for x in (run / "rewards.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and sorted(x["env_info"]["seat"] for x in lines) == [0, 0, 1, 1]
    assert all(x["turns"] == 0 and x["end_reason"] == "win" for x in lines if x["env_info"]["seat"] == 1)
    assert json.loads((run / "summary.json").read_text())["global_step"] == 1


def test_seat_advantages_leave_seats_that_never_moved_out_of_the_baseline():
    adv = seat_advantages([-1, 1, 1, 1], [0, None, 0, None], group=4)
    assert adv[1] == adv[3] == 0 and adv[0] < 0 < adv[2]


@pytest.mark.parametrize(
    "algo, extra",
    [
        ("ppo", ["--set", "prompts_per_step=1"]),
        (
            "rft",
            [
                "--set",
                "rounds=1",
                "--set",
                "tasks_per_round=1",
                "--set",
                "per_device_train_batch_size=4",
                "--set",
                "min_reward=-1",
                "--set",
                "keep_cut=true",
            ],
        ),
    ],
)
def test_ppo_and_rft_play_themselves_too(tmp_path, tiny_model, algo, extra):
    """PPO trains both seats' episodes (a seat that never moved is an empty, masked sequence);
    RFT keeps the episodes of seats that moved (here every one: min_reward -1, and keep_cut, as the
    tiny model's 4-token moves all run to the limit) as SFT rows."""
    run = tmp_path / "run"
    train_in_process(
        "tictactoe",
        "--algo",
        algo,
        "--model",
        str(tiny_model),
        "--limit",
        "1",
        "--num-generations",
        "4",
        "--max-tokens",
        "4",
        "--max-steps",
        "1",
        "--eval-limit",
        "0",
        "--output",
        str(run),
        *extra,
    )
    assert (run / "final").exists()
    if algo == "rft":
        [row] = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        # The tiny model's gibberish: seat 0 forfeits on its second move, seat 1 never moves.
        assert row["samples"] == 4 and row["kept"] == 2
    lines = [json.loads(x) for x in (run / "rewards.jsonl").read_text().splitlines()]
    assert sorted(x["env_info"]["seat"] for x in lines) == [0, 0, 1, 1]
