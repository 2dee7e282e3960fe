"""arle eval vs lm-evaluation-harness (`--model hf`) on the same gsm8k-format work.

What is measured: the wall time of one whole CLI run of each tool (each in its own
subprocess, so each pays its own imports and model load), the generated tokens per
second, and both tools' gsm8k strict-match and flexible-extract scores, compared
sample by sample.

How, so that both do the very same work:
- Data: gsm8k-schema rows (`question`, `answer` ending in `#### N`) made deterministically
  from a few arithmetic templates (no network), written to a temp folder as test.jsonl
  (the evaluated rows) and train.jsonl (few-shot exemplars).
- Model: arle's embedded SmolLM2-135M-Instruct (fp32 HF folder), passed to both by path.
- arle: `python -m arlecli eval gsm8k --data test.jsonl --num-fewshot 0` (the shipped card,
  which reproduces lm-eval's gsm8k prompt and filters); for a few-shot run, a copy of that
  card whose source is the local train/test files (`arle eval --data` takes few-shot rows
  from the hub's train split, which is unreachable here).
- lm-eval: `python -m lm_eval --model hf --include_path TMP --tasks <task>`, where the task
  YAML is lm-eval's own installed gsm8k.yaml (prompt, target, filters, metric verbatim) with
  the dataset swapped for the same local jsonl files (`dataset_path: json`), its own
  few-shot sampler (arle's card draws the same exemplars: lm-eval's default sampler, seed
  1234), and `max_gen_toks` = arle's `--max-tokens`.
- Same decoding for both: greedy, stop at "Question:", "</s>", "<|im_end|>" or EOS, the same
  token budget, batch size 16 on both, fp32 on CPU.
- Tokens: each tool's final completion text (after its stop-string cut) is re-tokenised
  with the model's tokenizer (no special tokens), so both are counted the same way.
- Start-up: a separate 1-row, 1-token run of each tool (imports + model load + task setup).
- Runs are interleaved (arle, lm-eval, arle, lm-eval, ...) after one warm-up of each, and
  the median wall time of the repeats is reported, with each run's CPU time (user + system)
  next to it: on a shared machine wall time also measures the neighbours' load.

Run: `python perf/eval_vs_lmeval.py [--quick]`; prints a table and writes
perf/results/eval_vs_lmeval.json (`--quick` writes only where --output says).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from machine_info import bound_fraction, cpu_model, package_versions, roofline, roofline_lines

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "perf" / "results"
BATCH_SIZE = 16
TARGET = 4.0  # issue 29: arle eval >= 4x lm-eval's tokens/s on AVX2 and on AVX-512 CPUs
TASK = "arle_perf_gsm8k_local"


# ---------------------------------------------------------------- data

_NAMES = ["Ava", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jo", "Kai", "Lena"]
_ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "cookies", "shells", "cards"]


def _problem(rng: random.Random) -> dict[str, str]:
    """One gsm8k-schema row: a two-step word problem with a gsm8k-style rationale."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(4)
    a, b, c = rng.randint(5, 60), rng.randint(2, 30), rng.randint(2, 9)
    if kind == 0:  # buy more, then give some away
        c = rng.randint(1, a + b - 1)
        s, r = a + b, a + b - c
        q = (
            f"{name} has {a} {item}. {name} buys {b} more and then gives {c} to a friend. "
            f"How many {item} does {name} have now?"
        )
        ans = (
            f"{name} has {a} + {b} = <<{a}+{b}={s}>>{s} {item} after buying.\n"
            f"After giving some away, {s} - {c} = <<{s}-{c}={r}>>{r} {item} are left.\n#### {r}"
        )
    elif kind == 1:  # boxes of items plus loose ones
        p, r = b * c, b * c + a
        q = (
            f"A shop has {c} boxes with {b} {item} in each box and {a} loose {item}. "
            f"How many {item} does the shop have in total?"
        )
        ans = (
            f"The boxes hold {c} * {b} = <<{c}*{b}={p}>>{p} {item}.\n"
            f"With the loose ones there are {p} + {a} = <<{p}+{a}={r}>>{r} {item}.\n#### {r}"
        )
    elif kind == 2:  # price times quantity, change from a bill
        price, bill = rng.randint(2, 12), 100
        cost, r = price * c, 100 - price * c
        q = (
            f"{name} buys {c} {item} that cost ${price} each and pays with a ${bill} bill. "
            f"How much change does {name} get?"
        )
        ans = (
            f"The {item} cost {c} * {price} = <<{c}*{price}={cost}>>{cost} dollars.\n"
            f"The change is {bill} - {cost} = <<{bill}-{cost}={r}>>{r} dollars.\n#### {r}"
        )
    else:  # share equally
        total = b * c
        q = (
            f"{name} has {total} {item} and shares them equally among {c} friends. "
            f"How many {item} does each friend get?"
        )
        ans = f"Each friend gets {total} / {c} = <<{total}/{c}={b}>>{b} {item}.\n#### {b}"
    return {"question": q, "answer": ans}


