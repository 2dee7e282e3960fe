"""`arle report`: real runs (a tiny-model eval, a 2-step GRPO run, a fake endpoint that answers
with script injections) rendered in a real headless Chromium (tests/helpers/chromium.py): no JavaScript
error, no request beyond the file itself, every chart drawn, every sample row there, filters
that work, hostile completions shown as text; and bad input refused in one line, untouched."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.chromium import Chromium, chromium_binary, png_colours
from helpers.cli import arle
from helpers.fake_openai import FakeOpenAIServer, Reply

LIMIT = 6
# A completion that tries every way out of the page's text: ending the data block, a new
# script, an HTML comment, an image whose error handler runs code, and a request (src=x).
HOSTILE = (
    '</script><script>window.__pwned = 1</script><!-- <img src=x onerror="window.__pwned = 2"> '
    '<iframe src="https://example.com/"></iframe> \u2028 &amp; = 99'
)


def _reply(body: dict) -> str:
    """Right answers to additions; the hostile text for subtractions."""
    text = json.dumps(body.get("messages") or body.get("prompt"))
    a, op, b = re.search(r"(\d) ([+-]) (\d) =", text).groups()
    return f"{a} + {b} = {int(a) + int(b)}" if op == "+" else HOSTILE


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Module-wide runs: a tiny-model eval (printing its report hint) and a fake-endpoint eval
    of the same tasks with hostile completions."""
    from helpers.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("runs")
    model = build_tiny_model(root / "model")
    tiny = arle(
        "eval",
        "one_digit_sums",
        "--model",
        str(model),
        "--limit",
        str(LIMIT),
        "--max-tokens",
        "8",
        "--output",
        str(root / "tiny"),
    )
    assert tiny.returncode == 0, tiny.stderr
    assert f"arle report {root / 'tiny'}" in tiny.stdout  # eval ends with the command that shows it
    with FakeOpenAIServer(_reply) as srv:
        hostile = arle(
            "eval",
            "one_digit_sums",
            "--base-url",
            srv.base_url,
            "--limit",
            str(LIMIT),
            "--output",
            str(root / "hostile"),
            "--json",
        )
    assert hostile.returncode == 0, hostile.stderr
    assert f"arle report {root / 'hostile'}" in hostile.stderr  # stdout stays JSON under --json
    json.loads(hostile.stdout)
    return {"model": model, "tiny": root / "tiny", "hostile": root / "hostile", "root": root}


@pytest.fixture(scope="module")
def train_run(runs, tmp_path_factory):
    """A 2-step GRPO run of the tiny model with held-out evals at steps 0 and 2 (test_train's shape)."""
    from helpers.train import TINY, train_in_process, varied_card

    root = tmp_path_factory.mktemp("train")
    run = root / "run"
    train_in_process(
        str(varied_card(root)),
        "--algo",
        "grpo",
        "--model",
        str(runs["model"]),
        *TINY,
        "--max-steps",
        "2",
        "--eval-limit",
        "3",
        "--set",
        "eval_max_tokens=8",
        "--output",
        str(run),
    )
    return run


@pytest.fixture(scope="module")
def browser():
    if chromium_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have chromium (.ci/run installs it with apt)")
        pytest.skip("no chromium on PATH (Debian: apt-get install -y chromium)")
    with Chromium() as b:
        yield b


def report(*args: str) -> Path:
    out = arle("report", *args)
    assert out.returncode == 0, out.stderr
    path = Path(re.search(r"report: (\S+)", out.stdout).group(1))
    assert path.is_file()
    return path


def clean_page(browser: Chromium, path: Path):
    """Open a report; it must render with no JS error and ask for nothing but itself."""
    page = browser.open_page(path)
    assert page.evaluate("document.body.dataset.ready") == "1", "the page's script did not finish"
    assert page.errors == []
    assert page.requests == [page.url], f"requests beyond the file: {page.requests}"
    return page


def charts(page) -> dict[str, int]:
    """Each chart div by name -> how many plotly traces were drawn into it (svg present)."""
    return page.evaluate("""Object.fromEntries([...document.querySelectorAll('div.chart')].map(d =>
        [d.dataset.name,
         d.classList.contains('js-plotly-plot') && d.querySelector('svg.main-svg') ? d.data.length : -1]))""")


def visible_rows(page, browser_index: int = 0) -> int:
    return page.evaluate(f"""[...document.querySelectorAll('div.browser')[{browser_index}]
        .querySelectorAll('details.sample')].filter(d => d.style.display !== 'none').length""")


