"""How arle's eval cost grows with the number of samples, the batch size and the concurrency.

What is measured (the peer is arle itself at other sizes; ratios are against linear):

1. Samples: `run_eval` on the tiny random Qwen2 model (tests/helpers/tiny_model.py, built into a
   temp dir) with the hf backend, card basic_arithmetic (generated offline), greedy,
   --max-tokens fixed, batch 16, at n = 32, 128, 512 samples. A random model almost never
   emits EOS, so every sample costs the same max_tokens decode steps: the work is exactly
   proportional to n and any superlinear cost would be arle's. Per run: eval wall (task
   generation + generation + scoring + writing samples.jsonl), start-up (imports + model
   load, excluded from the fit), peak RSS. Fit wall = a + b*n by least squares; report
   R^2, each point's ratio to the fit, per-sample time at each n, and the largest n's
   wall against the line through the two smallest (extrapolated, not fitted).
2. Batch size: the same eval at n = 128 with batch 1, 4, 16, 64: wall and peak RSS.
3. Concurrency: the openai backend against tests/helpers/fake_openai.py's FakeOpenAIServer
   answering every request after a fixed delay, n = 64 requests, concurrency 1, 4, 16,
   64: ideal wall = ceil(n/concurrency) * delay; ratio = measured / ideal, the same eval
   with no server delay (arle's own cost: task generation, HTTP, scoring, writing), the
   ratio to ideal + that cost, and the most requests the server saw in flight at once.

Each size of the samples and batch curves is a fresh subprocess of this script
(`--child`), so ru_maxrss is that size's own peak; it loads the model once, runs one
untimed warm-up eval (one batch), then the timed repeats back to back, and reports their
median (start-up is paid once per child: on this loaded machine it is ~30 s, far more
than the evals). The concurrency runs are interleaved rounds over the concurrencies.

OMP_WAIT_POLICY: this machine's 2 cores are shared with other jobs; with libgomp's default
spin-wait a multi-threaded matmul on an oversubscribed CPU waits a scheduler slice at every
barrier (~30 ms per small matmul here), which would measure the neighbours. Children run
with OMP_WAIT_POLICY=PASSIVE unless `--omp-wait-policy default`.

    python perf/scaling.py            # full
    python perf/scaling.py --quick    # smaller sizes, 1 repeat
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine_info import cpu_model, package_versions

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "perf" / "results" / "scaling.json"
MARK = "PERF_CHILD_RESULT "
CARD = "basic_arithmetic"


# ---------------------------------------------------------------- the child: one hf eval, timed


def child(args: argparse.Namespace) -> None:
    """Warm up, then run `args.repeats` evals of `args.n` samples at `args.batch`; print the figures as a MARK line.

    The repeats share the process (one start-up, one model load); a warm-up eval of one
    batch first keeps first-call costs (lazy imports, allocator growth) out of them.
    """
    t_start = time.perf_counter()
    from arlecli.catalog import resolve_references
    from arlecli.engine import make_engine
    from arlecli.eval import EvalOptions, run_eval
    from arlecli.models import resolve_model
    from arlecli.catalog import load_card

    card = load_card(CARD)
    resolve_references(card)
    spec = resolve_model(args.model, backend="hf")
    engine = make_engine(spec, batch_size=args.batch)
    startup = time.perf_counter() - t_start

    def timed(n: int, run_dir: Path) -> float:
        opts = EvalOptions(limit=n, temperature=0.0, max_tokens=args.max_tokens, num_fewshot=0)
        t = time.perf_counter()
        run_eval(card, engine, opts, model=spec.name, run_dir=run_dir)
        return time.perf_counter() - t

    run_dir = Path(args.run_dir)
    try:
        timed(min(args.n, args.batch), run_dir / "warmup")
        evals = [timed(args.n, run_dir / f"r{k}") for k in range(args.repeats)]
    finally:
        engine.close()
    with open(run_dir / "r0" / "samples.jsonl") as f:
        samples = [json.loads(line) for line in f]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        MARK
        + json.dumps(
            {
                "startup_s": startup,
                "eval_s": statistics.median(evals),
                "all_eval_s": evals,
                "samples": len(samples),
                "tokens": sum(s["num_tokens"] for s in samples),
                "maxrss_mib": usage.ru_maxrss / 1024,
                "cpu_s": usage.ru_utime + usage.ru_stime,
            }
        ),
        flush=True,
    )


def child_env(policy: str) -> dict[str, str]:
    """The children's environment: ours plus the OpenMP wait policy."""
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    return env


