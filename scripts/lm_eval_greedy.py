"""Run lm-eval's ``local-completions`` model with its defaults against a served OpenAI endpoint,
on a task whose targets are the target model's own greedy continuations: exact_match 1.0 means
every speculative completion equals the target alone, through lm-eval's own requests (token-id
prompts, ``stop`` = its ``until``, one request at a time).

Nothing is downloaded: the task reads a JSON-lines file this script writes from the packaged
prompts, and its references come from the spec's target checkpoint (transformers, greedy).
lm-eval runs from its own installation (``--lm-eval``; it needs ``transformers`` for the
tokenizer, not torch). Usage, with ``trt-spec serve --repo model_repo --openai-port 8080`` running:

    python scripts/lm_eval_greedy.py --spec examples/pystdlib-demo.yaml \\
        --base-url http://127.0.0.1:8080/v1 --model model_repo --lm-eval /path/to/venv/bin/lm_eval
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

TASK = "trt_spec_greedy_continuations"
UNTIL = "\n\n"


def references(spec_path: Path, count: int, prompt_tokens: int, max_gen_toks: int) -> list[dict[str, str]]:
    """The packaged prompts and the target's greedy continuation of each, cut at ``UNTIL`` as lm-eval cuts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trt_spec.bench.prompts import prompt_texts
    from trt_spec.repository.writer import hf_checkpoint_dir
    from trt_spec.spec import load_spec

    spec = load_spec(spec_path)
    path = hf_checkpoint_dir(spec, "target")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    docs = []
    for prompt in prompt_texts(count, prompt_tokens):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=max_gen_toks, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        docs.append({"prompt": prompt, "completion": text.split(UNTIL)[0]})
    return docs


def task_yaml(data_file: Path, max_gen_toks: int) -> str:
    return "\n".join(
        [
            f"task: {TASK}",
            "dataset_path: json",
            "dataset_kwargs:",
            "  data_files:",
            f"    test: {json.dumps(str(data_file))}",
            "test_split: test",
            "output_type: generate_until",
            'doc_to_text: "{{prompt}}"',
            'doc_to_target: "{{completion}}"',
            "generation_kwargs:",
            f"  until: [{json.dumps(UNTIL)}]",
            f"  max_gen_toks: {max_gen_toks}",
            "  do_sample: false",
            "  temperature: 0",
            "metric_list:",
            "  - metric: exact_match",
            "    aggregation: mean",
            "    higher_is_better: true",
            "",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=Path("examples/pystdlib-demo.yaml"))
    parser.add_argument("--base-url", required=True, help="the OpenAI endpoint, e.g. http://127.0.0.1:8080/v1")
    parser.add_argument("--model", required=True, help="the served model name (serve's --openai-model-name)")
    parser.add_argument("--tokenizer", type=Path, default=Path("model_repo/spec_preprocessing/1/tokenizer"))
    parser.add_argument("--lm-eval", default="lm_eval", help="lm-eval's executable")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=120)
    parser.add_argument("--max-gen-toks", type=int, default=48)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="trt_spec_lm_eval_") as tmp:
        work = Path(tmp)
        data = work / "docs.jsonl"
        docs = references(args.spec, args.prompts, args.prompt_tokens, args.max_gen_toks)
        data.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
        (work / f"{TASK}.yaml").write_text(task_yaml(data, args.max_gen_toks))
        command = [
            args.lm_eval,
            "run",
            "--model",
            "local-completions",
            "--model_args",
            f"model={args.model},base_url={args.base_url.rstrip('/')}/completions,tokenizer={args.tokenizer.resolve()}",
            "--tasks",
            TASK,
            "--include_path",
            str(work),
            "--output_path",
            str(work / "out"),
            "--log_samples",
        ]
        print("$", " ".join(command), flush=True)
        subprocess.run(command, check=True)
        [results_file] = sorted((work / "out").rglob("results_*.json"))
        results = json.loads(results_file.read_text())["results"][TASK]
        score = next(value for key, value in results.items() if key.startswith("exact_match,"))
        lengths = [len(doc["completion"]) for doc in docs]
        print(
            f"lm-eval local-completions (defaults), {len(docs)} prompts: exact_match {score:.3f} against the "
            f"target's greedy text ({sum(1 for n in lengths if n)} non-empty, {min(lengths)}-{max(lengths)} characters)"
        )
        return 0 if score == 1.0 and all(lengths) else 1


if __name__ == "__main__":
    sys.exit(main())
