"""Kubernetes objects for a spec's deployment, as plain dicts, and the kustomization that holds them.

One replica is one Triton server on the plan's GPUs (tensorrtllm flavor: NVIDIA's TensorRT-LLM
container, Triton in the backend's orchestrator mode under ``mpirun``, as ``serve`` runs it) or
on CPU (torch flavor: ``trt-spec serve`` in the trt-spec image). The set, after NVIDIA's
TensorRT-LLM autoscaling tutorial (triton-inference-server/tutorials,
``Deployment/Kubernetes/TensorRT-LLM_Autoscaling_and_Load_Balancing``: ``chart/templates/
deployment.yaml``, ``horizontal-pod-autoscaler.yaml``, ``pod-monitor.yaml`` at commits
0665326cd1cbceed69aa1f6de59ffc9332b6f2cc / d459ddd7d19566c8c34778056c62e45ee28b446e /
3f7025cd005acf0945f5577bdcc491f27b1687e6, and its README's ``triton-metrics_prometheus-rule.yaml``):
a Deployment, a Service, a PodDisruptionBudget, a PodMonitor that scrapes Triton's metrics port,
a PrometheusRule recording ``triton:queue_compute:ratio`` (time in Triton's queues over time
computing), the prometheus-adapter rule that exposes it to the custom metrics API (a ConfigMap),
and an ``autoscaling/v2`` HorizontalPodAutoscaler on it. docs/deploy.md says what each is for.
"""

from __future__ import annotations

import math
import re
import secrets
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trt_spec import atomic
from trt_spec.deploy.images import GPU_PRODUCT_LABEL, GPU_PRODUCTS, TRT_SPEC_IMAGE, TRTLLM_IMAGE
from trt_spec.errors import TrtSpecError
from trt_spec.plan import Plan
from trt_spec.serving.server import DEFAULT_PORTS, RESTRICTABLE_APIS, restriction_args
from trt_spec.serving.trtllm import EngineModel, orchestrator_command

Obj = dict[str, Any]

# The recorded series the HPA scales on: the tutorial's name, so its prometheus-adapter setup and
# dashboards keep working.
QUEUE_COMPUTE_METRIC = "triton:queue_compute:ratio"
ADMIN_SECRET_KEY = "admin-key"  # the key in the admin Secret; its value is the restricted APIs' header value
ADMIN_ENV = "TRT_SPEC_ADMIN_KEY"  # the container variable holding it; Kubernetes expands $(VAR) in args
ADMIN_ENV_FILE = "admin.env"  # the secretGenerator's input, written beside the manifests (random, kept on rewrite)
OPENAI_PORT = 9000  # the OpenAI endpoint's container port, when asked for
# A start's fixed part: the container, mpirun, Triton, the python stubs and tokenizers (the engines'
# bytes come on top, read at --load-throughput). The torch flavor loads checkpoints on CPU in
# `serve`'s own ready timeout (300 s by default).
STARTUP_FIXED_S = 120
TORCH_STARTUP_S = 300
STARTUP_PERIOD_S = 10
PRESTOP_SLEEP_S = 5  # endpoints and kube-proxy take the pod out of the Service before Triton refuses
STOP_MARGIN_S = 10  # after the drain: Triton's unload, TensorRT-LLM's workers, serve's own 5 s stop
# The python backend's shared memory (/dev/shm): every stub's region holds the tensors of its
# requests in flight. Sized for the largest ones the loop moves per sequence (fp32 logits of K + 1
# target and K draft positions, token arrays of max_seq_len), for a whole batch, x4 for the copies
# in and out and the regions' growth, plus each stub's default region; at least 1 GiB.
SHM_MIN_BYTES = 1 << 30
SHM_PER_STUB_BYTES = 64 << 20
SHM_STUBS = 12  # the pipeline's python model instances, with room to spare
GIB = 1 << 30

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
    hpa_target: str = "1"  # the queue/compute ratio each replica is scaled to, averaged over pods
    openai: bool = False
    drain_timeout_s: int = 25  # serve's default: inside Kubernetes' default 30 s grace period
    client_apis: tuple[str, ...] = ()  # restricted Triton APIs opened to every client
    load_throughput_mb_s: float = 250.0  # how fast a replica reads its engines from the volume
    prometheus_labels: Mapping[str, str] = field(default_factory=lambda: {"release": "prometheus"})

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
                f"--hpa-target must be a positive Kubernetes quantity such as 1, 1.5 or 500m (the queue/compute ratio); got {self.hpa_target!r}"
            )
        unknown = [api for api in self.client_apis if api not in RESTRICTABLE_APIS]
        if unknown:
            raise DeployError(f"unknown client API {unknown[0]!r}: choose from {', '.join(RESTRICTABLE_APIS)}")


