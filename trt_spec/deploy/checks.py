"""Cross-references between a deployment's objects, and between them and the repository they serve.

Each check takes the objects (as written, or read back) and returns a list of problems, one line
each; empty: the references hold. Kubernetes accepts every one of these mistakes and the
deployment then fails quietly (a probe on a port the container lacks restarts it for ever; an HPA
on a metric nobody records never scales; a Service whose selector misses the pods has no
endpoints; a GPU count below the plan's leaves an engine rank without its GPU).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from trt_spec.deploy.manifests import DeployError, Deployment
from trt_spec.deploy.repository import llmapi_files
from trt_spec.plan import Plan
from trt_spec.repository import configs, flavors
from trt_spec.repository.flavors.llmapi import OPTIONS_FLAG
from trt_spec.serving.trtllm import engine_models

Obj = dict[str, Any]
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def _one(objects: list[Obj], kind: str) -> Obj:
    found = [obj for obj in objects if obj.get("kind") == kind]
    if len(found) != 1:
        raise DeployError(f"expected one {kind}, found {len(found)}")
    return found[0]


def _has(objects: list[Obj], kind: str) -> bool:
    return any(obj.get("kind") == kind for obj in objects)


def _pod_labels(objects: list[Obj]) -> dict[str, str]:
    return dict(_one(objects, "Deployment")["spec"]["template"]["metadata"].get("labels") or {})


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def probe_ports(objects: list[Obj]) -> list[str]:
    """Every probe's port (name or number) is one its container declares."""
    problems = []
    for container in _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]:
        declared = {port.get("name") for port in container.get("ports", [])} | {
            port["containerPort"] for port in container.get("ports", [])
        }
        for probe in PROBES:
            action = container.get(probe)
            if not action:
                continue
            handler = action.get("httpGet") or action.get("tcpSocket") or action.get("grpc") or {}
            if "port" in handler and handler["port"] not in declared:
                problems.append(
                    f"container {container['name']}: {probe} port {handler['port']!r} is not one of its ports"
                )
    return problems


def service_selects_pods(objects: list[Obj]) -> list[str]:
    """The Service's selector matches the pod template's labels and its target ports are the pods'."""
    service = _one(objects, "Service")
    labels = _pod_labels(objects)
    problems = []
    if not _selects(service["spec"].get("selector") or {}, labels):
        problems.append(
            f"Service {service['metadata']['name']}: selector {service['spec'].get('selector')} does not select the pods ({labels})"
        )
    containers = _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    names = {port.get("name") for container in containers for port in container.get("ports", [])}
    numbers = {port["containerPort"] for container in containers for port in container.get("ports", [])}
    for port in service["spec"]["ports"]:
        target = port.get("targetPort", port["port"])
        if target not in names and target not in numbers:
            problems.append(f"Service port {port['name']}: targetPort {target!r} is no container port of the pods")
    return problems


def selectors_select_pods(objects: list[Obj]) -> list[str]:
    """The Deployment's own selector, the PodDisruptionBudget's and the PodMonitor's (when there is
    one) match the pods; the PodMonitor scrapes a port the pods declare."""
    labels = _pod_labels(objects)
    deployment = _one(objects, "Deployment")
    problems = []
    monitors = [_one(objects, "PodMonitor")] if _has(objects, "PodMonitor") else []
    for kind, selector in (
        ("Deployment", deployment["spec"]["selector"].get("matchLabels") or {}),
        ("PodDisruptionBudget", _one(objects, "PodDisruptionBudget")["spec"]["selector"].get("matchLabels") or {}),
        *(("PodMonitor", monitor["spec"]["selector"].get("matchLabels") or {}) for monitor in monitors),
    ):
        if not _selects(selector, labels):
            problems.append(f"{kind}: selector {selector} does not select the pods ({labels})")
    names = {
        port.get("name") for c in deployment["spec"]["template"]["spec"]["containers"] for port in c.get("ports", [])
    }
    for endpoint in (e for monitor in monitors for e in monitor["spec"]["podMetricsEndpoints"]):
        if endpoint.get("port") not in names:
            problems.append(f"PodMonitor: port {endpoint.get('port')!r} is no container port of the pods")
    return problems


def hpa_metric(objects: list[Obj]) -> list[str]:
    """The HPA scales the Deployment on the metric the adapter exposes, which is the series the
    PrometheusRule records (a deployment without an HPA has nothing to check)."""
    if not _has(objects, "HorizontalPodAutoscaler"):
        return []
    hpa = _one(objects, "HorizontalPodAutoscaler")
    deployment = _one(objects, "Deployment")
    rule = _one(objects, "PrometheusRule")
    adapter = _one(objects, "ConfigMap")
    problems = []
    target = hpa["spec"]["scaleTargetRef"]
    if (target.get("kind"), target.get("name")) != ("Deployment", deployment["metadata"]["name"]):
        problems.append(f"HPA: scaleTargetRef {target} is not Deployment {deployment['metadata']['name']}")
    recorded = {r["record"] for group in rule["spec"]["groups"] for r in group["rules"] if "record" in r}
    config = yaml.safe_load(adapter["data"]["config.yaml"])
    exposed: dict[str, str] = {}  # the custom metric's name -> the series it reads
    for entry in config.get("rules", []):
        series = entry["seriesQuery"].split("{", 1)[0]
        exposed[entry.get("name", {}).get("as") or series] = series
    for metric in hpa["spec"]["metrics"]:
        if metric["type"] != "Pods":
            continue
        wanted = metric["pods"]["metric"]["name"]
        if wanted not in exposed:
            problems.append(
                f"HPA: metric {wanted!r} is not one the prometheus-adapter rules expose ({sorted(exposed)})"
            )
        elif exposed[wanted] not in recorded:
            problems.append(
                f"HPA: metric {wanted!r} reads series {exposed[wanted]!r}, which no PrometheusRule records ({sorted(recorded)})"
            )
    return problems


