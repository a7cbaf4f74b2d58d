"""The container images the Kubernetes manifests run, and the GPU labels they select nodes by:
the one versions table of ``trt_spec.deploy`` (``trt-spec k8s --image`` / ``--gpu-product``
override each).

**The tensorrtllm flavor's image.** NVIDIA's ``nvcr.io/nvidia/tritonserver:<YY.MM>-trtllm-python-py3``
carries one TensorRT-LLM release, and a TensorRT-LLM engine loads only with the release that built
it (``trt_spec.engines.versions``): the image must be the one the engines were built in. What was
verified while writing this (2026-12):

- Triton's release compatibility matrix (docs.nvidia.com/deeplearning/triton-inference-server/
  user-guide/docs/introduction/compatibility.html, "Container Name: trtllm-python-py3") lists
  ``25.12-trtllm-python-py3`` with TensorRT-LLM 1.1.0 and ``25.11`` with 1.0.3.2510: no release up
  to 25.12 carries 1.2.x.
- The backend moved to TensorRT-LLM ``release/1.2`` (1.2.0rc8) in January 2026
  (triton-inference-server/tensorrtllm_backend PR 837, closed 2026-01-15 in favour of commit
  9de1fdd1adc7e994ef1bddac5c60c67d8885d5e8) and to the stable 1.2.1 in April 2026 (PR 853, merged
  2026-04-16).
- Which monthly container first shipped 1.2.x was NOT verified: the release notes of 26.xx found
  here (rel-26-02, rel-26-06, rel-26-10) were not readable past their introduction. So the default
  below is a candidate, marked unverified; ``trt-spec k8s`` says so when it is used, and
  ``--image`` names the container your engines were built in (``trt-spec build`` records its
  TensorRT-LLM version in each engine's ``manifest.json``; check it against the image's
  ``pip show tensorrt_llm``).

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


# The tensorrtllm flavor: NVIDIA's Triton container with TensorRT-LLM 1.2.x (see the module docstring).
TRTLLM_IMAGE = Image(
    ref="nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3",
    verified=False,
    source=(
        "unverified: TensorRT-LLM 1.2.x entered the backend in 2026-01 (tensorrtllm_backend PR 837); "
        "25.12 still carries 1.1.0 (Triton's compatibility matrix); which 26.xx release carries 1.2.x "
        "was not confirmed from NVIDIA's release notes"
    ),
)

# The torch flavor and the OpenAI sidecar: trt-spec itself, built from this checkout (docs/deploy.md).
TRT_SPEC_IMAGE = Image(
    ref=f"trt-spec:{__version__}",
    verified=True,
    source="built from this checkout: docs/deploy.md, 'The trt-spec image'",
)

# GPU feature discovery's nvidia.com/gpu.product values per spec `engine.gpu` (module docstring).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_PRODUCTS: dict[str, tuple[str, ...]] = {
    "h100": ("NVIDIA-H100-80GB-HBM3",),
    "h200": ("NVIDIA-H200",),
}
