"""Kubernetes objects for a spec's deployment, as plain dicts, and the kustomization that holds them.

One replica is one server on the plan's GPUs or on CPU, as the spec's flavor says
(:attr:`Flavor.launcher <trt_spec.repository.flavors.Flavor.launcher>` and ``needs_gpus``; no flavor
name is compared here): ``tritonserver`` (tensorrtllm flavor: NVIDIA's Triton TensorRT-LLM
container, Triton in the backend's orchestrator mode under ``mpirun``, as ``serve`` runs it),
``trt-spec-serve`` (torch flavor: ``trt-spec serve`` in the trt-spec image, CPU) or ``trtllm-serve``
(llmapi flavor: TensorRT-LLM's release container, ``trtllm-serve`` on the PyTorch backend). The set,
after NVIDIA's TensorRT-LLM autoscaling tutorial (triton-inference-server/tutorials,
``Deployment/Kubernetes/TensorRT-LLM_Autoscaling_and_Load_Balancing``: ``chart/templates/
deployment.yaml``, ``horizontal-pod-autoscaler.yaml``, ``pod-monitor.yaml`` at commits
0665326cd1cbceed69aa1f6de59ffc9332b6f2cc / d459ddd7d19566c8c34778056c62e45ee28b446e /
3f7025cd005acf0945f5577bdcc491f27b1687e6, and its README's ``triton-metrics_prometheus-rule.yaml``):
a Deployment, a Service, a PodDisruptionBudget, a PodMonitor that scrapes the server's metrics, a
PrometheusRule recording the series to scale on (Triton: ``triton:queue_compute:ratio``, time in
Triton's queues over time computing; trtllm-serve: mean time a finished request waited in its
queue), the prometheus-adapter rule that exposes it to the custom metrics API (a ConfigMap), and an
``autoscaling/v2`` HorizontalPodAutoscaler on it. docs/deploy.md says what each is for.
"""

from __future__ import annotations

import math
import re
import secrets
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trt_spec import atomic
from trt_spec.deploy.images import GPU_PRODUCT_LABEL, GPU_PRODUCTS, SERVER_IMAGES, TRT_SPEC_IMAGE
from trt_spec.errors import RepositoryError, TrtSpecError
from trt_spec.plan import Plan
from trt_spec.repository import flavors, llm_args
from trt_spec.repository.flavors.llmapi import OPTIONS_FILE, serve_argv
from trt_spec.repository.flavors.llmapi import PORT as LLMAPI_PORT
from trt_spec.serving.server import DEFAULT_PORTS, RESTRICTABLE_APIS, restriction_args
from trt_spec.serving.trtllm import EngineModel, orchestrator_command

Obj = dict[str, Any]