@dataclass(frozen=True)
class Deployment:
    """The objects of one deployment, and the facts they were made from (for the checks and the notes)."""

    name: str
    flavor: str
    objects: list[Obj]
    kustomization: Obj
    repo_path: str  # the repository as the pod sees it
    engines_path: str  # the spec's paths.engines as the pod sees it (trt-spec repo --engines-mount)
    checkpoints_path: str  # the torch flavor's checkpoints as the pod sees it
    gpus: int
    startup_budget_s: int
    shm_bytes: int
    image: str
    notes: list[str]

    def kind(self, kind: str) -> Obj:
        """The one object of ``kind``."""
        found = [obj for obj in self.objects if obj["kind"] == kind]
        if len(found) != 1:
            raise KeyError(f"{len(found)} objects of kind {kind}")
        return found[0]


def dns_name(text: str) -> str:
    """``text`` as a DNS-1123 label (what Deployment and Service names must be), at most 40
    characters so that the names derived from it fit."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40].strip("-")
    if not name:
        raise DeployError(f"cannot make a Kubernetes name of {text!r}: pass --name")
    return name


def engine_bytes(plan: Plan) -> int:
    """Both engines' weights, every rank: what a replica reads from the volume at start."""
    memory = plan.memory
    return memory.target.weights_bytes * memory.target.tp_size + memory.draft.weights_bytes * memory.draft.tp_size


def startup_budget_s(plan: Plan, flavor: str, load_throughput_mb_s: float) -> int:
    """Seconds a replica may take from start to ready before Kubernetes restarts it: the fixed
    start, plus twice the engines' bytes at ``load_throughput_mb_s`` (a shared volume read by
    several replicas at once is slower than alone); the torch flavor: ``serve``'s ready timeout."""
    if flavor == "torch":
        return TORCH_STARTUP_S
    load = engine_bytes(plan) / (load_throughput_mb_s * 1e6)
    return int(math.ceil((STARTUP_FIXED_S + 2 * load) / STARTUP_PERIOD_S) * STARTUP_PERIOD_S)


def shm_bytes(plan: Plan) -> int:
    """The /dev/shm the python backend's stubs may use, rounded up to GiB (see SHM_MIN_BYTES)."""
    spec = plan.spec
    k = spec.num_draft_tokens
    per_sequence = 4 * plan.target.model.vocab_size * (2 * k + 1) + 4 * 4 * spec.engine.max_seq_len
    wanted = 4 * spec.engine.max_batch_size * per_sequence + SHM_STUBS * SHM_PER_STUB_BYTES
    return max(SHM_MIN_BYTES, int(math.ceil(wanted / GIB)) * GIB)


def engine_models(plan: Plan, engines_path: str) -> list[EngineModel]:
    """The repository's two TensorRT-LLM models as the pod sees them: target rank r on GPU r, the
    draft's ranks on the GPUs the memory plan puts them on (``tensorrt_llm``/``tensorrt_llm_draft``)."""
    spec = plan.spec
    target_gpus = tuple(range(spec.target.tp_size))
    draft_gpus = tuple(range(spec.draft.tp_size))  # the memory plan puts draft rank r beside target rank r
    return [
        EngineModel("tensorrt_llm", Path(engines_path) / spec.name / "target", target_gpus),
        EngineModel("tensorrt_llm_draft", Path(engines_path) / spec.name / "draft", draft_gpus),
    ]


