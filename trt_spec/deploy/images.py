"""The container images the Kubernetes manifests run, and the GPU labels they select nodes by:
the one versions table of ``trt_spec.deploy`` (``trt-spec k8s --image`` / ``--gpu-product``
override each).

**The tensorrtllm flavor's image.** NVIDIA's ``nvcr.io/nvidia/tritonserver:<YY.MM>-trtllm-python-py3``
carries one TensorRT-LLM release, and a TensorRT-LLM engine loads only with the release that built
it (``trt_spec.engines.versions``): the image must be the one the engines were built in. What the
sources say (read 2026-12-04 through the project's search index):

- Triton's release compatibility matrix (docs.nvidia.com/deeplearning/triton-inference-server/
  user-guide/docs/introduction/compatibility.html, "Container Name: trtllm-python-py3") lists
  ``25.12-trtllm-python-py3`` with TensorRT-LLM 1.1.0 and ``25.11`` with 1.0.3.2510: no release up
  to 25.12 carries 1.2.x. The matrix as read stops at 25.12.
- **26.07 carries TensorRT-LLM 1.2.1**: NVIDIA's own Triton tutorial for the PyTorch backend,
  triton-inference-server/tutorials ``Popular_Models_Guide/Qwen2.5-VL/qwen2_5_vl_trtllm_guide.md``
  @9511717dc28753922ce5125b36ea1ded031a7a3f: "It uses ``nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3``
  ... The 26.07 container ships TensorRT-LLM v1.2.1" (an earlier copy of the same guide tabulates
  the container, Triton 2.71.0 and TensorRT-LLM 1.2.1 as validated end to end, and calls 26.07 the
  newest ``-trtllm-python-py3`` tag then).
- **26.02 is not a 1.2.x image**: a third-party packaging of ``26.02-trtllm-python-py3``'s contents
  (a Flox environment README in the search index, repository not resolved) lists ``tensorrt_llm
  1.1.0`` inside it, and a public benchmark script pairs 26.02 with ``TRTLLM_VERSION=v1.1.0``; the
  26.02 release notes were not readable past their introduction. The previous default (26.02)
  was therefore wrong for 1.2.x engines.
- Not verified: which release between 26.03 and 26.06 first shipped 1.2.x, and what 26.08 and
  later carry. The backend moved to ``release/1.2`` (1.2.0rc8) in January 2026
  (triton-inference-server/tensorrtllm_backend PR 837, superseded by commit
  9de1fdd1adc7e994ef1bddac5c60c67d8885d5e8) and to the stable 1.2.1 in April 2026 (PR 853,
  merged 2026-04-16), which fits 26.07 carrying 1.2.1.

Engines must be built by the image's release: ``trt-spec build`` records its TensorRT-LLM version
in each engine's ``manifest.json``; check it against the image's ``pip show tensorrt_llm``.

**The llmapi flavor's image.** TensorRT-LLM's own release container,
``nvcr.io/nvidia/tensorrt-llm/release:<version>``, whose tag is the TensorRT-LLM version (the
``trtllm-serve`` of that release). Pinned to ``1.2.1``, the stable 1.2 release (tagged ``v1.2.1``
in NVIDIA/TensorRT-LLM, the tag the tutorial above checks out for 26.07's backend files; the
container ``release:1.2.1`` is named by several public deployment scripts and notes, one dating
its multi-arch publication on NGC to 2026-04-20). The NGC catalog page itself was not read, so the
tag is marked unverified. No stable 1.3 release was found (only ``1.3.0rcN`` tags), so the default
line is 1.2.x: the options file is written for 1.2.x (``--extra_llm_api_options``) when the
deployment writes the repository.

**The torch flavor's image.** A CPU deployment of the PyTorch twin runs ``trt-spec serve`` (the
Triton server bundled in nvidia-pytriton, with ``serve``'s supervision and drain), so its image is
Python with ``trt-spec[triton,openai]`` installed: built from this checkout with the Dockerfile in
docs/deploy.md on ``python:3.11-slim-bookworm`` (Debian 12, the system ``serve``'s bundled server
was set up on, docs/design.md "Facts measured"). The same image runs the OpenAI endpoint beside
the GPU server (a sidecar), since NVIDIA's image has no trt-spec.

**GPU labels.** NVIDIA's GPU feature discovery labels each GPU node ``nvidia.com/gpu.product`` with
the product name ``nvidia-smi`` reports, spaces replaced by dashes (NVIDIA/k8s-device-plugin,
``internal/lm/resource.go``, sanitised product name; quoted with that link in several public
manifests: "NVIDIA H100 80GB HBM3" becomes "NVIDIA-H100-80GB-HBM3"). ``trt_spec/gpus.py`` records
the H100 SXM's name as "NVIDIA H100 80GB HBM3"; the H200 SXM reports "NVIDIA H200", labelled
``NVIDIA-H200`` in public cluster manifests (e.g. NVIDIA's network-operator ``l8k`` examples, a
Dynamo H200 recipe). Other SKUs (H100 PCIe "NVIDIA-H100-PCIe", H100 NVL, H200 NVL) carry other
names: pass ``--gpu-product`` for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from trt_spec import __version__


@dataclass(frozen=True)
class Image:
    """One container image and how sure we are of it."""

    ref: str
    verified: bool
    source: str  # where the claim comes from, or why it is unverified
    trtllm_version: str | None = None  # the TensorRT-LLM release it carries


# The tensorrtllm flavor: NVIDIA's Triton container with TensorRT-LLM 1.2.x (see the module docstring).
TRTLLM_IMAGE = Image(
    ref="nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3",
    verified=True,
    source=(
        "triton-inference-server/tutorials Popular_Models_Guide/Qwen2.5-VL/qwen2_5_vl_trtllm_guide.md "
        "@9511717dc28753922ce5125b36ea1ded031a7a3f: 'The 26.07 container ships TensorRT-LLM v1.2.1' (read 2026-12-04)"
    ),
    trtllm_version="1.2.1",
)

# The llmapi flavor: TensorRT-LLM's release container, trtllm-serve on the PyTorch backend (module docstring).
TRTLLM_RELEASE_IMAGE = Image(
    ref="nvcr.io/nvidia/tensorrt-llm/release:1.2.1",
    verified=False,
    source=(
        "the tag is the TensorRT-LLM version (v1.2.1, the stable 1.2 release); the image is named by public "
        "deployment scripts, NGC's catalog page was not read (2026-12-04)"
    ),
    trtllm_version="1.2.1",
)

# The torch flavor and the OpenAI sidecar: trt-spec itself, built from this checkout (docs/deploy.md).
TRT_SPEC_IMAGE = Image(
    ref=f"trt-spec:{__version__}",
    verified=True,
    source="built from this checkout: docs/deploy.md, 'The trt-spec image'",
)

# The server image per flavor launcher (Flavor.launcher): what `trt-spec k8s` runs without --image.
SERVER_IMAGES: dict[str, Image] = {
    "tritonserver": TRTLLM_IMAGE,
    "trtllm-serve": TRTLLM_RELEASE_IMAGE,
    "trt-spec-serve": TRT_SPEC_IMAGE,
}

# GPU feature discovery's nvidia.com/gpu.product values per spec `engine.gpu` (module docstring).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_PRODUCTS: dict[str, tuple[str, ...]] = {
    "h100": ("NVIDIA-H100-80GB-HBM3",),
    "h200": ("NVIDIA-H200",),
}