def set_filter(page, value: str = "all", search: str = "") -> None:
    page.evaluate(f"""(() => {{ const b = document.querySelector('div.browser');
        const s = b.querySelector('select.filter'); s.value = {json.dumps(value)}; s.dispatchEvent(new Event('change'));
        const q = b.querySelector('input.search'); q.value = {json.dumps(search)}; q.dispatchEvent(new Event('input'));
        return true; }})()""")


def test_eval_report_renders_in_chromium(runs, browser, tmp_path):
    start = time.monotonic()
    path = report(str(runs["tiny"]))
    assert path == runs["tiny"] / "report.html"
    text = path.read_text()
    assert "cdn" not in re.sub(r"<script>.*?</script>", "", text, flags=re.S).lower()  # no CDN link outside the library
    assert text.count("Plotly.newPlot") == 1 and len(text) > 3_000_000  # plotly.js embedded, once

    page = clean_page(browser, path)
    assert page.evaluate("document.querySelector('.sample-count').dataset.total") == str(LIMIT)
    assert f"{LIMIT} samples" in page.evaluate("document.querySelector('.sample-count').textContent")
    drawn = charts(page)
    assert drawn == {"groups": 1}  # the per-group bars (addition / subtraction), drawn
    groups = page.evaluate("document.querySelector('[data-name=groups]').data[0].x")
    assert set(groups) <= {"addition", "subtraction"} and groups
    assert "Efficiency, cost and consistency" in page.evaluate("document.body.textContent")
    # The sample browser: one row per sample; the filters and the search narrow it.
    assert visible_rows(page) == LIMIT
    samples = [json.loads(line) for line in (runs["tiny"] / "samples.jsonl").read_text().split("\n") if line]
    right = sum(s["correct"] for s in samples)
    set_filter(page, "correct")
    assert visible_rows(page) == right
    set_filter(page, "wrong")
    assert visible_rows(page) == LIMIT - right
    set_filter(page, "all", samples[0]["id"])
    assert visible_rows(page) == 1
    body = page.evaluate("document.querySelector('details.sample .body').textContent")
    assert "extracted vs target" in body and "prompt" in body and str(samples[0]["target"]) in body
    set_filter(page)

    shot = page.screenshot(tmp_path / "eval.png", 1280, 1200)
    assert png_colours(shot) > 50  # a rendered page, not a blank one
    print(f"eval report in chromium: {time.monotonic() - start:.1f} s")


def test_training_report_renders_in_chromium(train_run, browser, tmp_path, capsys):
    path = report(str(train_run))
    page = clean_page(browser, path)
    drawn = charts(page)
    metrics = [json.loads(line) for line in (train_run / "metrics.jsonl").read_text().split("\n") if line]
    logged = {k for row in metrics for k, v in row.items() if isinstance(v, (int, float))}
    # A curve for each of reward, accuracy, KL, loss and tokens/s that the trainer logged (GRPO
    # with beta=0 logs no KL, and the page says so), and the held-out accuracy at each eval.
    expected = {f"train-{k}" for k in ("reward", "accuracy", "kl", "loss", "tokens_per_second") if k in logged}
    assert {"train-reward", "train-loss", "train-tokens_per_second"} <= expected
    assert drawn == {**{name: 1 for name in expected}, "heldout": 1}
    assert page.evaluate("document.querySelector('[data-name=heldout]').data[0].x") == [0, 2]
    text = page.evaluate("document.body.textContent")
    if "kl" not in logged:
        assert "Not logged by this run's trainer: kl" in text
    assert "Before and after training" in text and "Paired comparison" in text
    rewards = (train_run / "rewards.jsonl").read_text().splitlines()
    assert page.evaluate("document.querySelectorAll('table.step-samples tbody tr').length") == len(rewards)
    # The last held-out eval's samples, in the browser.
    assert visible_rows(page) == 3
    shot = page.screenshot(tmp_path / "train.png", 1280, 1400)
    assert png_colours(shot) > 50


def test_train_ends_with_the_report_command(train_run, runs, tmp_path, capsys):
    from helpers.train import TINY, train_in_process, varied_card

    capsys.readouterr()
    train_in_process(
        str(varied_card(tmp_path)),
        "--algo",
        "grpo",
        "--model",
        str(runs["model"]),
        *TINY,
        "--max-steps",
        "1",
        "--eval-limit",
        "1",
        "--set",
        "eval_max_tokens=4",
        "--output",
        str(tmp_path / "run"),
    )
    assert f"arle report {tmp_path / 'run'}" in capsys.readouterr().out