# The recorded series the HPA scales on: the tutorial's name, so its prometheus-adapter setup and
# dashboards keep working.
QUEUE_COMPUTE_METRIC = "triton:queue_compute:ratio"
# trtllm-serve's: seconds a request waited in the executor's queue, mean over the requests finished
# in the last minute, per pod (from its request_queue_time_seconds histogram, below).
QUEUE_TIME_METRIC = "trtllm:request_queue_time_seconds:mean"
# trtllm-serve's Prometheus series (tensorrt_llm/metrics/collector.py, MetricsCollector): served at
# /prometheus/metrics on the API port, mounted only when the LLM arguments set return_perf_metrics
# (tensorrt_llm/serve/openai_server.py @00057725d9a6591f033e44f31c219e2426827bb7, register_routes ->
# mount_metrics; /metrics itself answers JSON iteration statistics, not Prometheus text). The request
# queue-time histogram ("Histogram of time spent in WAITING phase for request") is the one queue
# metric in every version read: "request_queue_time_seconds" @89fd9b74ab7ae753b4c6b3db25a400dca7ea54a0
# (the first Prometheus support, NVIDIA/TensorRT-LLM PR 5785, merged 2025-08), prefixed
# "trtllm_request_queue_time_seconds" in the 2026 copies (@050f80def8df236e326949c8bd9dee10fd896a83,
# which also has a trtllm_num_requests_waiting gauge, needing enable_iter_perf_stats as well; not
# found in the older copies, so not used). The rule matches both names.
TRTLLM_QUEUE_SERIES = "(trtllm_)?request_queue_time_seconds"
TRTLLM_METRICS_PATH = "/prometheus/metrics"
TRTLLM_SERVE_PORT = LLMAPI_PORT  # trtllm-serve's one port: OpenAI API, /health, /metrics (llmapi flavor's)
TRTLLM_SERVE_HEALTH = "/health"
ADMIN_SECRET_KEY = "admin-key"  # the key in the admin Secret; its value is the restricted APIs' header value
ADMIN_ENV = "TRT_SPEC_ADMIN_KEY"  # the container variable holding it; Kubernetes expands $(VAR) in args
ADMIN_ENV_FILE = "admin.env"  # the secretGenerator's input, written beside the manifests (random, kept on rewrite)
OPENAI_PORT = 9000  # the OpenAI endpoint's Service port, when asked for
# A start's fixed part: the container, mpirun, Triton, the python stubs and tokenizers (the engines'
# bytes come on top, read at --load-throughput). The torch flavor loads checkpoints on CPU in
# `serve`'s own ready timeout (300 s by default). trtllm-serve's fixed part is larger: the PyTorch
# backend starts its MPI workers, builds the model, captures CUDA graphs for the batch sizes of
# cuda_graph_config and warms up before the port opens (not measured here; NVIDIA's Qwen2.5-VL
# tutorial above reports about a minute for a 3B model on one GPU).
STARTUP_FIXED_S = 120
TORCH_STARTUP_S = 300
TRTLLM_SERVE_STARTUP_FIXED_S = 300
STARTUP_PERIOD_S = 10
PRESTOP_SLEEP_S = 5  # endpoints and kube-proxy take the pod out of the Service before the server refuses
STOP_MARGIN_S = 10  # after the drain: Triton's unload, TensorRT-LLM's workers, serve's own 5 s stop
# The python backend's shared memory (/dev/shm): every stub's region holds the tensors of its
# requests in flight. Sized for the largest ones the loop moves per sequence (fp32 logits of K + 1
# target and K draft positions, token arrays of max_seq_len), for a whole batch, x4 for the copies
# in and out and the regions' growth, plus each stub's default region; at least 1 GiB.
SHM_MIN_BYTES = 1 << 30
SHM_PER_STUB_BYTES = 64 << 20
SHM_STUBS = 12  # the pipeline's python model instances, with room to spare
GIB = 1 << 30
# trtllm-serve: no python backend; /dev/shm is for NCCL's and MPI's intra-node transports between
# the tp ranks. NVIDIA's tutorial runs its one-GPU llmapi container with --shm-size=2g; 2 GiB per GPU
# here (not measured).
TRTLLM_SERVE_SHM_PER_GPU = 2 * GIB

FILES = {
    "Deployment": "deployment.yaml",
    "Service": "service.yaml",
    "PodDisruptionBudget": "pdb.yaml",
    "HorizontalPodAutoscaler": "hpa.yaml",
    "PodMonitor": "podmonitor.yaml",
    "PrometheusRule": "prometheusrule.yaml",
    "ConfigMap": "prometheus-adapter-rules.yaml",
}


class DeployError(TrtSpecError, ValueError):
    """Options that cannot make a deployment, or a repository that does not fit the mount."""


@dataclass(frozen=True)
class DeployOptions:
    """What ``trt-spec k8s`` takes beyond the spec (docs/deploy.md, "What to change for a cluster")."""

    name: str | None = None  # the objects' name; default: the spec's name
    image: str | None = None  # the server's image; default: the flavor's in trt_spec.deploy.images
    trt_spec_image: str | None = None  # the trt-spec image (torch flavor, OpenAI sidecar)
    gpu_products: tuple[str, ...] = ()  # nvidia.com/gpu.product values; default: the spec's GPU's
    pvc: str | None = None  # the claim holding the repository and engines; default: <name>-models
    mount_path: str = "/models"
    min_replicas: int = 1
    max_replicas: int = 4
    hpa_target: str = "1"  # per replica, averaged over pods: Triton's queue/compute ratio; trtllm-serve's queue seconds
    openai: bool = False
    drain_timeout_s: int = 25  # serve's default: inside Kubernetes' default 30 s grace period
    client_apis: tuple[str, ...] = ()  # restricted Triton APIs opened to every client
    load_throughput_mb_s: float = 250.0  # how fast a replica reads its engines from the volume
    prometheus_labels: Mapping[str, str] = field(default_factory=lambda: {"release": "prometheus"})
    # trtllm-serve: its TensorRT-LLM release (default: the image's, from its tag or the versions table),
    # which picks the options file's line and flag; and whether the options file the pods read sets
    # return_perf_metrics: true (its Prometheus metrics, which the autoscaling needs).
    trtllm_version: str | None = None
    perf_metrics: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise DeployError(
                f"replicas: need 1 <= --min-replicas <= --max-replicas; got {self.min_replicas} and {self.max_replicas}"
            )
        if self.load_throughput_mb_s <= 0:
            raise DeployError(f"--load-throughput must be positive; got {self.load_throughput_mb_s}")
        if not self.mount_path.startswith("/"):
            raise DeployError(f"--mount-path must be absolute; got {self.mount_path!r}")
        quantity = re.fullmatch(r"(\d+(?:\.\d+)?)(m?)", self.hpa_target)
        if quantity is None or float(quantity.group(1)) <= 0:
            raise DeployError(
                f"--hpa-target must be a positive Kubernetes quantity such as 1, 1.5 or 500m; got {self.hpa_target!r}"
            )
        unknown = [api for api in self.client_apis if api not in RESTRICTABLE_APIS]
        if unknown:
            raise DeployError(f"unknown client API {unknown[0]!r}: choose from {', '.join(RESTRICTABLE_APIS)}")
        if self.trtllm_version is not None:
            try:
                llm_args.version_line(self.trtllm_version)
            except RepositoryError as exc:
                raise DeployError(f"--trtllm-version: {exc}") from None