def make_rows(n: int, seed: int) -> list[dict[str, str]]:
    """`n` deterministic rows (same seed, same rows on every machine)."""
    rng = random.Random(seed)
    return [_problem(rng) for _ in range(n)]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- configs


@dataclass
class Setting:
    """One comparison: rows, shots and token budget (the same for both tools)."""

    label: str
    n_rows: int
    num_fewshot: int
    max_tokens: int
    repeats: int


@dataclass
class Inputs:
    """Files both tools read for one setting."""

    tmp: Path
    test: Path
    train: Path
    model: Path


def lmeval_task_yaml(inp: Inputs, setting: Setting, task: str, include_dir: Path, max_tokens: int) -> None:
    """lm-eval's installed gsm8k.yaml, verbatim but for the data source, shots and budget."""
    import lm_eval

    base = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml").read_text())
    base.pop("tag", None)  # keep our task out of lm-eval's own task groups
    base.pop("dataset_name", None)
    base.update(
        {
            "task": task,
            "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"train": str(inp.train), "test": str(inp.test)}},
            "training_split": "train",
            "fewshot_split": "train",
            "test_split": "test",
            "num_fewshot": setting.num_fewshot,  # lm-eval's default sampler, as the arle card's
        }
    )
    base["generation_kwargs"] = {**base["generation_kwargs"], "max_gen_toks": max_tokens}
    include_dir.mkdir(parents=True, exist_ok=True)
    (include_dir / f"{task}.yaml").write_text(yaml.safe_dump(base, sort_keys=False))


def arle_card(inp: Inputs) -> Path:
    """A copy of benchmarks/gsm8k.yaml whose source is the local train/test files."""
    card = yaml.safe_load((REPO / "benchmarks" / "gsm8k.yaml").read_text())
    card["name"] = "gsm8k_local"
    card["source"] = {
        "kind": "files",
        "path": inp.test.name,
        "splits": {"test": inp.test.name, "train": inp.train.name},
        "default_split": "test",
    }
    card.pop("fixture", None)
    path = inp.tmp / "gsm8k_local.yaml"
    path.write_text(yaml.safe_dump(card, sort_keys=False))
    return path


# ---------------------------------------------------------------- running


THREADS = 1  # set from --threads in main()


def _env(tmp: Path) -> dict[str, str]:
    """Offline, with caches in the temp folder; arle's own checkout first on the path.

    Both tools get the same torch thread count. The default is 1: on a shared 2-core
    machine (load 6-8 from other jobs) a 2-thread OpenMP decode step took 2.2 s against
    0.33 s with 1 thread (threads wait at barriers for a descheduled sibling), which
    would measure the neighbours, not the tools."""
    env = dict(os.environ)
    env.update(
        {
            "OMP_NUM_THREADS": str(THREADS),
            "MKL_NUM_THREADS": str(THREADS),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": str(tmp / "hf_home"),
            "HF_DATASETS_CACHE": str(tmp / "hf_datasets"),
            "TOKENIZERS_PARALLELISM": "false",
            "NO_COLOR": "1",
            "PYTHONPATH": os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        }
    )
    return env


