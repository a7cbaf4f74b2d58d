"""Serve a tensorrtllm-flavor repository on CPU: its engine models run in the backend emulator.

:func:`emulated_repository` copies a written repository and swaps, in each ``backend:
"tensorrtllm"`` model, only ``backend`` to ``python``; every other field of the config (the
parameters the real backend reads included) stays as written, so the emulator
(:mod:`trt_spec.runtime.trtllm_emulator`, which checks them as TensorRT-LLM 1.2.x's C++ backend
does) sees the config the GPU server would. The model's version directory gets the emulator's
``model.py``, a copy of the runtime package, and ``emulated_engine.json``: what the engine the
spec's plan builds would be (:class:`~trt_spec.runtime.trtllm_emulator.EngineFacts`). The
written repository is never modified.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from trt_spec.errors import RepositoryError
from trt_spec.plan import Plan, engine_max_input_len, make_plan
from trt_spec.plan.memory import KV_BLOCK_TOKENS
from trt_spec.repository import configs
from trt_spec.repository.writer import MODELS_SOURCE_DIR, copy_runtime, hf_checkpoint_dir
from trt_spec.runtime import tensors as T
from trt_spec.spec import Spec

ENGINE_BACKEND = "tensorrtllm"
EMULATOR_BACKEND = "python"
EMULATOR_SOURCE = MODELS_SOURCE_DIR / "tensorrtllm_emulator"
ROLE_OF = {model: role for role, model in T.ENGINE_MODELS.items()}  # engine model name -> role
VERSION = "1"


def engine_facts(spec: Spec, role: str, plan: Plan | None = None, *, hf_model_dir: str | None = None):
    """What ``trtllm-build`` makes of the spec's plan for ``role``, as the emulator takes it; the
    logits come from ``hf_model_dir`` (default: the role's downloaded checkpoint)."""
    from trt_spec.runtime.trtllm_emulator import EngineFacts

    plan = plan or make_plan(spec)
    k = spec.num_draft_tokens if role == "target" else 0
    return EngineFacts(
        role=role,
        hf_model_dir=hf_model_dir or str(hf_checkpoint_dir(spec, role)),
        max_batch_size=spec.engine.max_batch_size,
        max_input_len=engine_max_input_len(spec),  # the loop's longest sequence, as plan builds it
        max_seq_len=spec.engine.max_seq_len + k,  # trtllm-build adds max_draft_len to the target's
        max_draft_len=k,
        vocab_size=plan.target.model.vocab_size,
        gather_generation_logits=spec.speculative.acceptance == "probabilistic",
        max_num_tokens=plan.engine(role).max_num_tokens,
        tokens_per_block=KV_BLOCK_TOKENS,
    )


def emulated_repository(repo: str | Path, spec: Spec, workdir: str | Path) -> Path:
    """A copy of the tensorrtllm-flavor repository ``repo`` in ``workdir`` whose engine models run
    in the emulator; returns the copy's path (``workdir/<repo's name>``).

    Raises:
        RepositoryError: ``repo`` has no tensorrtllm models, a config does not parse, an engine
            model is neither ``tensorrt_llm`` nor ``tensorrt_llm_draft``, or the copy's path exists.
    """
    source = Path(repo).resolve()
    engines = []
    for path in sorted(source.glob("*/config.pbtxt")):
        try:
            config = configs.read_config(path)
        except Exception as exc:  # noqa: BLE001 - text_format.ParseError, OSError: named, one line
            raise RepositoryError(
                f"cannot read {path}: {exc}; rewrite the repository with `trt-spec repo --spec F`"
            ) from None
        if config.backend == ENGINE_BACKEND:
            name = config.name or path.parent.name
            if name not in ROLE_OF:
                raise RepositoryError(
                    f"{path}: a tensorrtllm model named {name!r}; the emulator serves {' and '.join(ROLE_OF)} only"
                )
            engines.append((name, config))
    if not engines:
        raise RepositoryError(
            f"{source} has no tensorrtllm models, so there is nothing to emulate; serve it without "
            "--emulate-tensorrtllm, or write the tensorrtllm flavor: `trt-spec repo --spec F --flavor tensorrtllm`"
        )
    plan = make_plan(spec)
    facts = {name: engine_facts(spec, ROLE_OF[name], plan) for name, _ in engines}  # before copying: fail early

    served = Path(workdir).resolve() / source.name
    if served.exists():
        raise RepositoryError(f"{served} exists; emulated_repository copies {source} into a directory without it")
    shutil.copytree(source, served, symlinks=True)
    for name, config in engines:
        config.backend = EMULATOR_BACKEND
        configs.write_config(config, served)
        version = served / name / VERSION
        version.mkdir(exist_ok=True)
        shutil.copy2(EMULATOR_SOURCE / "model.py", version / "model.py")
        copy_runtime(version)
        (version / facts[name].FILE).write_text(json.dumps(facts[name].to_json(), indent=2) + "\n")
    return served


def emulated_models(served: str | Path) -> list[str]:
    """The models of a copy :func:`emulated_repository` made whose engines are emulated."""
    from trt_spec.runtime.trtllm_emulator import EngineFacts

    return sorted(path.parent.parent.name for path in Path(served).glob(f"*/{VERSION}/{EngineFacts.FILE}"))