def build(plan: Plan, options: DeployOptions | None = None) -> Deployment:
    """The deployment of ``plan``'s spec: every object, and the kustomization naming their files.

    Raises:
        DeployError: a flavor this cannot deploy (llmapi), or options that do not fit.
    """
    options = options or DeployOptions()
    spec = plan.spec
    flavor = spec.triton.flavor
    if flavor not in ("tensorrtllm", "torch"):
        raise DeployError(
            f"flavor {flavor!r}: `trt-spec k8s` deploys the tensorrtllm flavor (GPU) and the torch flavor (CPU); "
            "set triton.flavor in the spec"
        )
    name = dns_name(options.name or spec.name)
    mount = options.mount_path.rstrip("/") or "/"
    repo_path = f"{mount}/model_repo"
    engines_path = f"{mount}/engines"
    checkpoints_path = f"{mount}/checkpoints"
    gpu = flavor == "tensorrtllm"
    gpus = len(plan.memory.gpus) if gpu else 0
    budget = startup_budget_s(plan, flavor, options.load_throughput_mb_s)
    shm = shm_bytes(plan)
    notes: list[str] = []
    if gpu:
        image = options.image or TRTLLM_IMAGE.ref
        if options.image is None and not TRTLLM_IMAGE.verified:
            notes.append(
                f"image {image} is a candidate, not verified to carry TensorRT-LLM 1.2.x ({TRTLLM_IMAGE.source}); "
                "pass --image with the container your engines were built in"
            )
    else:
        image = options.image or options.trt_spec_image or TRT_SPEC_IMAGE.ref
    trt_spec_image = options.trt_spec_image or TRT_SPEC_IMAGE.ref
    labels = {
        "app.kubernetes.io/name": "trt-spec",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "server",
    }
    common = {"app.kubernetes.io/name": "trt-spec", "app.kubernetes.io/instance": name}
    grace = PRESTOP_SLEEP_S + options.drain_timeout_s + STOP_MARGIN_S

    if gpu:
        server = _triton_container(plan, options, image, repo_path, engines_path, budget)
    else:
        server = _serve_container(options, image, repo_path, budget)
    server["volumeMounts"] = [
        {"name": "models", "mountPath": mount, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ] + ([] if gpu else [{"name": "logs", "mountPath": "/var/log/trt-spec"}])
    server["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_S)]}}}
    containers = [server]
    if gpu and options.openai:
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
        + ([] if gpu else [{"name": "logs", "emptyDir": {}}]),
    }
    if gpu:
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
    service: Obj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": dict(common)},
        "spec": {"type": "ClusterIP", "selector": dict(labels), "ports": ports},
    }
    pdb: Obj = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "labels": dict(common)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": dict(labels)}},
    }
    monitoring_labels = {**common, **options.prometheus_labels}
    pod_monitor: Obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": name, "labels": dict(monitoring_labels)},
        "spec": {
            "selector": {"matchLabels": dict(labels)},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    }
    rule: Obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": name, "labels": dict(monitoring_labels)},
        "spec": {
            "groups": [
                {
                    "name": f"trt-spec-{name}",
                    "rules": [{"record": QUEUE_COMPUTE_METRIC, "expr": queue_compute_expr(name)}],
                }
            ]
        },
    }
    adapter: Obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-prometheus-adapter-rules", "labels": dict(common)},
        "data": {"config.yaml": yaml.safe_dump(adapter_config(), sort_keys=False)},
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
                        "metric": {"name": QUEUE_COMPUTE_METRIC},
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
    objects = [deployment, service, pdb, hpa, pod_monitor, rule, adapter]
    kustomization: Obj = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [FILES[obj["kind"]] for obj in objects],
    }
    if gpu and _restricted(options):
        kustomization["secretGenerator"] = [{"name": f"{name}-admin", "envs": [ADMIN_ENV_FILE]}]
        kustomization["generatorOptions"] = {"disableNameSuffixHash": True}
    if not gpu:
        notes.append(
            f"torch flavor: the engine models load the Hugging Face checkpoints from {checkpoints_path}/target and "
            f"{checkpoints_path}/draft on the volume (`write_mounted_repository` writes a repository naming them)"
        )
    return Deployment(
        name=name,
        flavor=flavor,
        objects=objects,
        kustomization=kustomization,
        repo_path=repo_path,
        engines_path=engines_path,
        checkpoints_path=checkpoints_path,
        gpus=gpus,
        startup_budget_s=budget,
        shm_bytes=shm,
        image=image,
        notes=notes,
    )