@dataclass
class Timed:
    """One run's wall seconds and CPU seconds (user + system of the child process)."""

    wall: float
    cpu: float


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(cmd: list[str], tmp: Path, log: Path) -> Timed:
    """Run `cmd`, return its wall and CPU time; fail loudly with its log tail.

    CPU time is the load-robust figure: on a shared 2-core machine a descheduled run's
    wall time grows with the neighbours' load (27 s wall for 17 s of CPU was seen),
    its CPU time much less (both tools run one torch thread)."""
    t0, c0 = time.perf_counter(), _child_cpu()
    with log.open("w") as fh:
        proc = subprocess.run(cmd, cwd=tmp, env=_env(tmp), stdout=fh, stderr=subprocess.STDOUT)
    wall, cpu = time.perf_counter() - t0, _child_cpu() - c0
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise RuntimeError(f"{cmd[:4]} failed (exit {proc.returncode}):\n{tail}")
    return Timed(wall, cpu)


def run_arle(
    inp: Inputs, s: Setting, out: Path, *, limit: int | None = None, max_tokens: int | None = None
) -> tuple[Timed, dict[int, dict[str, str]]]:
    """One `arle eval` run; returns its times and {row index: {text, prompt}}."""
    bench = "gsm8k" if s.num_fewshot == 0 else str(arle_card(inp))
    cmd = [
        sys.executable,
        "-m",
        "arlecli",
        "eval",
        bench,
        "--model",
        str(inp.model),
        "--backend",
        "hf",
        "--num-fewshot",
        str(s.num_fewshot),
        "--max-tokens",
        str(max_tokens or s.max_tokens),
        "--batch-size",
        str(BATCH_SIZE),
        "--output",
        str(out),
        "--json",
    ]
    if s.num_fewshot == 0:  # the brief's form: the shipped card on local rows
        cmd += ["--data", str(inp.test)]
    if limit:
        cmd += ["--limit", str(limit)]
    timed = _timed(cmd, inp.tmp, out.with_suffix(".log"))
    texts = {}
    for line in (out / "samples.jsonl").read_text().splitlines():
        rec = json.loads(line)
        texts[int(rec["task_id"])] = {"text": rec["completion"], "prompt": rec["prompt"]}
    return timed, texts


def run_lmeval(
    inp: Inputs, s: Setting, out: Path, *, limit: int | None = None, max_tokens: int | None = None
) -> tuple[Timed, dict[int, dict[str, Any]]]:
    """One lm-eval run; returns its times and {doc_id: {text, filter -> extraction/score}}."""
    include = out.parent / f"{out.name}_tasks"
    lmeval_task_yaml(inp, s, TASK, include, max_tokens or s.max_tokens)
    cmd = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={inp.model},dtype=float32",
        "--tasks",
        TASK,
        "--include_path",
        str(include),
        "--num_fewshot",
        str(s.num_fewshot),
        "--batch_size",
        str(BATCH_SIZE),
        "--device",
        "cpu",
        "--output_path",
        str(out),
        "--log_samples",
    ]
    if limit:
        cmd += ["--limit", str(limit)]
    return _timed(cmd, inp.tmp, out.with_suffix(".log")), read_lmeval_samples(out)


def read_lmeval_samples(out: Path) -> dict[int, dict[str, Any]]:
    """lm-eval's --log_samples file: one line per doc (per filter in some versions)."""
    files = sorted(out.rglob(f"samples_{TASK}_*.jsonl"))
    if not files:
        raise RuntimeError(f"lm-eval wrote no samples file under {out}")
    docs: dict[int, dict[str, Any]] = {}
    for line in files[-1].read_text().splitlines():
        rec = json.loads(line)
        d = docs.setdefault(
            int(rec["doc_id"]),
            {
                "text": rec["resps"][0][0],
                "question": rec["doc"]["question"],
                "prompt": _lmeval_context(rec["arguments"]),
            },
        )
        filt = rec.get("filter")
        if isinstance(rec.get("filtered_resps"), dict):  # all filters in one record
            for name, val in rec["filtered_resps"].items():
                d[name] = {"extracted": val[0] if isinstance(val, list) else val}
        else:
            val = rec["filtered_resps"]
            d[filt] = {"extracted": val[0] if isinstance(val, list) else val, "score": rec.get("exact_match")}
    return docs


def _lmeval_context(arguments: Any) -> str:
    """The prompt lm-eval sent: {"gen_args_0": {"arg_0": ctx, ...}} or [[ctx, kwargs]]."""
    if isinstance(arguments, dict):
        return next(iter(arguments.values()))["arg_0"]
    return arguments[0][0]


# ---------------------------------------------------------------- comparison


