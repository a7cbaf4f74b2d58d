#!/usr/bin/env python3
"""Print a cache key for a deployment's compiled engines.

The key covers everything a rebuild would depend on: the plan (spec values, model configs,
exact trtllm-build argv), the download lock file (resolved model commits), the installed
tensorrt_llm and TensorRT versions, and the GPU's compute capability. CI caches `engines/`
under this key; `trt-spec build` re-checks each engine's manifest after a restore anyway.

    python scripts/engine_cache_key.py --spec examples/llama8b-1b-h200.yaml
"""

from __future__ import annotations

import argparse
import hashlib
import json

from trt_spec.engines.build import query_gpus
from trt_spec.engines.versions import installed_versions
from trt_spec.layout import lock_path
from trt_spec.plan import make_plan
from trt_spec.spec import load_spec


def compute_capability() -> str:
    """The GPUs' compute capabilities ("9.0"; comma-separated where they differ), or "no-gpu"."""
    return ",".join(sorted({gpu.compute_capability for gpu in query_gpus()})) or "no-gpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    args = parser.parse_args()
    spec = load_spec(args.spec)
    lock = lock_path(spec)
    inputs = {
        "plan": make_plan(spec).to_json(),
        "lock": lock.read_text() if lock.is_file() else None,
        **installed_versions(),  # None where a package is absent
        "compute_capability": compute_capability(),
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    print(f"engines-{spec.name}-{digest[:32]}")


if __name__ == "__main__":
    main()