def gpu_count(objects: list[Obj], plan: Plan) -> list[str]:
    """The pod asks for exactly the GPUs the plan puts the target and draft on (none for a flavor
    that does not need GPUs: ``Flavor.needs_gpus``)."""
    containers = _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    wanted = len(plan.memory.gpus) if flavors.get(plan.spec.triton.flavor).needs_gpus else 0
    problems = []
    for part in ("limits", "requests"):
        asked = sum(int(c.get("resources", {}).get(part, {}).get("nvidia.com/gpu", 0)) for c in containers)
        if asked != wanted:
            problems.append(f"Deployment: {part} nvidia.com/gpu {asked}, but the plan uses {wanted} GPU(s)")
    return problems


def files_under_mounts(objects: list[Obj]) -> list[str]:
    """What ``trtllm-serve`` reads lies on a volume its container mounts: the options file (the
    argument after ``--extra_llm_api_options`` / ``--config``) and the model (its first argument,
    when a path)."""
    problems = []
    flags = set(OPTIONS_FLAG.values())
    for container in _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]:
        argv = [*container.get("command", []), *container.get("args", [])]
        if not argv or PurePosixPath(argv[0]).name != "trtllm-serve":
            continue
        mounts = [PurePosixPath(m["mountPath"]) for m in container.get("volumeMounts", [])]
        named = [("model", argv[1])] if len(argv) > 1 and argv[1].startswith("/") else []
        named += [("options file", argv[i + 1]) for i, arg in enumerate(argv[:-1]) if arg in flags]
        if not any(what == "options file" for what, _ in named):
            problems.append(f"container {container['name']}: trtllm-serve is given no options file ({sorted(flags)})")
        for what, path in named:
            if not any(PurePosixPath(path).is_relative_to(mount) for mount in mounts):
                problems.append(
                    f"container {container['name']}: trtllm-serve's {what} {path} is under no volume it mounts "
                    f"({', '.join(map(str, mounts)) or 'none'})"
                )
    return problems


def cross_references(objects: list[Obj], plan: Plan) -> list[str]:
    """Every check above."""
    return (
        probe_ports(objects)
        + service_selects_pods(objects)
        + selectors_select_pods(objects)
        + hpa_metric(objects)
        + gpu_count(objects, plan)
        + files_under_mounts(objects)
    )


def repository(repo: str | Path, deployment: Deployment) -> list[str]:
    """A repository written for this deployment: its engine models' ``gpt_model_path`` (and the torch
    flavor's ``hf_model_dir``) lie under the volume's mount, and no model names a GPU the pod lacks;
    a trtllm-serve repository (the llmapi flavor's): see :func:`llmapi_repository`."""
    mount = PurePosixPath(deployment.repo_path).parent
    problems = []
    for model in engine_models(repo):
        if not PurePosixPath(model.engine_dir).is_relative_to(mount):
            problems.append(
                f"model {model.name}: gpt_model_path {model.engine_dir} is not under the volume mounted at {mount}; "
                f"write the repository with `trt-spec repo --spec F --engines-mount {deployment.engines_path}`"
            )
        beyond = [device for device in model.gpu_device_ids if device >= deployment.gpus]
        if beyond:
            problems.append(f"model {model.name}: gpu_device_ids {beyond} beyond the pod's {deployment.gpus} GPU(s)")
    for path in sorted(Path(repo).glob("*/config.pbtxt")):
        config = configs.read_config(path, allow_unknown_fields=True)
        hf = config.parameters.get("hf_model_dir")
        if hf is not None and hf.string_value and not PurePosixPath(hf.string_value).is_relative_to(mount):
            problems.append(
                f"model {config.name}: hf_model_dir {hf.string_value} is not under the volume mounted at {mount}"
            )
    return problems + llmapi_repository(repo, deployment)


def llmapi_repository(repo: str | Path, deployment: Deployment) -> list[str]:
    """A repository with trtllm-serve's options (the llmapi flavor's), for this deployment: the
    options file and Triton's ``model.yaml`` take the deployment's TensorRT-LLM line (validated
    against ``trt_spec.repository.llm_args``), name checkpoints under the volume's mount, and run
    at the pod's GPU count (``tensor_parallel_size``). Nothing to check in a repository without them."""
    files = llmapi_files(repo)
    if not files:
        return []
    mount = PurePosixPath(deployment.repo_path).parent
    problems = []
    if deployment.trtllm_line is None:
        return [f"{repo}: a trtllm-serve repository, but the deployment runs {deployment.launcher}"]
    for name, data in files.items():
        problems += [f"{name}: {problem}" for problem in data.problems(deployment.trtllm_line)]
        for key, path in data.checkpoints().items():
            if not PurePosixPath(path).is_relative_to(mount):
                problems.append(
                    f"{name}: {key} {path} is not under the volume mounted at {mount}; write the repository with "
                    "`trt-spec k8s ... --write-repo DIR` (it names the checkpoints under the mount)"
                )
        tp = data.options.get("tensor_parallel_size")
        if tp != deployment.gpus:
            problems.append(f"{name}: tensor_parallel_size {tp}, but the pod has {deployment.gpus} GPU(s)")
    return problems