@dataclass(frozen=True)
class Deployment:
    """The objects of one deployment, and the facts they were made from (for the checks and the notes)."""

    name: str
    flavor: str
    launcher: str  # the flavor's launcher (Flavor.launcher): what the server container runs
    objects: list[Obj]
    kustomization: Obj
    repo_path: str  # the repository as the pod sees it
    engines_path: str  # the spec's paths.engines as the pod sees it (trt-spec repo --engines-mount)
    checkpoints_path: str  # the torch and llmapi flavors' checkpoints as the pod sees them (<path>/<role>)
    gpus: int
    startup_budget_s: int
    shm_bytes: int
    image: str
    notes: list[str]
    trtllm_version: str | None = None  # trtllm-serve: the TensorRT-LLM release its options are written for

    @property
    def trtllm_line(self) -> str | None:
        """The TensorRT-LLM line (``llm_args.TRTLLM_VERSIONS``) of ``trtllm_version``."""
        return llm_args.version_line(self.trtllm_version) if self.trtllm_version else None

    def kind(self, kind: str) -> Obj:
        """The one object of ``kind``."""
        found = [obj for obj in self.objects if obj["kind"] == kind]
        if len(found) != 1:
            raise KeyError(f"{len(found)} objects of kind {kind}")
        return found[0]


@dataclass(frozen=True)
class _Pod:
    """What every server container is made from."""

    plan: Plan
    options: DeployOptions
    name: str
    image: str
    trt_spec_image: str
    mount: str
    repo_path: str
    engines_path: str
    checkpoints_path: str
    gpus: int
    budget: int
    trtllm_version: str | None


@dataclass(frozen=True)
class _Server:
    """How one launcher (``Flavor.launcher``) is deployed."""

    container: Callable[[_Pod], Obj]
    startup_fixed_s: int  # before the model bytes, read at --load-throughput
    reads_model_bytes: bool  # the start reads the weights from the volume (else a fixed budget)
    shm: Callable[[Plan], int]
    service_ports: Callable[[DeployOptions], list[Obj]]
    autoscaling: Callable[[_Pod, Obj, Mapping[str, str]], list[Obj]]  # (pod, labels, common) -> objects
    writable_logs: bool = False  # an emptyDir at /var/log/trt-spec (serve's log file)
    admin_secret: bool = False  # the restricted APIs' key comes from a generated Secret
    openai_sidecar: bool = False  # --openai runs the OpenAI app beside the server (else the server has it)
    loads_checkpoints: bool = False  # the server reads the Hugging Face checkpoints from <mount>/checkpoints


def dns_name(text: str) -> str:
    """``text`` as a DNS-1123 label (what Deployment and Service names must be), at most 40
    characters so that the names derived from it fit."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40].strip("-")
    if not name:
        raise DeployError(f"cannot make a Kubernetes name of {text!r}: pass --name")
    return name


def engine_bytes(plan: Plan) -> int:
    """Both engines' weights, every rank: what a replica reads from the volume at start (the
    llmapi flavor reads the same weights from the two checkpoints)."""
    memory = plan.memory
    draft = memory.draft.weights_bytes * memory.draft.tp_size if memory.draft else 0  # none for prompt lookup
    return memory.target.weights_bytes * memory.target.tp_size + draft


def startup_budget_s(plan: Plan, launcher: str, load_throughput_mb_s: float) -> int:
    """Seconds a replica may take from start to ready before Kubernetes restarts it: the launcher's
    fixed start, plus twice the weights' bytes at ``load_throughput_mb_s`` (a shared volume read by
    several replicas at once is slower than alone); ``trt-spec serve``: its ready timeout."""
    server = SERVERS[launcher]
    if not server.reads_model_bytes:
        return server.startup_fixed_s
    load = engine_bytes(plan) / (load_throughput_mb_s * 1e6)
    return int(math.ceil((server.startup_fixed_s + 2 * load) / STARTUP_PERIOD_S) * STARTUP_PERIOD_S)


def shm_bytes(plan: Plan) -> int:
    """The /dev/shm the python backend's stubs may use, rounded up to GiB (see SHM_MIN_BYTES)."""
    spec = plan.spec
    k = spec.num_draft_tokens
    per_sequence = 4 * plan.target.model.vocab_size * (2 * k + 1) + 4 * 4 * spec.engine.max_seq_len
    wanted = 4 * spec.engine.max_batch_size * per_sequence + SHM_STUBS * SHM_PER_STUB_BYTES
    return max(SHM_MIN_BYTES, int(math.ceil(wanted / GIB)) * GIB)


