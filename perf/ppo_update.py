"""PPO's update step, the plain path vs the fast one (train/logprobs.py), side by side.

One PPO step's model work, `score_rollout` (policy + critic, then reference, no grad) and
`ppo_update` (forward + backward per micro batch, optimizer), on the same synthetic rollout
batch, once per forward path (`arlecli.train.ppo.FORWARD`):

  plain   one padded [B, P + T] forward per micro batch, every position's logits at once
  chunk   the same padded forward, the LM head in chunks of 512 completion positions only
          (checkpointed under autograd)
  unpad   no padding: rows laid out from column 0, grouped by length (<= 10% padding a group),
          full logits of the completion positions
  fast    unpad + chunk: the default
  share   fast + each group's shared prompt run once, its KV cache handed to the completions
          (not the default: see perf/README.md)

Each runs in a fresh subprocess (the peak memory is its own), in interleaved order over
`--repeats`; the child times the two parts, samples its resident memory every 5 ms during the
step (peak above the RSS before the step) and saves its rollout logprobs and the updated value
head, so the parent also prints each path's largest difference from plain (exactness).

The batch: `--rows` rows, `--group` completions per prompt (prompts of 90-110 tokens,
completions of 64-256 tokens, uniformly drawn; random token ids: timing does not depend on the
text), full fine-tune, fp32 on CPU, `torch.set_num_threads(--threads)`.

    python perf/ppo_update.py                 # tiny model, then SmolLM2-135M-Instruct
    python perf/ppo_update.py --models tiny   # the tiny test model only (~1 min)

Writes perf/results/ppo_update.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from machine_info import cpu_model, package_versions, perf_model, write_result

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "perf" / "results"
VARIANTS = {
    "plain": {"chunk": None, "unpad": False},
    "chunk": {"chunk": 512, "unpad": False},
    "unpad": {"chunk": None, "unpad": True},
    "fast": {"chunk": 512, "unpad": True},
    "share": {"chunk": 512, "unpad": True, "share_prompts": True},
}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Highest resident memory seen while the `with` block runs (sampled every 5 ms)."""

    def __enter__(self) -> "PeakRSS":
        self.start = _rss_bytes()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss_bytes())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())


def episodes(rows: int, group: int, vocab: int, seed: int) -> list[Any]:
    """`rows` single-turn episodes, `group` completions per prompt, of the script's shape."""
    from arlecli.types import Episode, Turn

    rng = random.Random(seed)
    out = []
    prompt: list[int] = []
    for r in range(rows):
        if r % group == 0:
            prompt = [rng.randrange(10, vocab) for _ in range(rng.randint(90, 110))]
        completion = [rng.randrange(10, vocab) for _ in range(rng.randint(64, 256))]
        turn = Turn("p", "c", prompt_token_ids=prompt, token_ids=completion, logprobs=[-1.0] * len(completion))
        out.append(Episode(str(r), [turn]))
    return out


