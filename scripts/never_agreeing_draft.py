"""A spec whose draft never agrees with its target: the spec's draft architecture with random
weights (seeded), for measuring what speculation costs where it cannot pay.

    python scripts/never_agreeing_draft.py --spec examples/pystdlib-wide.yaml -o /tmp/adversarial
    trt-spec bench --local --spec /tmp/adversarial/spec.yaml -k 4 --temperature 0 --no-hf --prompts 8

The bench then shows fixed K (every step pays a draft and a K + 1 verification for ~1 token)
against adaptive K, which falls to plain decoding (K 0) and probes (docs/methods.md, "Adaptive K
down to plain decoding"), both beside plain decoding in the same run.

A random draft is the limiting case of a draft from another domain: its greedy choice is the
target's about once per vocabulary size, so acceptance is ~0 at any temperature.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import torch
import yaml
from transformers import AutoConfig, AutoModelForCausalLM

from trt_spec.spec import load_spec

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def write_never_agreeing_spec(spec_path: Path, out: Path, seed: int = 0) -> Path:
    """``out/spec.yaml``: the spec with its draft replaced by a randomly initialised copy (``out/draft``).

    Raises:
        SystemExit: the spec has no draft section (nothing to replace).
    """
    spec = load_spec(spec_path)
    if spec.draft is None:
        raise SystemExit(f"{spec_path} has no draft section: a never-agreeing draft replaces the spec's draft")
    source = spec.draft.local_dir(spec.source_dir)
    if source is None:
        raise SystemExit(f"the draft {spec.draft.model!r} is not a local directory; run `trt-spec download` first")
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".draft-", dir=out))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source))
    model.save_pretrained(staging)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, staging / name)
    draft_dir = out / "draft"
    if draft_dir.exists():
        shutil.rmtree(draft_dir)
    staging.rename(draft_dir)  # whole, or not at all

    data = yaml.safe_load(spec_path.read_text())
    data["name"] = f"{spec.name}-never-agreeing"
    target = spec.target.local_dir(spec.source_dir)
    data["target"]["model"] = str(target.resolve()) if target else spec.target.model
    data["draft"]["model"] = str(draft_dir.resolve())
    path = out / "spec.yaml"
    partial = path.with_suffix(".yaml.partial")
    partial.write_text(yaml.safe_dump(data, sort_keys=False))
    partial.rename(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, required=True, help="a spec with a local draft checkpoint")
    parser.add_argument("-o", "--out", type=Path, required=True, help="where to write draft/ and spec.yaml")
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    args = parser.parse_args()
    path = write_never_agreeing_spec(args.spec, args.out, args.seed)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