def trtllm_serve_shm_bytes(plan: Plan) -> int:
    """trtllm-serve's /dev/shm: TRTLLM_SERVE_SHM_PER_GPU per GPU of the plan."""
    return TRTLLM_SERVE_SHM_PER_GPU * max(1, len(plan.memory.gpus))


def engine_models(plan: Plan, engines_path: str) -> list[EngineModel]:
    """The repository's two TensorRT-LLM models as the pod sees them: target rank r on GPU r, the
    draft's ranks on the GPUs the memory plan puts them on (``tensorrt_llm``/``tensorrt_llm_draft``)."""
    spec = plan.spec
    target_gpus = tuple(range(spec.target.tp_size))
    models = [EngineModel("tensorrt_llm", Path(engines_path) / spec.name / "target", target_gpus)]
    if spec.draft is not None:  # no draft engine for prompt lookup
        draft_gpus = tuple(range(spec.draft.tp_size))  # the memory plan puts draft rank r beside target rank r
        models.append(EngineModel("tensorrt_llm_draft", Path(engines_path) / spec.name / "draft", draft_gpus))
    return models


def image_trtllm_version(image: str) -> str | None:
    """The TensorRT-LLM version a ``tensorrt-llm/release:<version>`` image's tag names, else None."""
    match = re.search(r"tensorrt-llm/release:v?(\d+\.\d+[0-9A-Za-z.]*)", image)
    return match.group(1) if match else None


def build(plan: Plan, options: DeployOptions | None = None) -> Deployment:
    """The deployment of ``plan``'s spec: every object, and the kustomization naming their files.

    Raises:
        DeployError: a flavor no launcher here deploys, or options that do not fit.
    """
    options = options or DeployOptions()
    spec = plan.spec
    flavor = flavors.get(spec.triton.flavor)
    server = SERVERS.get(flavor.launcher)
    if server is None:
        raise DeployError(
            f"flavor {flavor.name!r} is launched by {flavor.launcher!r}, which `trt-spec k8s` does not deploy "
            f"(it deploys {', '.join(SERVERS)})"
        )
    name = dns_name(options.name or spec.name)
    mount = options.mount_path.rstrip("/") or "/"
    repo_path = f"{mount}/model_repo"
    gpus = len(plan.memory.gpus) if flavor.needs_gpus else 0
    budget = startup_budget_s(plan, flavor.launcher, options.load_throughput_mb_s)
    shm = server.shm(plan)
    notes: list[str] = []
    default_image = SERVER_IMAGES[flavor.launcher]
    trt_spec_image = options.trt_spec_image or TRT_SPEC_IMAGE.ref
    if default_image is TRT_SPEC_IMAGE:
        image = options.image or trt_spec_image
    else:
        image = options.image or default_image.ref
        if options.image is None and not default_image.verified:
            notes.append(
                f"image {image} is not verified ({default_image.source}); pass --image to name the container you use"
            )
    trtllm_version = None
    if flavor.takes_trtllm_version:
        trtllm_version = options.trtllm_version or image_trtllm_version(image) or default_image.trtllm_version
    pod = _Pod(
        plan=plan,
        options=options,
        name=name,
        image=image,
        trt_spec_image=trt_spec_image,
        mount=mount,
        repo_path=repo_path,
        engines_path=f"{mount}/engines",
        checkpoints_path=f"{mount}/checkpoints",
        gpus=gpus,
        budget=budget,
        trtllm_version=trtllm_version,
    )
    labels = {
        "app.kubernetes.io/name": "trt-spec",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "server",
    }
    common = {"app.kubernetes.io/name": "trt-spec", "app.kubernetes.io/instance": name}
    grace = PRESTOP_SLEEP_S + options.drain_timeout_s + STOP_MARGIN_S

    container = server.container(pod)
    container["volumeMounts"] = [
        {"name": "models", "mountPath": mount, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ] + ([{"name": "logs", "mountPath": "/var/log/trt-spec"}] if server.writable_logs else [])
    container["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_S)]}}}
    containers = [container]
    if server.openai_sidecar and options.openai:
        containers.append(_openai_sidecar(spec.name, trt_spec_image, repo_path))

    pod_spec: Obj = {
        "terminationGracePeriodSeconds": grace,
        "containers": containers,
        "volumes": [
            {
                "name": "models",
                "persistentVolumeClaim": {"claimName": options.pvc or f"{name}-models", "readOnly": True},
            },
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(shm)}},
        ]
        + ([{"name": "logs", "emptyDir": {}}] if server.writable_logs else []),
    }
    if gpus:
        products = list(options.gpu_products or GPU_PRODUCTS[spec.engine.gpu])
        pod_spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": GPU_PRODUCT_LABEL, "operator": "In", "values": products}]}
                    ]
                }
            }
        }
        pod_spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]

    deployment: Obj = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "replicas": options.min_replicas,
            "selector": {"matchLabels": dict(labels)},
            # A new replica must be ready before an old one goes: never below serving capacity
            # (needs room for one more replica's GPUs during a rollout).
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "progressDeadlineSeconds": budget + 600,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }
    service: Obj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": dict(common)},
        "spec": {"type": "ClusterIP", "selector": dict(labels), "ports": server.service_ports(options)},
    }
    pdb: Obj = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "labels": dict(common)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": dict(labels)}},
    }
    autoscaling = server.autoscaling(pod, labels, common)
    if not autoscaling:
        notes.append(
            "no autoscaling: trtllm-serve exports Prometheus metrics (/prometheus/metrics) only when its options "
            "set return_perf_metrics: true, which `trt-spec repo` does not write; add it to the repository's "
            f"{OPTIONS_FILE} and pass --repo to get the HPA on request queue time (docs/deploy.md)"
        )
    objects = [deployment, service, pdb, *autoscaling]
    kustomization: Obj = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [FILES[obj["kind"]] for obj in objects],
    }
    if server.admin_secret and _restricted(options):
        kustomization["secretGenerator"] = [{"name": f"{name}-admin", "envs": [ADMIN_ENV_FILE]}]
        kustomization["generatorOptions"] = {"disableNameSuffixHash": True}
    if server.loads_checkpoints:
        notes.append(
            f"{flavor.name} flavor: the server loads the Hugging Face checkpoints from {pod.checkpoints_path}/target "
            f"and {pod.checkpoints_path}/draft on the volume (`--write-repo` writes a repository naming them)"
        )
    return Deployment(
        name=name,
        flavor=flavor.name,
        launcher=flavor.launcher,
        objects=objects,
        kustomization=kustomization,
        repo_path=repo_path,
        engines_path=pod.engines_path,
        checkpoints_path=pod.checkpoints_path,
        gpus=gpus,
        startup_budget_s=budget,
        shm_bytes=shm,
        image=image,
        notes=notes,
        trtllm_version=trtllm_version,
    )