def child(args: argparse.Namespace) -> None:
    """One variant's step; prints one JSON line and saves its outputs to --save."""
    import torch

    from arlecli.train import ppo
    from arlecli.train.logprobs import ForwardOptions

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    p = ppo.PPOParams(ppo_epochs=args.epochs, micro_batch_size=args.micro)
    policy = ppo.load_policy(args.model, 0, p)
    torch.nn.init.normal_(policy.value_head.weight, std=0.02)  # a critic whose gradient reaches the trunk
    ppo.FORWARD = ForwardOptions(**VARIANTS[args.variant])
    batch_eps = episodes(args.rows, args.group, policy.model.config.vocab_size, seed=0)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-6)
    with PeakRSS() as memory:
        started = time.perf_counter()
        cpu = time.process_time()
        batch = ppo.score_rollout(policy, batch_eps, list(range(args.rows)), 1.0, args.micro)
        score_s = time.perf_counter() - started
        scores = torch.linspace(0.0, 1.0, args.rows)
        rewards, _ = ppo.kl_rewards(batch.logprobs, batch.ref_logprobs, batch.mask, scores, p.kl_coef)
        advantages = ppo.gae(rewards, batch.values, batch.mask, p.gamma, p.lam)
        returns = (advantages + batch.values) * batch.mask
        advantages = ppo.whiten(advantages, batch.mask)
        torch.manual_seed(1)  # the same minibatch order in every variant
        update_started = time.perf_counter()
        stats = ppo.ppo_update(policy, optimizer, batch, advantages, returns, p, 1.0)
        update_s = time.perf_counter() - update_started
        cpu_s = time.process_time() - cpu
    tokens = int(batch.attention_mask.sum())
    slots = batch.attention_mask.numel()
    torch.save(
        {"logprobs": batch.logprobs, "values": batch.values, "head": policy.value_head.weight.detach()}, args.save
    )
    print(
        json.dumps(
            {
                "variant": args.variant,
                "score_s": score_s,
                "update_s": update_s,
                "step_s": score_s + update_s,
                "cpu_s": cpu_s,
                "peak_mib": (memory.peak - memory.start) / 2**20,
                "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "tokens": tokens,
                "padded_slots": slots,
                "policy_loss": stats["policy_loss"],
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--micro", type=int, default=8, help="completions per forward (micro batch)")
    parser.add_argument("--epochs", type=int, default=1, help="PPO epochs over the batch")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS / "ppo_update.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    import torch

    work = Path(tempfile.mkdtemp(prefix="arle-perf-ppo-"))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT / "src")}
    result: dict[str, Any] = {
        "command": " ".join(["python", "perf/ppo_update.py", *sys.argv[1:]]),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform()},
        "versions": package_versions(("torch", "transformers")),
        "load_avg_at_start": os.getloadavg(),
        "models": {},
    }
    variants = args.variants.split(",")
    for name in args.models.split(","):
        path, _ = perf_model(name == "tiny", work)
        runs: dict[str, list[dict]] = {v: [] for v in variants}
        for repeat in range(args.repeats):
            for variant in variants:
                save = work / f"{name}-{variant}-{repeat}.pt"
                cmd = [sys.executable, __file__, "--child", "--model", path, "--variant", variant, "--save", str(save)]
                cmd += ["--rows", str(args.rows), "--group", str(args.group), "--micro", str(args.micro)]
                cmd += ["--epochs", str(args.epochs), "--threads", str(args.threads)]
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    sys.exit(f"{name} {variant} failed:\n{done.stderr[-3000:]}")
                row = json.loads(done.stdout.strip().splitlines()[-1])
                runs[variant].append(row)
                print(f"{name} {variant} #{repeat}: {json.dumps(row)}", flush=True)
        base = torch.load(work / f"{name}-{variants[0]}-0.pt")
        table = {}
        for variant in variants:
            got = torch.load(work / f"{name}-{variant}-0.pt")
            best = min(runs[variant], key=lambda r: r["step_s"])
            table[variant] = {
                **best,
                "max_logprob_diff": float((got["logprobs"] - base["logprobs"]).abs().max()),
                "max_value_diff": float((got["values"] - base["values"]).abs().max()),
                "max_head_diff_after_update": float((got["head"] - base["head"]).abs().max()),
            }
        result["models"][name] = table
        ref = table[variants[0]]
        print(f"\n{name}: {args.rows} rows, micro batch {args.micro}, {args.epochs} epoch(s); best of {args.repeats}")
        head = f"{'':8} {'score s':>8} {'update s':>9} {'step s':>8} {'plain/it':>9} {'CPU s':>7} {'plain/it':>9}"
        print(head + f" {'peak MiB':>9} {'max |dlogp|':>12}")
        for variant, row in table.items():
            print(
                f"{variant:8} {row['score_s']:8.2f} {row['update_s']:9.2f} {row['step_s']:8.2f}"
                f" {ref['step_s'] / row['step_s']:8.2f}x {row['cpu_s']:7.2f} {ref['cpu_s'] / row['cpu_s']:8.2f}x"
                f" {row['peak_mib']:9.0f} {row['max_logprob_diff']:12.2e}"
            )
    result["load_avg_at_end"] = os.getloadavg()
    write_result(result, args.out, work, keep=False)


if __name__ == "__main__":
    main()