def queue_compute_expr(name: str) -> str:
    """PromQL: per pod of this Deployment, Triton's queue time over its compute time (all models),
    over the last minute (the tutorial's ratio, summed over a pod's models before dividing)."""
    pods = f'pod=~"{name}-[a-z0-9]+-[a-z0-9]+"'
    return (
        f"sum by (namespace, pod) (rate(nv_inference_queue_duration_us{{{pods}}}[1m]))"
        f" / clamp_min(sum by (namespace, pod) (rate(nv_inference_compute_infer_duration_us{{{pods}}}[1m])), 1)"
    )


def adapter_config() -> Obj:
    """prometheus-adapter's rule exposing the recorded ratio per pod to the custom metrics API."""
    return {
        "rules": [
            {
                "seriesQuery": f'{QUEUE_COMPUTE_METRIC}{{namespace!="",pod!=""}}',
                "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
                "name": {"matches": f"^{re.escape(QUEUE_COMPUTE_METRIC)}$", "as": QUEUE_COMPUTE_METRIC},
                "metricsQuery": "avg(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
            }
        ]
    }


def _restricted(options: DeployOptions) -> list[str]:
    return [api for api in RESTRICTABLE_APIS if api not in options.client_apis]


def _probes(port: str, budget: int) -> Obj:
    """Triton's health endpoints: startup allows ``budget`` seconds for every model to load;
    readiness (Triton runs with strict readiness) takes a replica out of the Service within ~10 s;
    liveness restarts a server that stops answering for 2 minutes (long enough for `serve` to
    restart Triton after a decoupled model's process died: 15-45 s measured, docs/operating.md)."""
    ready = {"path": "/v2/health/ready", "port": port}
    return {
        "startupProbe": {
            "httpGet": dict(ready),
            "periodSeconds": STARTUP_PERIOD_S,
            "timeoutSeconds": 5,
            "failureThreshold": budget // STARTUP_PERIOD_S,
        },
        "readinessProbe": {"httpGet": dict(ready), "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 2},
        "livenessProbe": {
            "httpGet": {"path": "/v2/health/live", "port": port},
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


def _triton_container(
    plan: Plan, options: DeployOptions, image: str, repo_path: str, engines_path: str, budget: int
) -> Obj:
    """tritonserver in TensorRT-LLM's orchestrator mode, as ``serve`` runs it (trt_spec.serving.trtllm:
    ``launch_triton_server.py --multi-model``'s mpirun -n 1, the orchestrator variables, Triton's own
    GPU memory pools off): one Triton process spawns each engine's ranks on its GPUs, so a TP-N
    target and its draft share one server."""
    argv = [
        "tritonserver",
        f"--model-repository={repo_path}",
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
    argv, env = orchestrator_command("mpirun", argv, engine_models(plan, engines_path), {})
    gpus = len(plan.memory.gpus)
    cpu = max(4, 2 * gpus)
    resources = {"cpu": str(cpu), "memory": f"{8 * cpu}Gi", "nvidia.com/gpu": str(gpus)}
    container: Obj = {
        "name": "triton",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": argv[:1],
        "args": argv[1:],
        "env": [{"name": key, "value": value} for key, value in sorted(env.items())],
        "ports": _container_ports(False),
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        **_probes("http", budget),
    }
    if restricted:
        container["env"].append(
            {
                "name": ADMIN_ENV,
                "valueFrom": {
                    "secretKeyRef": {
                        "name": f"{dns_name(options.name or plan.spec.name)}-admin",
                        "key": ADMIN_SECRET_KEY,
                    }
                },
            }
        )
    return container


def _serve_container(options: DeployOptions, image: str, repo_path: str, budget: int) -> Obj:
    """``trt-spec serve`` on CPU (torch flavor): the bundled Triton with serve's supervision, drain
    and restricted APIs (its own random admin key: nothing else needs it)."""
    argv = [
        "trt-spec",
        "serve",
        "--repo",
        repo_path,
        "--host",
        "0.0.0.0",
        "--log-file",
        "/var/log/trt-spec/tritonserver.log",
        "--ready-timeout",
        str(budget),
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
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": argv[:1],
        "args": argv[1:],
        "ports": _container_ports(options.openai),
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        **_probes("http", budget),
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
    return shlex.join(["trt-spec", "repo", "--spec", spec_path, "--engines-mount", deployment.engines_path, "-o", out])