def _triton_autoscaling(pod: _Pod, labels: Mapping[str, str], common: Mapping[str, str]) -> list[Obj]:
    """Triton's metrics port, the queue/compute ratio recorded and exposed, the HPA on it."""
    return _autoscaling(pod, labels, common, "metrics", "/metrics", QUEUE_COMPUTE_METRIC, queue_compute_expr(pod.name))


def _trtllm_serve_autoscaling(pod: _Pod, labels: Mapping[str, str], common: Mapping[str, str]) -> list[Obj]:
    """trtllm-serve's /prometheus/metrics on its API port, the mean queue time recorded and exposed,
    the HPA on it; none unless the options set return_perf_metrics (no metrics to scale on)."""
    if not pod.options.perf_metrics:
        return []
    return _autoscaling(pod, labels, common, "http", TRTLLM_METRICS_PATH, QUEUE_TIME_METRIC, queue_time_expr(pod.name))


def _autoscaling(
    pod: _Pod, labels: Mapping[str, str], common: Mapping[str, str], port: str, path: str, metric: str, expr: str
) -> list[Obj]:
    options, name = pod.options, pod.name
    monitoring_labels = {**common, **options.prometheus_labels}
    pod_monitor: Obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": name, "labels": dict(monitoring_labels)},
        "spec": {
            "selector": {"matchLabels": dict(labels)},
            "podMetricsEndpoints": [{"port": port, "path": path, "interval": "15s"}],
        },
    }
    rule: Obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": name, "labels": dict(monitoring_labels)},
        "spec": {"groups": [{"name": f"trt-spec-{name}", "rules": [{"record": metric, "expr": expr}]}]},
    }
    adapter: Obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-prometheus-adapter-rules", "labels": dict(common)},
        "data": {"config.yaml": yaml.safe_dump(adapter_config(metric), sort_keys=False)},
    }
    hpa: Obj = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "labels": dict(common)},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": options.min_replicas,
            "maxReplicas": options.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": metric},
                        "target": {"type": "AverageValue", "averageValue": options.hpa_target},
                    },
                }
            ],
            # One replica at a time each way: a GPU replica takes minutes to start, and a scale-down
            # drains its streams; down only after ten quiet minutes.
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": 600,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}],
                },
            },
        },
    }
    return [hpa, pod_monitor, rule, adapter]


