"""A training run's time left is shown from its first step on (it read `-:--:--` for steps
slower than Rich's 30 s window: every CPU step), and its model card names the base model
(TRL's named a local one `None`). A real 2-step run shows both: test_train_rows."""

from __future__ import annotations

import io


def test_the_time_left_is_known_after_the_first_step(monkeypatch):
    from rich.console import Console

    import arlecli.cli.train as cli

    # A terminal: the live bar. Steps of 40 s (a CPU step): Rich's own estimate stays blank.
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=160)
    monkeypatch.setattr(cli, "err_console", lambda: console)
    view = cli.ProgressView()
    view.log({"step": 1, "max_steps": 4, "seconds_per_step": 40.0, "reward": 0.5})
    view.progress.refresh()
    assert "eta 0:02:00" in screen.getvalue()  # 3 steps to go at 40 s
    view.log({"step": 2, "max_steps": 4, "seconds_per_step": 20.0, "reward": 0.5})
    view.progress.refresh()
    view.stop()
    assert "eta 0:01:00" in screen.getvalue()  # 2 to go at the mean 30 s
    # Logs (no terminal): the step line says it too, and a resumed run's first step counts once.
    clock = cli.StepClock()
    assert clock.eta({"step": 11, "max_steps": 20, "seconds_per_step": 5.0}) == 45.0
    assert cli.step_line({"step": 11, "max_steps": 20, "loss": 0.1}, 45.0).endswith("eta 0:00:45")
    assert cli.StepClock().eta({"step": 3, "max_steps": 3, "seconds_per_step": 5.0}) == 0.0


def test_the_embedded_default_is_named_by_its_hub_id(tmp_path):
    from arlecli.models import EMBEDDED_NAME, ModelSpec
    from arlecli.train.model_card import EMBEDDED_HUB_ID, base_model

    embedded = ModelSpec(kind="hf", name=EMBEDDED_NAME, path_or_id=str(tmp_path / "models" / EMBEDDED_NAME))
    assert base_model(embedded) == EMBEDDED_HUB_ID == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert (
        base_model(ModelSpec(kind="hf", name="Qwen/Qwen2.5-0.5B", path_or_id="Qwen/Qwen2.5-0.5B"))
        == "Qwen/Qwen2.5-0.5B"
    )