def arle_extractions(text: str, target: str) -> dict[str, dict[str, Any]]:
    """arle's gsm8k filters and exact_match (the reward's code) on one completion."""
    from arlecli.rewards.math import FLEXIBLE_EXTRACT, GSM8K_IGNORE, STRICT_MATCH, exact_match

    out = {}
    for name, filt in (("strict-match", STRICT_MATCH), ("flexible-extract", FLEXIBLE_EXTRACT)):
        got = filt(text)
        out[name] = {"extracted": got, "score": float(exact_match(got, target, GSM8K_IGNORE, ignore_case=True))}
    return out


def compare(
    rows: list[dict[str, str]], arle: dict[int, dict[str, str]], lm: dict[int, dict[str, Any]]
) -> dict[str, Any]:
    """Per-sample agreement of prompts, texts, extractions and scores; both tools' mean scores."""
    if sorted(arle) != sorted(lm) or len(arle) != len(rows):
        raise RuntimeError(f"sample sets differ: arle {len(arle)} rows, lm-eval {len(lm)}, data {len(rows)}")
    diffs: list[dict[str, Any]] = []
    scores: dict[str, dict[str, float]] = {"arle": {}, "lm-eval": {}}
    same_text = same_prompt = 0
    for i, row in enumerate(rows):
        assert lm[i]["question"] == row["question"], f"lm-eval doc {i} is another question"
        a = arle_extractions(arle[i]["text"], row["answer"])
        same_text += arle[i]["text"] == lm[i]["text"]
        same_prompt += arle[i]["prompt"] == lm[i]["prompt"]
        for name in ("strict-match", "flexible-extract"):
            scores["arle"][name] = scores["arle"].get(name, 0.0) + a[name]["score"]
            lm_score = float(lm[i][name].get("score") or 0.0)
            scores["lm-eval"][name] = scores["lm-eval"].get(name, 0.0) + lm_score
            if a[name]["extracted"] != lm[i][name]["extracted"] or a[name]["score"] != lm_score:
                diffs.append(
                    {
                        "doc": i,
                        "filter": name,
                        "arle": a[name],
                        "lm-eval": lm[i][name],
                        "arle_text": arle[i]["text"],
                        "lm_text": lm[i]["text"],
                    }
                )
    n = len(rows)
    return {
        "n": n,
        "identical_prompts": same_prompt,
        "identical_texts": same_text,
        "extraction_or_score_mismatches": len(diffs),
        "mismatches": diffs[:10],
        "scores": {tool: {k: v / n for k, v in s.items()} for tool, s in scores.items()},
    }


