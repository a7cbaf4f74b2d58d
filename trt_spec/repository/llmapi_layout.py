"""The llmapi repository's layout and trtllm-serve's command line, as the llmapi flavor writes them
(:mod:`trt_spec.repository.flavors.llmapi`) and the PyTorch twin reads them back
(:mod:`trt_spec.repository.llmapi_twin`): the one place both take them from, so that the reader
does not import the writer.
"""

from __future__ import annotations

from trt_spec.runtime import tensors as T

LLMAPI_FLAVOR = "llmapi"

OPTIONS_FILE = "trtllm-serve.yaml"
COMMAND_FILE = "trtllm-serve.sh"
MODEL = T.TARGET  # "tensorrt_llm": upstream's llmapi model folder and config name
MODEL_YAML = f"{MODEL}/1/model.yaml"
# trtllm-serve's own defaults (tensorrt_llm/commands/serve.py @4c05a74891e4df8066f08ed4ce14b0972abe4e25:
# --host localhost, --port 8000); the script passes its arguments through after ours, and Click keeps
# the last value of an option given twice, so `trtllm-serve.sh --host 0.0.0.0` overrides.
HOST, PORT = "127.0.0.1", 8000
# The flag that names the options file, per line: --extra_llm_api_options in serve.py @4c05a748 and
# the 1.1 docs (nvidia.github.io/TensorRT-LLM/1.1.0rc2.post1/torch/auto_deploy/advanced/serving_with_trtllm_serve.html);
# --config in the current docs (nvidia.github.io/TensorRT-LLM/torch/auto_deploy/advanced/serving_with_trtllm_serve.html).
# Not verified: the first release that takes --config, and whether 1.3+ still takes the old name.
OPTIONS_FLAG = {"1.2": "--extra_llm_api_options", "1.3": "--config"}