def test_hostile_completions_render_as_text(runs, browser):
    path = report(str(runs["hostile"]))
    text = path.read_text()
    assert "window.__pwned" in text  # the sample is in the file ...
    assert "<script>window.__pwned" not in text and "<img src=x" not in text  # ... but never as markup
    page = clean_page(browser, path)  # src=x and the iframe would show up as requests
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.evaluate("document.querySelectorAll('img, iframe').length") == 0
    shown = page.evaluate("""[...document.querySelectorAll('details.sample .body pre')]
        .map(p => p.textContent).filter(t => t.includes('__pwned'))""")
    assert HOSTILE in shown  # exactly the model's text, character for character
    samples = [json.loads(line) for line in (runs["hostile"] / "samples.jsonl").read_text().split("\n") if line]
    set_filter(page, "correct")
    assert visible_rows(page) == sum(s["correct"] for s in samples) > 0


def test_collapsed_rows_say_question_target_extracted_and_sort(runs, browser):
    """Every collapsed row shows what was asked, the target and what was extracted; the sort
    control reorders the rows by task, reward, latency or length."""
    from arlecli.compare import natural_key
    from arlecli.report import question_of

    page = clean_page(browser, report(str(runs["tiny"])))
    samples = [json.loads(line) for line in (runs["tiny"] / "samples.jsonl").read_text().split("\n") if line]
    summaries = page.evaluate(
        "[...document.querySelectorAll('details.sample')].map(d => "
        "[d.querySelector('.sid').textContent, d.querySelector('summary').textContent])"
    )
    assert [sid for sid, _ in summaries] == [s["id"] for s in samples]
    for (_, text), s in zip(summaries, samples):
        assert question_of(s["prompt"]) in text and f"target {s['target']}" in text
        assert f"extracted {s['extracted'] if s['extracted'] is not None else '(none)'}" in text

    def order(key: str) -> list[str]:
        return page.evaluate(f"""(() => {{ const s = document.querySelector('div.browser select.sort');
            s.value = {json.dumps(key)}; s.dispatchEvent(new Event('change'));
            return [...document.querySelectorAll('div.browser details.sample .sid')].map(e => e.textContent); }})()""")

    by_id = {s["id"]: s for s in samples}
    assert order("task") == sorted(by_id, key=lambda i: (natural_key(by_id[i]["task_id"]), by_id[i]["sample"]))
    rewards = [by_id[i]["reward"] for i in order("reward")]
    assert rewards == sorted(rewards, reverse=True)
    lengths = [by_id[i]["completion_tokens"] for i in order("length")]
    assert lengths == sorted(lengths, reverse=True)
    assert order("order") == [s["id"] for s in samples]


def test_agent_turns_render(runs, browser, tmp_path):
    """A multi-turn run (FrozenLake, tiny model): every turn's completion and observation is shown."""
    run = tmp_path / "lake"
    out = arle(
        "eval", "frozenlake", "--model", str(runs["model"]), "--limit", "2", "--max-tokens", "6", "--output", str(run)
    )
    assert out.returncode == 0, out.stderr
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().split("\n") if line]
    page = clean_page(browser, report(str(run)))
    assert page.evaluate("document.querySelectorAll('details.sample').length") == 2
    assert page.evaluate("document.querySelectorAll('details.sample')[0].querySelectorAll('.turn').length") == len(
        samples[0]["turns"]
    )
    first = samples[0]["turns"][0]
    shown = page.evaluate(
        "[...document.querySelectorAll('details.sample')[0].querySelectorAll('.turn pre')].map(p => p.textContent)"
    )
    assert first["completion"] in shown
    observation = first.get("observation")
    if observation:  # text, or the chat messages the environment answered with
        texts = [observation] if isinstance(observation, str) else [m["content"] for m in observation]
        assert all(any(t in pre for pre in shown) for t in texts)


def test_several_runs_side_by_side(runs, browser, tmp_path):
    out = tmp_path / "both.html"
    path = report(str(runs["tiny"]), str(runs["hostile"]), "-o", str(out))
    assert path == out
    page = clean_page(browser, path)
    assert page.evaluate("document.querySelectorAll('table.comparison tbody tr').length") == 2
    assert page.evaluate("document.querySelectorAll('table.paired tbody tr').length") >= 1
    drawn = charts(page)
    assert drawn["compare-groups"] == 2  # one bar trace per run in the comparison chart
    assert page.evaluate("document.querySelectorAll('section.run').length") == 2
    assert page.evaluate("document.querySelectorAll('div.browser').length") == 2