def count_tokens(model: Path, texts: list[str]) -> int:
    """Generated tokens, counted the same way for both: re-tokenise the final text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    return sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)


# ---------------------------------------------------------------- orchestration


@dataclass
class Outcome:
    """Figures for one setting."""

    setting: dict[str, Any]
    arle_walls: list[float] = field(default_factory=list)
    lmeval_walls: list[float] = field(default_factory=list)
    arle_cpus: list[float] = field(default_factory=list)
    lmeval_cpus: list[float] = field(default_factory=list)
    arle_startup_s: float = 0.0
    lmeval_startup_s: float = 0.0
    arle_tokens: int = 0
    lmeval_tokens: int = 0
    agreement: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        a, m = statistics.median(self.arle_walls), statistics.median(self.lmeval_walls)
        a_cpu, m_cpu = statistics.median(self.arle_cpus), statistics.median(self.lmeval_cpus)
        tok_ratio = (self.arle_tokens / a) / (self.lmeval_tokens / m) if self.lmeval_tokens else 0.0
        same_scores = bool(
            self.agreement.get("extraction_or_score_mismatches") == 0
            and self.agreement["scores"]["arle"] == self.agreement["scores"]["lm-eval"]
        )
        return {
            **self.setting,
            "arle_wall_s": round(a, 2),
            "lmeval_wall_s": round(m, 2),
            "wall_ratio_arle_over_lmeval": round(a / m, 3),
            "arle_walls_s": [round(x, 2) for x in self.arle_walls],
            "lmeval_walls_s": [round(x, 2) for x in self.lmeval_walls],
            "arle_startup_s": round(self.arle_startup_s, 2),
            "lmeval_startup_s": round(self.lmeval_startup_s, 2),
            "arle_tokens": self.arle_tokens,
            "lmeval_tokens": self.lmeval_tokens,
            "arle_tok_per_s": round(self.arle_tokens / a, 2),
            "lmeval_tok_per_s": round(self.lmeval_tokens / m, 2),
            "arle_tok_per_s_after_startup": round(self.arle_tokens / max(a - self.arle_startup_s, 1e-9), 2),
            "lmeval_tok_per_s_after_startup": round(self.lmeval_tokens / max(m - self.lmeval_startup_s, 1e-9), 2),
            "tok_per_s_ratio_arle_over_lmeval": round(tok_ratio, 3),
            "arle_cpu_s": round(a_cpu, 2),
            "lmeval_cpu_s": round(m_cpu, 2),
            "arle_cpus_s": [round(x, 2) for x in self.arle_cpus],
            "lmeval_cpus_s": [round(x, 2) for x in self.lmeval_cpus],
            "arle_tok_per_cpu_s": round(self.arle_tokens / a_cpu, 2),
            "lmeval_tok_per_cpu_s": round(self.lmeval_tokens / m_cpu, 2),
            # issue 29 (issue 11's was 3x): >= 4x lm-eval's tokens/s (wall) with the same scores
            "target_met": bool(tok_ratio >= TARGET and same_scores),
            "agreement": self.agreement,
        }


def run_setting(s: Setting, model: Path, work: Path) -> Outcome:
    """Warm-up/start-up runs of both, then `repeats` interleaved full runs; compare samples."""
    tmp = work / s.label
    tmp.mkdir(parents=True)
    rows = make_rows(s.n_rows, seed=7)
    inp = Inputs(
        tmp, write_jsonl(tmp / "test.jsonl", rows), write_jsonl(tmp / "train.jsonl", make_rows(8, seed=11)), model
    )
    res = Outcome(setting=asdict(s))
    # Start-up (and warm-up: page cache, dataset cache): 1 row, 1 token.
    res.arle_startup_s = run_arle(inp, s, tmp / "arle_startup", limit=1, max_tokens=1)[0].wall
    res.lmeval_startup_s = run_lmeval(inp, s, tmp / "lm_startup", limit=1, max_tokens=1)[0].wall
    log(f"[{s.label}] start-up: arle {res.arle_startup_s:.1f}s, lm-eval {res.lmeval_startup_s:.1f}s")
    arle_texts: dict[int, dict[str, str]] = {}
    lm_docs: dict[int, dict[str, Any]] = {}
    for k in range(s.repeats):
        timed, texts = run_arle(inp, s, tmp / f"arle_{k}")
        res.arle_walls.append(timed.wall)
        res.arle_cpus.append(timed.cpu)
        if arle_texts and texts != arle_texts:
            log(f"[{s.label}] warning: arle repeat {k} produced different texts")
        arle_texts = texts
        timed, docs = run_lmeval(inp, s, tmp / f"lm_{k}")
        res.lmeval_walls.append(timed.wall)
        res.lmeval_cpus.append(timed.cpu)
        lm_docs = docs
        log(
            f"[{s.label}] repeat {k}: arle {res.arle_walls[-1]:.1f}s ({res.arle_cpus[-1]:.1f} CPU s), "
            f"lm-eval {timed.wall:.1f}s ({timed.cpu:.1f} CPU s), load {os.getloadavg()[0]:.1f}"
        )
    res.agreement = compare(rows, arle_texts, lm_docs)
    res.arle_tokens = count_tokens(model, [arle_texts[i]["text"] for i in sorted(arle_texts)])
    res.lmeval_tokens = count_tokens(model, [lm_docs[i]["text"] for i in sorted(lm_docs)])
    return res


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def machine(model: Path) -> dict[str, Any]:
    """Date, CPU, ISA, versions and the decode roofline at the runs' batch and threads."""
    import torch

    versions = package_versions(("arle", "lm_eval", "torch", "transformers", "datasets"))
    torch.set_num_threads(THREADS)
    return {
        "roofline": roofline(model, rows=(BATCH_SIZE,)),
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": THREADS,
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "versions": versions,
    }


