"""This process among the training processes: one (the default), or a rank under accelerate.

Under `accelerate launch` (see launch.py) every rank runs the same training run. Only the main
process writes the run directory's files and runs held-out evaluations; the others wait at a
barrier, and fail too when the main process fails.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from arlecli.errors import UserError
from arlecli.train.launch import in_launched_process


@dataclass
class Ranks:
    """This process among the training processes: one (the default), or a rank under accelerate."""

    main: bool = True
    world: int = 1

    @classmethod
    def current(cls) -> "Ranks":
        if not in_launched_process():
            return cls()
        from accelerate import PartialState  # set up already by the trainer's config (same settings)

        state = PartialState()
        return cls(main=state.is_main_process, world=state.num_processes)

    def barrier(self) -> None:
        if self.world > 1:
            from accelerate import PartialState

            PartialState().wait_for_everyone()

    def gather(self, items: list[Any]) -> list[Any]:
        """Every rank's `items`, concatenated in rank order, on every rank."""
        if self.world == 1:
            return items
        from accelerate.utils import gather_object

        return gather_object(items)

    def on_main(self, fn: Callable[[], Any]) -> None:
        """Run `fn` on the main process only; the others wait, and fail too if it fails."""
        if self.world == 1:
            fn()
            return
        from accelerate.utils import broadcast_object_list

        error: list[Any] = [None]
        failure: BaseException | None = None
        if self.main:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001  (re-raised below, after the others know)
                failure, error[0] = exc, str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
        broadcast_object_list(error, from_process=0)
        if failure is not None:
            raise failure
        if error[0] is not None:
            raise UserError(error[0])


def sharded() -> bool:
    """Whether the weights are split over the ranks (ZeRO-3, FSDP): then no rank can generate alone."""
    env = os.environ
    on = lambda name: env.get(name, "").lower() in ("1", "true", "yes")  # noqa: E731
    return on("ACCELERATE_USE_FSDP") or (
        on("ACCELERATE_USE_DEEPSPEED") and env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3"
    )


def barrier_callback(ranks: Ranks, every: int) -> Any:
    """The other ranks wait while the main process runs an every-N held-out evaluation."""
    from transformers import TrainerCallback

    class Barrier(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % every == 0 and state.global_step < state.max_steps:
                ranks.barrier()

    return Barrier()
