"""Would a compiled decode step pay on this CPU? (issue 29 item 3: "a compiled or graph-captured
decode step if it pays on CPU"). A probe, not a feature: arle does not compile.

What is measured: the median time of a decode step of the embedded SmolLM2-135M-Instruct at
`--batch` rows after a 100-token prefill, eager (arle's hf engine as it runs: prepacked oneDNN
linears, grouped attention) against `torch.compile(dynamic=True)` with inductor's freezing (it
prepacks weights its own way: inductor cannot lower arle's packed oneDNN op, so the linears are
unpacked for it), the compile time (the first compiled step), and how far the compiled logits
are from eager's.

    python perf/compiled_step.py --batch 1
    python perf/compiled_step.py --batch 16 --steps 24
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any


def decode(model: Any, forward: Any, ids: Any, prompt: int, steps: int) -> tuple[list[float], list[Any]]:
    """Prefill `prompt` tokens, then `steps` single-token steps through `forward`; (seconds, logits) per step."""
    import torch
    from transformers import DynamicCache

    batch = ids.shape[0]
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(
            input_ids=ids[:, :prompt],
            attention_mask=torch.ones(batch, prompt, dtype=torch.long),
            use_cache=True,
            past_key_values=cache,
        )
        seconds, logits = [], []
        for j in range(steps):
            start = time.perf_counter()
            out = forward(
                input_ids=ids[:, prompt + j : prompt + j + 1],
                attention_mask=torch.ones(batch, prompt + j + 1, dtype=torch.long),
                position_ids=torch.full((batch, 1), prompt + j),
                use_cache=True,
                past_key_values=cache,
            )
            seconds.append(time.perf_counter() - start)
            logits.append(out.logits[:, -1].clone())
    return seconds, logits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    import torch
    import torch._inductor.config as inductor_config

    from arlecli.engine import fused
    from arlecli.engine.hf import HFEngine, unpack_linears
    from arlecli.models import embedded_default_model

    torch.set_num_threads(args.threads)
    # The model's own forward on packed linears (what inductor compiles), not engine.fused's.
    fused.build = lambda model: None
    engine = HFEngine(str(embedded_default_model()), batch_size=args.batch, prefix_cache_tokens=0, draft_tokens=0)
    model, prompt = engine.model, 100
    ids = torch.randint(100, 20000, (args.batch, prompt + args.steps), generator=torch.Generator().manual_seed(0))
    eager_s, eager_logits = decode(model, model, ids, prompt, args.steps)
    unpack_linears(engine._packed)
    inductor_config.freezing = True
    started = time.perf_counter()
    compiled = torch.compile(model, dynamic=True)
    compiled_s, compiled_logits = decode(model, compiled, ids, prompt, args.steps)
    total = time.perf_counter() - started
    eager_ms = statistics.median(eager_s) * 1e3
    compiled_ms = statistics.median(compiled_s[3:]) * 1e3
    gap = max(float((a - b).abs().max()) for a, b in zip(eager_logits, compiled_logits))
    print(
        f"batch {args.batch}, {args.threads} thread(s): eager {eager_ms:.1f} ms a step; compiled {compiled_ms:.1f} ms "
        f"({eager_ms / compiled_ms:.2f}x), its first step (the compile) {compiled_s[0]:.1f} s, {total:.1f} s in all; "
        f"logits at most {gap:.2e} from eager's (bit-identical: {gap == 0.0})"
    )


if __name__ == "__main__":
    main()