def print_table(info: dict[str, Any], outcomes: list[dict[str, Any]]) -> None:
    """The raw figures and arle/lm-eval ratios, one block per setting."""
    print(
        f"eval vs lm-eval · {info['date']} · {info['cpu']} ({info['cores']} cores) · "
        + ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    )
    roof = info["roofline"]
    print("\n".join(roofline_lines(roof)))
    for o in outcomes:
        ag = o["agreement"]
        print(
            f"\n{o['label']}: {o['n_rows']} rows, {o['num_fewshot']}-shot, max {o['max_tokens']} tokens, "
            f"batch {BATCH_SIZE}, greedy, median of {o['repeats']}"
        )
        print(f"{'':28}{'arle':>12}{'lm-eval':>12}{'arle/lm-eval':>14}")
        rows = [
            ("wall s", o["arle_wall_s"], o["lmeval_wall_s"]),
            ("start-up s (1 row, 1 tok)", o["arle_startup_s"], o["lmeval_startup_s"]),
            ("generated tokens", o["arle_tokens"], o["lmeval_tokens"]),
            ("tokens/s (wall)", o["arle_tok_per_s"], o["lmeval_tok_per_s"]),
            ("tokens/s (wall - start-up)", o["arle_tok_per_s_after_startup"], o["lmeval_tok_per_s_after_startup"]),
            ("CPU s (user + sys)", o["arle_cpu_s"], o["lmeval_cpu_s"]),
            ("tokens per CPU s", o["arle_tok_per_cpu_s"], o["lmeval_tok_per_cpu_s"]),
            ("strict-match", ag["scores"]["arle"]["strict-match"], ag["scores"]["lm-eval"]["strict-match"]),
            ("flexible-extract", ag["scores"]["arle"]["flexible-extract"], ag["scores"]["lm-eval"]["flexible-extract"]),
        ]
        for name, a, m in rows:
            ratio = f"{a / m:.3f}" if m else "-"
            print(f"{name:28}{a:>12.4g}{m:>12.4g}{ratio:>14}")
        print(
            f"identical prompts: {ag['identical_prompts']}/{ag['n']}; identical completion texts: "
            f"{ag['identical_texts']}/{ag['n']}; extraction/score mismatches: "
            f"{ag['extraction_or_score_mismatches']}; target (arle tokens/s >= {TARGET:g} x lm-eval, same scores): "
            f"{'met' if o['target_met'] else 'MISSED'}"
        )
        a, m = o["arle_tok_per_s_after_startup"], o["lmeval_tok_per_s_after_startup"]
        print(
            f"of the batch-{BATCH_SIZE} decode bound ({roof['bound_tok_s'][BATCH_SIZE]} tok/s), tokens/s after "
            f"start-up (prefill and scoring included): arle {bound_fraction(roof, BATCH_SIZE, a):.0%}, "
            f"lm-eval {bound_fraction(roof, BATCH_SIZE, m):.0%}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke test: 8 rows 0-shot and 4 rows 5-shot, 1 repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--no-fewshot-run", action="store_true", help="skip the 5-shot comparison")
    p.add_argument("--output", type=Path, default=None, help="JSON path (default perf/results/...)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for both tools (see _env)")
    args = p.parse_args(argv)
    global THREADS
    THREADS = args.threads

    from arlecli.models import embedded_default_model

    model = embedded_default_model()
    if args.quick:
        settings = [Setting("0-shot", 8, 0, 64, 1)]
        if not args.no_fewshot_run:
            settings.append(Setting("5-shot", 4, 5, 32, 1))
    else:
        settings = [Setting("0-shot", args.rows, 0, args.max_tokens, args.repeats)]
        if not args.no_fewshot_run:  # longer prompts; fewer rows so the run stays short
            settings.append(Setting("5-shot", 32, 5, args.max_tokens, 1))
    info = machine(model)
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="arle-perf-lmeval-") as work:
        for s in settings:
            outcomes.append(run_setting(s, model, Path(work)).summary())
    print_table(info, outcomes)
    # --quick is a smoke test: it leaves the published figures alone unless --output is given
    out = args.output or (None if args.quick else RESULTS_DIR / "eval_vs_lmeval.json")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {"machine": info, "batch_size": BATCH_SIZE, "model": str(model.name), "settings": outcomes}, indent=2
            )
            + "\n"
        )
        print(f"\nwritten: {out}")
    return 0 if all(o["agreement"]["extraction_or_score_mismatches"] == 0 for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