def test_report_without_arguments_shows_the_newest_run(runs, tmp_path):
    import shutil

    for name in ("tiny", "hostile"):
        shutil.copytree(runs[name], tmp_path / "runs" / name)
    os.utime(tmp_path / "runs" / "hostile" / "results.json")  # the one finished last
    out = arle("report", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "runs" / "hostile" / "report.html").is_file()
    empty = arle("report", cwd=tmp_path / "runs" / "tiny")  # no runs/ there
    assert empty.returncode == 2 and "no run under runs/" in empty.stderr
    run = tmp_path / "runs" / "tiny"
    before = {name: (run / name).read_bytes() for name in ("samples.jsonl", "meta.json")}
    for own in before:  # -o naming the run's own files: refused, the run untouched
        clash = arle("report", str(run), "-o", str(run / own), cwd=tmp_path)
        assert clash.returncode == 2 and "is part of the run" in clash.stderr, clash.stderr
    assert {name: (run / name).read_bytes() for name in before} == before


def test_samples_beyond_the_cap_are_counted_not_embedded(runs):
    from arlecli.report import build_report

    text = build_report([runs["tiny"]], sample_cap=2)
    data = json.loads(
        re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S).group(1)
    )
    assert len(data["browsers"][0]["samples"]) == 2 and data["browsers"][0]["omitted"] == LIMIT - 2
    assert f"embeds the first 2 of {LIMIT} samples" in text and f"the {LIMIT - 2} left out" in text


def _snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() + str(p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("damage", ["not_a_run", "missing", "torn_samples", "no_results", "damaged_line"])
def test_bad_input_is_one_line_exit_2_and_untouched(runs, tmp_path, damage):
    import shutil

    run = tmp_path / "run"
    if damage == "not_a_run":
        run.mkdir()
        (run / "notes.txt").write_text("hello\n")
    elif damage != "missing":
        shutil.copytree(runs["tiny"], run)
        (run / "report.html").unlink(missing_ok=True)
        samples = run / "samples.jsonl"
        if damage == "torn_samples":
            with open(samples, "a") as f:
                f.write('{"id": "half')
        elif damage == "no_results":
            (run / "results.json").unlink()
        elif damage == "damaged_line":
            lines = samples.read_text().splitlines(keepends=True)
            samples.write_text(lines[0] + "not json\n" + "".join(lines[1:]))
    before = _snapshot(run) if run.exists() else None
    out = arle("report", str(run))
    assert out.returncode == 2, out
    assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("error: "), out.stderr
    assert str(run) in out.stderr
    assert (_snapshot(run) if run.exists() else None) == before  # nothing written, nothing changed


# Thinking (issue 24) -----------------------------------------------------------------------

THINK_LIMIT = 12


def _thinker(body: dict) -> Reply:
    """A reasoning endpoint (reasoning_content beside content) whose thought grows with the
    numbers and is cut where it passes the request's max_tokens: then no answer. One thought
    tries to become markup."""
    a, op, b = (
        int(x) if x.isdigit() else x for x in re.search(r"(\d) ([+-]) (\d) =", json.dumps(body["messages"])).groups()
    )
    answer = a + b if op == "+" else a - b
    thought = f"{a} {op} {b}: " + "hm, " * (a + b) + ("<img src=x onerror=alert(1)>" if a == b else "")
    budget = body.get("max_tokens") or 10**6
    if len(thought) > budget:
        return Reply("", reasoning_content=thought[:budget], finish_reason="length")
    return Reply(f"{answer}", reasoning_content=thought)


@pytest.fixture(scope="module")
def thinking_runs(tmp_path_factory):
    """The same tasks against a thinking endpoint at two budgets (max_tokens 60 and 400)."""
    root = tmp_path_factory.mktemp("thinking")
    with FakeOpenAIServer(_thinker) as srv:
        for budget in (60, 400):
            out = arle(
                "eval",
                "one_digit_sums",
                "--base-url",
                srv.base_url,
                "--limit",
                str(THINK_LIMIT),
                "--max-tokens",
                str(budget),
                "--output",
                str(root / f"budget-{budget}"),
            )
            assert out.returncode == 0, out.stderr
    return {"short": root / "budget-60", "long": root / "budget-400"}


def test_thinking_is_folded_above_each_answer_with_a_chart_of_accuracy_against_its_length(thinking_runs, browser):
    run = thinking_runs["short"]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().split("\n") if line]
    assert all(isinstance(s["thinking"], str) for s in samples)
    assert any(s["thinking_cut"] for s in samples) and not all(s["thinking_cut"] for s in samples)
    page = clean_page(browser, report(str(run)))
    assert page.evaluate("document.querySelectorAll('img, iframe').length") == 0
    # One folded thought per sample, closed, right above the answer, saying its tokens and cut.
    folded = page.evaluate("""[...document.querySelectorAll('details.sample')].map(d => {
        const t = d.querySelector('.body details.thinking');
        return t && {open: t.open, summary: t.querySelector('summary').textContent,
                     text: t.querySelector('pre').textContent, cut: t.dataset.cut,
                     next: t.nextElementSibling.textContent,
                     after: t.nextElementSibling.nextElementSibling.textContent};
    })""")
    assert len(folded) == len(samples)
    for s, shown in zip(samples, folded):
        assert shown is not None and shown["open"] is False
        assert shown["text"] == s["thinking"]  # exactly the model's text, markup and all
        assert f"{s['thinking_tokens']} tokens" in shown["summary"]
        assert ("cut: no answer" in shown["summary"]) == s["thinking_cut"] == (shown["cut"] == "1")
        assert shown["next"] == "answer" and shown["after"] == s["completion"]
    cut_rows = page.evaluate("[...document.querySelectorAll('details.sample summary .cut')].length")
    assert cut_rows == sum(s["thinking_cut"] for s in samples)
    # The search finds a sample by its thinking.
    set_filter(page, "all", samples[0]["thinking"][:12])
    assert visible_rows(page) >= 1
    set_filter(page)

    drawn = charts(page)
    assert drawn == {"groups": 1, "thinking-length": 1}
    fig = page.evaluate(
        "(() => { const d = document.querySelector('[data-name=\"thinking-length\"]').data[0];"
        " return {x: d.x, y: d.y, n: d.customdata.map(c => c[0])}; })()"
    )
    table = page.evaluate(
        "[...document.querySelectorAll('table.thinking-buckets tbody tr')]"
        ".map(r => [...r.cells].map(c => c.textContent))"
    )
    assert [row[0] for row in table] == fig["x"] and 2 <= len(table) <= 6
    assert sum(fig["n"]) == len(samples) == sum(int(row[1]) for row in table)
    by_tokens = sorted(samples, key=lambda s: s["thinking_tokens"])
    # The shortest thoughts answered, the longest were cut: accuracy falls along the axis.
    assert fig["y"][0] > fig["y"][-1]
    assert by_tokens[0]["correct"] and by_tokens[-1]["thinking_cut"]