def _pod_matcher(name: str) -> str:
    return f'pod=~"{name}-[a-z0-9]+-[a-z0-9]+"'


def queue_compute_expr(name: str) -> str:
    """PromQL: per pod of this Deployment, Triton's queue time over its compute time (all models),
    over the last minute (the tutorial's ratio, summed over a pod's models before dividing)."""
    pods = _pod_matcher(name)
    return (
        f"sum by (namespace, pod) (rate(nv_inference_queue_duration_us{{{pods}}}[1m]))"
        f" / clamp_min(sum by (namespace, pod) (rate(nv_inference_compute_infer_duration_us{{{pods}}}[1m])), 1)"
    )


def queue_time_expr(name: str) -> str:
    """PromQL: per pod of this Deployment, the mean seconds the requests finished in the last minute
    waited in trtllm-serve's queue (its queue-time histogram's sum over its count; 0 when none finished)."""
    pods = _pod_matcher(name)
    series = TRTLLM_QUEUE_SERIES
    return (
        f'sum by (namespace, pod) (rate({{__name__=~"{series}_sum",{pods}}}[1m]))'
        f' / clamp_min(sum by (namespace, pod) (rate({{__name__=~"{series}_count",{pods}}}[1m])), 0.001)'
    )


def adapter_config(metric: str = QUEUE_COMPUTE_METRIC) -> Obj:
    """prometheus-adapter's rule exposing the recorded series per pod to the custom metrics API."""
    return {
        "rules": [
            {
                "seriesQuery": f'{metric}{{namespace!="",pod!=""}}',
                "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
                "name": {"matches": f"^{re.escape(metric)}$", "as": metric},
                "metricsQuery": "avg(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
            }
        ]
    }


def _restricted(options: DeployOptions) -> list[str]:
    return [api for api in RESTRICTABLE_APIS if api not in options.client_apis]