def spawn(n: int, batch: int, args: argparse.Namespace, model: Path, work: Path, tag: str) -> dict[str, Any]:
    """One child run; its figures (raises with the log on failure)."""
    run_dir = work / f"{tag}-n{n}-b{batch}"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--n",
        str(n),
        "--batch",
        str(batch),
        "--max-tokens",
        str(args.max_tokens),
        "--repeats",
        str(args.repeats),
        "--model",
        str(model),
        "--run-dir",
        str(run_dir),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(args.omp_wait_policy))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child n={n} batch={batch} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    got = json.loads(lines[-1][len(MARK) :])
    got.update(n=n, batch=batch)
    return got


# ---------------------------------------------------------------- curves


def per_size(sizes: list[int], run: Any) -> dict[int, dict[str, Any]]:
    """run(size) for every size, one child each (the child does the repeats)."""
    out = {}
    for size in sizes:
        out[size] = run(size)
        print(f"  {out[size]}", file=sys.stderr, flush=True)
    return out


def med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b*x; returns (a, b, R^2)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return a, b, 1 - ss_res / ss_tot if ss_tot else 1.0


def samples_curve(args: argparse.Namespace, model: Path, work: Path) -> dict[str, Any]:
    """Eval wall and peak RSS against n at a fixed batch; the linear fit and its residuals."""
    runs = per_size(args.sizes, lambda n: spawn(n, args.batch, args, model, work, "samples"))
    rows = [
        {
            "n": n,
            "eval_s": r["eval_s"],
            "startup_s": r["startup_s"],
            "peak_rss_mib": r["maxrss_mib"],
            "cpu_s": r["cpu_s"],
            "tokens": r["tokens"],
            "all_eval_s": r["all_eval_s"],
        }
        for n, r in runs.items()
    ]
    xs, ys = [r["n"] for r in rows], [r["eval_s"] for r in rows]
    a, b, r2 = fit_line(xs, ys)
    (x0, y0), (x1, y1) = (xs[0], ys[0]), (xs[1], ys[1])
    slope2 = (y1 - y0) / (x1 - x0)  # the line through the two smallest sizes
    for r in rows:
        r["per_sample_ms"] = 1000 * r["eval_s"] / r["n"]
        r["fit_s"] = a + b * r["n"]
        r["ratio_to_fit"] = r["eval_s"] / r["fit_s"]
        r["extrapolated_s"] = y0 + slope2 * (r["n"] - x0)
        r["ratio_to_extrapolated"] = r["eval_s"] / r["extrapolated_s"]
    return {
        "batch": args.batch,
        "max_tokens": args.max_tokens,
        "rows": rows,
        "fit": {"a_s": a, "b_ms_per_sample": 1000 * b, "r2": r2},
    }


def batch_curve(args: argparse.Namespace, model: Path, work: Path) -> dict[str, Any]:
    """Eval wall and peak RSS against batch size at fixed n."""
    runs = per_size(args.batch_sizes, lambda bs: spawn(args.batch_n, bs, args, model, work, "batch"))
    base = runs[args.batch_sizes[0]]["eval_s"]
    return {
        "n": args.batch_n,
        "rows": [
            {
                "batch": bs,
                "eval_s": r["eval_s"],
                "peak_rss_mib": r["maxrss_mib"],
                "cpu_s": r["cpu_s"],
                "samples_per_s": args.batch_n / r["eval_s"],
                "speedup_vs_first": base / r["eval_s"],
                "all_eval_s": r["all_eval_s"],
            }
            for bs, r in runs.items()
        ],
    }


