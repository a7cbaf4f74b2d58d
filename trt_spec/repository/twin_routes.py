"""What a flavor's repository reads back as when its own server is not Triton (:class:`TwinRoute`):
made by the flavor's reader (:meth:`~trt_spec.repository.flavors.Flavor.twin_route`, e.g.
:mod:`trt_spec.repository.llmapi_twin`), served by ``serve`` on the PyTorch twin
(:mod:`trt_spec.serving.llmapi_route`). Its own module, below the flavors and their readers, so
that a reader does not import the flavors' registry that calls it.
"""

from __future__ import annotations

from dataclasses import dataclass

from trt_spec.spec import Spec


@dataclass(frozen=True)
class TwinRoute:
    """A repository whose own server is not Triton (the llmapi flavor's ``trtllm-serve``), read back as
    that server would read it, for ``serve`` to run on the PyTorch twin: a torch-flavor repository
    written from ``spec``, behind the OpenAI endpoint that server would open."""

    flavor: str  # the flavor that read it
    spec: Spec  # the pair, K and the limits, for the torch flavor
    sampled_verification: str  # how sampled drafts are verified: "rejection_sampling" | "token_match"
    server: str  # the route's own server, as it would run (e.g. "trtllm-serve, TensorRT-LLM 1.3+")
    model_name: str  # the name that server serves the model as (/v1/models)
    port: int  # that server's port
    iteration_stats: bool  # its /metrics reports iteration statistics
    notes: tuple[str, ...] = ()  # what the twin does differently, for `serve` to say


SAMPLED_VERIFICATIONS = ("rejection_sampling", "token_match")