def _probes(port: str, budget: int, ready_path: str = "/v2/health/ready", live_path: str = "/v2/health/live") -> Obj:
    """The server's health endpoints (Triton's by default): startup allows ``budget`` seconds for
    every model to load; readiness (Triton runs with strict readiness) takes a replica out of the
    Service within ~10 s; liveness restarts a server that stops answering for 2 minutes (long enough
    for `serve` to restart Triton after a decoupled model's process died: 15-45 s measured,
    docs/operating.md)."""
    ready = {"path": ready_path, "port": port}
    return {
        "startupProbe": {
            "httpGet": dict(ready),
            "periodSeconds": STARTUP_PERIOD_S,
            "timeoutSeconds": 5,
            "failureThreshold": budget // STARTUP_PERIOD_S,
        },
        "readinessProbe": {"httpGet": dict(ready), "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 2},
        "livenessProbe": {
            "httpGet": {"path": live_path, "port": port},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 12,
        },
    }


def _container_ports(openai: bool) -> list[Obj]:
    ports = [
        {"name": key, "containerPort": DEFAULT_PORTS[key], "protocol": "TCP"} for key in ("http", "grpc", "metrics")
    ]
    if openai:
        ports.append({"name": "openai", "containerPort": OPENAI_PORT, "protocol": "TCP"})
    return ports


def _triton_service_ports(options: DeployOptions) -> list[Obj]:
    """Triton's HTTP, gRPC (h2c) and metrics ports, and the OpenAI endpoint's with --openai."""
    ports = [
        {"name": "http", "port": DEFAULT_PORTS["http"], "targetPort": "http", "protocol": "TCP"},
        {
            "name": "grpc",
            "port": DEFAULT_PORTS["grpc"],
            "targetPort": "grpc",
            "protocol": "TCP",
            "appProtocol": "kubernetes.io/h2c",
        },
        {"name": "metrics", "port": DEFAULT_PORTS["metrics"], "targetPort": "metrics", "protocol": "TCP"},
    ]
    if options.openai:
        ports.append({"name": "openai", "port": OPENAI_PORT, "targetPort": "openai", "protocol": "TCP"})
    return ports


def _trtllm_serve_service_ports(options: DeployOptions) -> list[Obj]:
    """trtllm-serve's one port (OpenAI API, /health, metrics); with --openai also on the OpenAI
    endpoint's usual Service port, to the same container port."""
    ports = [{"name": "http", "port": TRTLLM_SERVE_PORT, "targetPort": "http", "protocol": "TCP"}]
    if options.openai:
        ports.append({"name": "openai", "port": OPENAI_PORT, "targetPort": "http", "protocol": "TCP"})
    return ports


def _gpu_resources(gpus: int) -> dict[str, str]:
    """2 CPUs per GPU (at least 4), 8 GiB per CPU, the GPUs."""
    cpu = max(4, 2 * gpus)
    return {"cpu": str(cpu), "memory": f"{8 * cpu}Gi", "nvidia.com/gpu": str(gpus)}


def _triton_container(pod: _Pod) -> Obj:
    """tritonserver in TensorRT-LLM's orchestrator mode, as ``serve`` runs it (trt_spec.serving.trtllm:
    ``launch_triton_server.py --multi-model``'s mpirun -n 1, the orchestrator variables, Triton's own
    GPU memory pools off): one Triton process spawns each engine's ranks on its GPUs, so a TP-N
    target and its draft share one server."""
    options = pod.options
    argv = [
        "tritonserver",
        f"--model-repository={pod.repo_path}",
        f"--http-port={DEFAULT_PORTS['http']}",
        f"--grpc-port={DEFAULT_PORTS['grpc']}",
        f"--metrics-port={DEFAULT_PORTS['metrics']}",
        "--allow-metrics=true",
        "--exit-on-error=true",
        "--strict-readiness=true",
        "--log-verbose=0",
        # SIGTERM: Triton refuses new requests, readiness fails, requests in flight get this long.
        f"--exit-timeout-secs={options.drain_timeout_s}",
    ]
    restricted = _restricted(options)
    if restricted:
        argv += restriction_args(restricted, f"$({ADMIN_ENV})")
    argv, env = orchestrator_command("mpirun", argv, engine_models(pod.plan, pod.engines_path), {})
    resources = _gpu_resources(pod.gpus)
    container: Obj = {
        "name": "triton",
        "image": pod.image,
        "imagePullPolicy": "IfNotPresent",
        "command": argv[:1],
        "args": argv[1:],
        "env": [{"name": key, "value": value} for key, value in sorted(env.items())],
        "ports": _container_ports(False),
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        **_probes("http", pod.budget),
    }
    if restricted:
        container["env"].append(
            {
                "name": ADMIN_ENV,
                "valueFrom": {"secretKeyRef": {"name": f"{pod.name}-admin", "key": ADMIN_SECRET_KEY}},
            }
        )
    return container


def _trtllm_serve_container(pod: _Pod) -> Obj:
    """``trtllm-serve`` on the PyTorch backend, as the llmapi flavor's ``trtllm-serve.sh`` runs it
    (:func:`trt_spec.repository.flavors.llmapi.serve_argv`), with the target's checkpoint and the
    options file on the volume and the API on every address: one process that spawns the tp ranks
    itself (MPI), on the plan's GPUs. No Triton: no admin APIs to restrict (docs/deploy.md says what
    its port exposes)."""
    version = pod.trtllm_version or ""
    argv = serve_argv(pod.plan, version, f"{pod.repo_path}/{OPTIONS_FILE}")
    argv[1] = f"{pod.checkpoints_path}/target"
    argv[argv.index("--host") + 1] = "0.0.0.0"
    argv[argv.index("--port") + 1] = str(TRTLLM_SERVE_PORT)
    resources = _gpu_resources(pod.gpus)
    return {
        "name": "trtllm-serve",
        "image": pod.image,
        "imagePullPolicy": "IfNotPresent",
        "command": argv[:1],
        "args": argv[1:],
        # The checkpoints are on the volume: never reach for the Hub (a name that is not a local
        # directory fails at once instead of downloading into the container).
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
        "ports": [{"name": "http", "containerPort": TRTLLM_SERVE_PORT, "protocol": "TCP"}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        # /health: 200 once the LLM answers its health check, 503 when it does not (openai_server.py
        # @00057725 health -> _check_health); the port opens only after the model is loaded.
        **_probes("http", pod.budget, TRTLLM_SERVE_HEALTH, TRTLLM_SERVE_HEALTH),
    }


def _serve_container(pod: _Pod) -> Obj:
    """``trt-spec serve`` on CPU (torch flavor): the bundled Triton with serve's supervision, drain
    and restricted APIs (its own random admin key: nothing else needs it)."""
    options = pod.options
    argv = [
        "trt-spec",
        "serve",
        "--repo",
        pod.repo_path,
        "--host",
        "0.0.0.0",
        "--log-file",
        "/var/log/trt-spec/tritonserver.log",
        "--ready-timeout",
        str(pod.budget),
        "--drain-timeout",
        str(options.drain_timeout_s),
        "--allow-client-apis",
        ",".join(options.client_apis) or "none",
    ]
    if options.openai:
        argv += ["--openai-port", str(OPENAI_PORT)]
    resources = {"cpu": "4", "memory": "8Gi"}
    return {
        "name": "trt-spec",
        "image": pod.image,
        "imagePullPolicy": "IfNotPresent",
        "command": argv[:1],
        "args": argv[1:],
        "ports": _container_ports(options.openai),
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        **_probes("http", pod.budget),
    }


# The launchers (Flavor.launcher) this module deploys.
SERVERS: dict[str, _Server] = {
    "tritonserver": _Server(
        container=_triton_container,
        startup_fixed_s=STARTUP_FIXED_S,
        reads_model_bytes=True,
        shm=shm_bytes,
        service_ports=_triton_service_ports,
        autoscaling=_triton_autoscaling,
        admin_secret=True,
        openai_sidecar=True,
    ),
    "trt-spec-serve": _Server(
        container=_serve_container,
        startup_fixed_s=TORCH_STARTUP_S,
        reads_model_bytes=False,
        shm=shm_bytes,
        service_ports=_triton_service_ports,
        autoscaling=_triton_autoscaling,
        writable_logs=True,
        loads_checkpoints=True,
    ),
    "trtllm-serve": _Server(
        container=_trtllm_serve_container,
        startup_fixed_s=TRTLLM_SERVE_STARTUP_FIXED_S,
        reads_model_bytes=True,
        shm=trtllm_serve_shm_bytes,
        service_ports=_trtllm_serve_service_ports,
        autoscaling=_trtllm_serve_autoscaling,
        loads_checkpoints=True,
    ),
}


def _openai_sidecar(model_name: str, image: str, repo_path: str) -> Obj:
    """The OpenAI endpoint beside NVIDIA's image (which has no trt-spec): the same app ``serve
    --openai-port`` runs (trt_spec.serving.openai.create_app) against the pod's own gRPC port."""
    code = (
        "import uvicorn; from trt_spec.serving.openai import create_app; "
        f"uvicorn.run(create_app('127.0.0.1:{DEFAULT_PORTS['grpc']}', "
        f"{repo_path + '/preprocessing/1/tokenizer'!r}, {model_name!r}), host='0.0.0.0', port={OPENAI_PORT})"
    )
    resources = {"cpu": "2", "memory": "4Gi"}
    return {
        "name": "openai",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-c", code],
        "ports": [{"name": "openai", "containerPort": OPENAI_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": "openai"}, "periodSeconds": 5},
        "volumeMounts": [{"name": "models", "mountPath": repo_path.rsplit("/", 1)[0] or "/", "readOnly": True}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
    }


def _quantity(n_bytes: int) -> str:
    return f"{n_bytes // GIB}Gi" if n_bytes % GIB == 0 else str(n_bytes)


def documents(deployment: Deployment) -> dict[str, str]:
    """The kustomization's files: file name -> YAML text."""
    out = {FILES[obj["kind"]]: yaml.safe_dump(obj, sort_keys=False) for obj in deployment.objects}
    out["kustomization.yaml"] = yaml.safe_dump(deployment.kustomization, sort_keys=False)
    return out


def write(deployment: Deployment, out_dir: str | Path) -> Path:
    """Write the kustomization to ``out_dir`` atomically (a temporary sibling renamed into place).
    The admin Secret's env file is kept when ``out_dir`` already has one (a rewrite does not rotate
    the key), else made with a random key."""
    final = Path(out_dir).resolve()
    files = documents(deployment)
    if "secretGenerator" in deployment.kustomization:
        previous = final / ADMIN_ENV_FILE
        files[ADMIN_ENV_FILE] = (
            previous.read_text() if previous.is_file() else f"{ADMIN_SECRET_KEY}={secrets.token_hex(16)}\n"
        )
    with atomic.staged_dir(final) as partial:
        for name, text in files.items():
            (partial / name).write_text(text)
        if ADMIN_ENV_FILE in files:
            (partial / ADMIN_ENV_FILE).chmod(0o600)
    return final


def read_objects(out_dir: str | Path) -> list[Obj]:
    """The objects of a written kustomization's resources, in its order."""
    out_dir = Path(out_dir)
    kustomization = yaml.safe_load((out_dir / "kustomization.yaml").read_text())
    objects: list[Obj] = []
    for name in kustomization["resources"]:
        objects += [doc for doc in yaml.safe_load_all((out_dir / name).read_text()) if doc]
    return objects


def repo_command(spec_path: str, deployment: Deployment, out: str = "model_repo") -> str:
    """The ``trt-spec repo`` command that writes the repository this deployment serves."""
    argv = ["trt-spec", "repo", "--spec", spec_path, "--engines-mount", deployment.engines_path, "-o", out]
    if deployment.trtllm_version:
        argv += ["--trtllm-version", deployment.trtllm_version]
    return shlex.join(argv)