def test_two_thinking_budgets_side_by_side_show_accuracy_against_compute(thinking_runs, browser, tmp_path):
    path = report(str(thinking_runs["short"]), str(thinking_runs["long"]), "-o", str(tmp_path / "budgets.html"))
    page = clean_page(browser, path)
    rows = page.evaluate(
        "[...document.querySelectorAll('table.compute tbody tr')].map(r => [...r.cells].map(c => c.textContent))"
    )
    head = page.evaluate("[...document.querySelectorAll('table.compute thead th')].map(c => c.textContent)")
    assert len(rows) == 2 and "thinking tokens (mean)" in head
    col = head.index("thinking tokens (mean)")
    assert float(rows[0][col].replace(",", "")) < float(rows[1][col].replace(",", ""))
    assert rows[0][-1] == "" and rows[1][-1].startswith("+")  # the longer budget gained, paired with the first
    assert charts(page)["compute"] == 1
    xs = page.evaluate("document.querySelector('[data-name=compute]').data[0].x")
    assert len(xs) == 2 and xs[0] < xs[1]


def test_a_training_runs_step_completions_fold_their_thinking():
    """rewards.jsonl lines that thought show their thinking folded above the completion."""
    from arlecli.report import step_completions

    run = SimpleNamespace(
        rewards=[
            {
                "step": 1,
                "task_id": "t",
                "reward": 0.0,
                "correct": False,
                "completion": "",
                "thinking": "<b>hm</b>",
                "thinking_cut": True,
                "thinking_tokens": 7,
            },
            {"step": 1, "task_id": "u", "reward": 1.0, "correct": True, "completion": "42"},
        ],
        path=Path("run"),
    )
    html = step_completions(run)
    assert html.count('<details class="thinking"') == 1
    assert "<summary>thinking (7 tokens, cut: no answer)</summary><pre>&lt;b&gt;hm&lt;/b&gt;</pre>" in html