def concurrency_curve(args: argparse.Namespace) -> dict[str, Any]:
    """openai backend against a fake server with a fixed per-request delay: wall vs the ideal."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import fake_openai
    from helpers.fake_openai import FakeOpenAIServer

    # http.server leaves Nagle on and writes headers and body separately: with the client's
    # delayed ACK every response then stalls ~40 ms (measured 44 ms vs 1.5 ms per request),
    # which would measure the fake server, not arle. Real servers (uvicorn) set TCP_NODELAY.
    fake_openai._Handler.disable_nagle_algorithm = True

    from arlecli.catalog import resolve_references
    from arlecli.engine import make_engine
    from arlecli.eval import EvalOptions, run_eval
    from arlecli.models import resolve_model
    from arlecli.catalog import load_card

    card = load_card(CARD)
    resolve_references(card)
    n, delay = args.conc_n, args.delay
    opts = EvalOptions(limit=n, temperature=0.0, max_tokens=16, num_fewshot=0)

    def one(conc: int, tag: str, work: Path, delay_s: float = delay) -> dict[str, Any]:
        with FakeOpenAIServer(lambda body: "<answer>0</answer>", delay_s=delay_s) as srv:
            spec = resolve_model(srv.model, base_url=srv.base_url)
            engine = make_engine(spec, concurrency=conc)
            t = time.perf_counter()
            try:
                run_eval(card, engine, opts, model=spec.name, run_dir=work / f"c{conc}-{tag}")
            finally:
                engine.close()
            wall = time.perf_counter() - t
            return {"concurrency": conc, "wall_s": wall, "max_in_flight": srv.max_in_flight}

    with tempfile.TemporaryDirectory(prefix="arle-perf-conc-") as tmp:
        one(1, "warm", Path(tmp))  # imports, the card's task generation cache, httpx's first connection
        runs: dict[int, list[dict[str, Any]]] = {c: [] for c in args.concurrency}
        base: dict[int, list[dict[str, Any]]] = {c: [] for c in args.concurrency}
        for rep in range(args.repeats):  # interleaved: every concurrency once per round
            for c in args.concurrency:
                runs[c].append(one(c, f"r{rep}", Path(tmp)))
                base[c].append(one(c, f"r{rep}-base", Path(tmp), 0.0))  # the same eval with no server delay
    rows = []
    for c, rs in runs.items():
        ideal = math.ceil(n / c) * delay
        wall, wall0 = med(rs, "wall_s"), med(base[c], "wall_s")
        rows.append(
            {
                "concurrency": c,
                "wall_s": wall,
                "ideal_s": ideal,
                "ratio_to_ideal": wall / ideal,
                "overhead_s": wall - ideal,
                "no_delay_wall_s": wall0,
                "ratio_to_ideal_plus_no_delay": wall / (ideal + wall0),
                "max_in_flight": max(r["max_in_flight"] for r in rs),
            }
        )
    return {"n": n, "delay_s": delay, "rows": rows}


# ---------------------------------------------------------------- machine, table, main


def machine() -> dict[str, Any]:
    """CPU model, cores, load and versions."""
    versions = package_versions(("arle", "torch", "transformers", "httpx"))
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "loadavg_start": os.getloadavg(),
        "versions": versions,
    }


def print_tables(info: dict[str, Any], rep: dict[str, Any], cfg: dict[str, Any]) -> None:
    """The three curves as plain tables."""
    print(
        f"\narle eval scaling · {info['date']} · {info['cpu']} · {info['cores']} cores · "
        f"load {info['loadavg_start'][0]:.1f}->{info['loadavg_end'][0]:.1f}"
    )
    print("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    print(
        f"tiny Qwen2 model, hf backend, card {CARD}, greedy, max_tokens {cfg['max_tokens']}, "
        f"repeats {cfg['repeats']} (median), OMP_WAIT_POLICY={cfg['omp_wait_policy']}"
    )
    s = rep["samples"]
    print(
        f"\n1. samples (batch {s['batch']}): fit eval_s = {s['fit']['a_s']:.2f} + "
        f"{s['fit']['b_ms_per_sample']:.1f} ms * n, R^2 = {s['fit']['r2']:.4f}"
    )
    print(
        f"{'n':>6} {'eval s':>8} {'ms/sample':>9} {'fit s':>7} {'/fit':>6} {'extrap s':>8} {'/extrap':>7} "
        f"{'start-up s':>10} {'peak MiB':>8} {'CPU s':>7}"
    )
    for r in s["rows"]:
        print(
            f"{r['n']:>6} {r['eval_s']:>8.2f} {r['per_sample_ms']:>9.1f} {r['fit_s']:>7.2f} "
            f"{r['ratio_to_fit']:>6.3f} "
            f"{r['extrapolated_s']:>8.2f} {r['ratio_to_extrapolated']:>7.3f} {r['startup_s']:>10.2f} "
            f"{r['peak_rss_mib']:>8.0f} {r['cpu_s']:>7.1f}"
        )
    b = rep["batch"]
    print(f"\n2. batch size (n = {b['n']})")
    print(f"{'batch':>6} {'eval s':>8} {'samples/s':>9} {'speed-up':>8} {'peak MiB':>8} {'CPU s':>7}")
    for r in b["rows"]:
        print(
            f"{r['batch']:>6} {r['eval_s']:>8.2f} {r['samples_per_s']:>9.1f} {r['speedup_vs_first']:>8.2f} "
            f"{r['peak_rss_mib']:>8.0f} {r['cpu_s']:>7.1f}"
        )
    c = rep["concurrency"]
    print(f"\n3. concurrency (openai backend, fake server, n = {c['n']}, {1000 * c['delay_s']:.0f} ms per request)")
    print("   (no-delay s: the same eval against a server that answers at once, i.e. arle's own cost)")
    print(
        f"{'conc':>6} {'wall s':>8} {'ideal s':>8} {'/ideal':>7} {'overhead s':>10} {'no-delay s':>10} "
        f"{'/(ideal+no-delay)':>17} {'max in flight':>13}"
    )
    for r in c["rows"]:
        print(
            f"{r['concurrency']:>6} {r['wall_s']:>8.2f} {r['ideal_s']:>8.2f} {r['ratio_to_ideal']:>7.2f} "
            f"{r['overhead_s']:>10.2f} {r['no_delay_wall_s']:>10.2f} {r['ratio_to_ideal_plus_no_delay']:>17.2f} "
            f"{r['max_in_flight']:>13}"
        )


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, 1 repeat")
    p.add_argument("--sizes", type=ints, default=None, help="sample counts (default 32,128,512; quick 16,32,64)")
    p.add_argument("--batch", type=int, default=16, help="batch size for the samples curve")
    p.add_argument("--batch-sizes", type=ints, default=None, help="default 1,4,16,64; quick 1,4,16")
    p.add_argument("--batch-n", type=int, default=None, help="samples for the batch curve (default 128; quick 32)")
    p.add_argument("--concurrency", type=ints, default=None, help="default 1,4,16,64; quick 1,4,16")
    p.add_argument("--conc-n", type=int, default=None, help="requests for the concurrency curve (default 64; quick 16)")
    p.add_argument("--delay", type=float, default=0.05, help="fake server delay per request, seconds")
    p.add_argument("--max-tokens", type=int, default=None, help="default 32; quick 16")
    p.add_argument("--repeats", type=int, default=None, help="default 3; quick 1")
    p.add_argument("--omp-wait-policy", default="PASSIVE", choices=["PASSIVE", "ACTIVE", "default"])
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    q = args.quick
    args.sizes = args.sizes or ([16, 32, 64] if q else [32, 128, 512])
    args.batch_sizes = args.batch_sizes or ([1, 4, 16] if q else [1, 4, 16, 64])
    args.batch_n = args.batch_n or (32 if q else 128)
    args.concurrency = args.concurrency or ([1, 4, 16] if q else [1, 4, 16, 64])
    args.conc_n = args.conc_n or (16 if q else 64)
    args.max_tokens = args.max_tokens or (16 if q else 32)
    args.repeats = args.repeats or (1 if q else 3)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    if args.child:
        child(args)
        return {}
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.tiny_model import build_tiny_model

    info = machine()
    with tempfile.TemporaryDirectory(prefix="arle-perf-scaling-") as tmp:
        work = Path(tmp)
        model = build_tiny_model(work / "tiny")
        print("samples curve", file=sys.stderr)
        report = {"samples": samples_curve(args, model, work)}
        print("batch curve", file=sys.stderr)
        report["batch"] = batch_curve(args, model, work)
    print("concurrency curve", file=sys.stderr)
    report["concurrency"] = concurrency_curve(args)
    info["loadavg_end"] = os.getloadavg()
    cfg = {
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "omp_wait_policy": args.omp_wait_policy,
        "quick": args.quick,
        "card": CARD,
        "model": "tests/helpers/tiny_model.py build_tiny_model (random, 4 layers)",
    }
    print_tables(info, report, cfg)
    out = {"machine": info, "config": cfg, **report}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
