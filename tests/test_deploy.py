"""`trt-spec k8s`: the Kubernetes manifests, checked offline.

Core objects: kubernetes-validate in strict mode at two pinned Kubernetes versions (an unknown or
mistyped field fails). Custom resources (PodMonitor, PrometheusRule): against prometheus-operator's
published CRD schemas vendored in tests/data/crds/ (provenance in each file), unknown fields
refused as the API server's strict field validation would. Cross-references (trt_spec.deploy.checks),
each with a negative control. `kubectl kustomize` renders the same objects. The repository written
for the pod points its engines (and the torch and llmapi flavors' checkpoints) at the mounted volume.
Three flavors: tensorrtllm (Triton on GPUs), torch (CPU) and llmapi (trtllm-serve on GPUs, with and
without the Prometheus metrics its autoscaling needs).
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from trt_spec.cli import main
from trt_spec.deploy import checks, images, manifests
from trt_spec.deploy.images import GPU_PRODUCT_LABEL, GPU_PRODUCTS
from trt_spec.deploy.repository import PERF_METRICS_KEY, write_mounted_repository
from trt_spec.plan import make_plan
from trt_spec.repository import configs, llm_args
from trt_spec.repository.flavors import FLAVORS
from trt_spec.repository.flavors.llmapi import MODEL_YAML, OPTIONS_FILE
from trt_spec.repository.writer import write_repository
from trt_spec.serving.trtllm import engine_models
from trt_spec.spec import load_spec

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[1]
GPU_SPEC = ROOT / "examples" / "llama70b-1b-4xh100.yaml"
CPU_SPEC = ROOT / "examples" / "pystdlib-demo.yaml"
CRDS = Path(__file__).parent / "data" / "crds"
# The oldest Kubernetes release still common in managed clusters (1.30: autoscaling/v2, policy/v1 and
# every field used here are GA) and the newest kubernetes-validate ships.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
CORE_KINDS = {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "ConfigMap", "Secret"}
CRD_SCHEMAS = {
    "PodMonitor": CRDS / "monitoring.coreos.com_podmonitors.schema.yaml",
    "PrometheusRule": CRDS / "monitoring.coreos.com_prometheusrules.schema.yaml",
}
KUBECTL = shutil.which("kubectl") or ("/usr/bin/kubectl" if Path("/usr/bin/kubectl").is_file() else None)


KEYS = ("trtllm", "torch", "llmapi", "llmapi-hpa")


@pytest.fixture(scope="module")
def llmapi_spec(tmp_path_factory):
    """The GPU example with triton.flavor: llmapi (Hub ids: nothing local to resolve)."""
    data = yaml.safe_load(GPU_SPEC.read_text())
    data["triton"] = {"flavor": "llmapi"}
    path = tmp_path_factory.mktemp("spec") / "llmapi.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def plans(llmapi_spec):
    llmapi = make_plan(load_spec(llmapi_spec))
    return {
        "trtllm": make_plan(load_spec(GPU_SPEC)),
        "torch": make_plan(load_spec(CPU_SPEC)),
        "llmapi": llmapi,
        "llmapi-hpa": llmapi,
    }


@pytest.fixture(scope="module")
def written(tmp_path_factory, llmapi_spec):
    """The specs' kustomizations written by the command: the tensorrtllm one with the OpenAI sidecar,
    the torch and llmapi ones with their repositories; llmapi-hpa from a copy of the llmapi repository
    whose options set return_perf_metrics (so trtllm-serve serves metrics to scale on), with --openai."""
    out = tmp_path_factory.mktemp("k8s")
    runner = CliRunner()
    for key, spec, extra in (
        ("trtllm", GPU_SPEC, ["--openai"]),
        ("torch", CPU_SPEC, ["--write-repo", str(out / "torch-repo")]),
        ("llmapi", llmapi_spec, ["--write-repo", str(out / "llmapi-repo")]),
    ):
        result = runner.invoke(main, ["k8s", "--spec", str(spec), "-o", str(out / key), *extra])
        assert result.exit_code == 0, result.output
    shutil.copytree(out / "llmapi-repo", out / "llmapi-hpa-repo")
    with (out / "llmapi-hpa-repo" / OPTIONS_FILE).open("a") as options:
        options.write(f"{PERF_METRICS_KEY}: true\n")
    result = runner.invoke(
        main,
        ["k8s", "--spec", str(llmapi_spec), "-o", str(out / "llmapi-hpa"), "--repo", str(out / "llmapi-hpa-repo")]
        + ["--openai"],
    )
    assert result.exit_code == 0, result.output
    return out


def _options(key):
    """The DeployOptions the command used for ``key``."""
    return manifests.DeployOptions(openai=key in ("trtllm", "llmapi-hpa"), perf_metrics=key == "llmapi-hpa")


def _objects(written, key):
    return manifests.read_objects(written / key)


def _strict_errors(obj, version):
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return str(exc)
    return None


def _unknown_fields(obj, schema, path="") -> list[str]:
    """Fields the schema does not declare (the API server prunes or, with strict field validation,
    refuses them); ``metadata`` is the API server's ObjectMeta, not the CRD's."""
    found = []
    if isinstance(obj, dict) and schema.get("type") == "object" and "properties" in schema:
        for key, value in obj.items():
            if path == "" and key == "metadata":
                continue
            if key not in schema["properties"]:
                found.append(f"{path}.{key}")
            else:
                found += _unknown_fields(value, schema["properties"][key], f"{path}.{key}")
    elif isinstance(obj, list) and "items" in schema:
        for index, item in enumerate(obj):
            found += _unknown_fields(item, schema["items"], f"{path}[{index}]")
    return found


def _crd_errors(obj) -> list[str]:
    schema = yaml.safe_load(CRD_SCHEMAS[obj["kind"]].read_text())
    errors = [error.message for error in jsonschema.Draft7Validator(schema).iter_errors(obj)]
    return errors + [f"unknown field {name}" for name in _unknown_fields(obj, schema)]


# --- the command writes both sets -----------------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_written_objects_are_the_built_ones(written, plans, key):
    deployment = manifests.build(plans[key], _options(key))  # the command's defaults
    assert _objects(written, key) == deployment.objects
    kinds = [obj["kind"] for obj in deployment.objects]
    assert kinds[:3] == ["Deployment", "Service", "PodDisruptionBudget"]
    if key == "llmapi":  # no metrics to scale on: no autoscaling, and the note says why
        assert kinds == ["Deployment", "Service", "PodDisruptionBudget"]
        assert any("return_perf_metrics" in note for note in deployment.notes)
    else:
        assert kinds[3:] == ["HorizontalPodAutoscaler", "PodMonitor", "PrometheusRule", "ConfigMap"]


def test_rewrite_keeps_the_admin_key(tmp_path, plans):
    deployment = manifests.build(plans["trtllm"])
    manifests.write(deployment, tmp_path / "k")
    first = (tmp_path / "k" / manifests.ADMIN_ENV_FILE).read_text()
    assert first.startswith(f"{manifests.ADMIN_SECRET_KEY}=") and len(first.strip().split("=", 1)[1]) == 32
    manifests.write(deployment, tmp_path / "k")
    assert (tmp_path / "k" / manifests.ADMIN_ENV_FILE).read_text() == first
    assert (tmp_path / "k" / manifests.ADMIN_ENV_FILE).stat().st_mode & 0o077 == 0


# --- strict validation ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("key", KEYS)
def test_core_objects_pass_strict_validation(written, key, version):
    core = [obj for obj in _objects(written, key) if obj["kind"] in CORE_KINDS]
    assert len(core) == (3 if key == "llmapi" else 5)
    for obj in core:
        assert _strict_errors(obj, version) is None, (obj["kind"], _strict_errors(obj, version))


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("key", ["trtllm", "llmapi"])
def test_strict_validation_refuses_a_changed_field(written, version, key):
    """Negative control: a field Kubernetes does not know, and a wrongly typed one, fail."""
    deployment = next(obj for obj in _objects(written, key) if obj["kind"] == "Deployment")
    unknown = copy.deepcopy(deployment)
    unknown["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["initialDelay"] = 5
    assert _strict_errors(unknown, version)
    mistyped = copy.deepcopy(deployment)
    mistyped["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "forty"
    assert _strict_errors(mistyped, version)


@pytest.mark.parametrize("key", ["trtllm", "torch", "llmapi-hpa"])
def test_custom_resources_match_their_published_schemas(written, key):
    crs = [obj for obj in _objects(written, key) if obj["kind"] in CRD_SCHEMAS]
    assert sorted(obj["kind"] for obj in crs) == ["PodMonitor", "PrometheusRule"]
    for obj in crs:
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        assert _crd_errors(obj) == [], obj["kind"]


def test_crd_validation_refuses_bad_fields(written):
    objects = {obj["kind"]: obj for obj in _objects(written, "trtllm")}
    monitor = copy.deepcopy(objects["PodMonitor"])
    monitor["spec"]["podMetricsEndpoints"][0]["interval"] = "15 seconds"
    assert _crd_errors(monitor)
    monitor = copy.deepcopy(objects["PodMonitor"])
    monitor["spec"]["podMetricsEndpoints"][0]["portName"] = "metrics"
    assert _crd_errors(monitor) == ["unknown field .spec.podMetricsEndpoints[0].portName"]
    rule = copy.deepcopy(objects["PrometheusRule"])
    del rule["spec"]["groups"][0]["rules"][0]["expr"]
    assert _crd_errors(rule)


# --- cross-references, each with a negative control -----------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_cross_references_hold(written, plans, key):
    assert checks.cross_references(_objects(written, key), plans[key]) == []


def _broken(objects, kind, change):
    objects = copy.deepcopy(objects)
    change(next(obj for obj in objects if obj["kind"] == kind))
    return objects


def _pod(obj):
    return obj["spec"]["template"]["spec"]


@pytest.mark.parametrize("key", ["trtllm", "llmapi"])
def test_probe_port_not_on_the_container_is_caught(written, key):
    objects = _objects(written, key)
    assert checks.probe_ports(objects) == []

    def rename(obj):
        _pod(obj)["containers"][0]["livenessProbe"]["httpGet"]["port"] = "health"

    assert checks.probe_ports(_broken(objects, "Deployment", rename))


@pytest.mark.parametrize("key", ["trtllm", "llmapi-hpa"])
def test_service_that_misses_the_pods_is_caught(written, key):
    objects = _objects(written, key)
    assert checks.service_selects_pods(objects) == []

    def retarget(obj):
        obj["spec"]["selector"]["app.kubernetes.io/component"] = "frontend"

    assert checks.service_selects_pods(_broken(objects, "Service", retarget))

    def wrong_port(obj):
        obj["spec"]["ports"][1]["targetPort"] = 9001

    assert checks.service_selects_pods(_broken(objects, "Service", wrong_port))


@pytest.mark.parametrize("key", ["torch", "llmapi-hpa"])
def test_pdb_and_podmonitor_selectors_are_checked(written, key):
    objects = _objects(written, key)
    assert checks.selectors_select_pods(objects) == []

    def retarget(obj):
        obj["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] = "other"

    assert checks.selectors_select_pods(_broken(objects, "PodDisruptionBudget", retarget))
    assert checks.selectors_select_pods(_broken(objects, "PodMonitor", retarget))

    def port(obj):
        obj["spec"]["podMetricsEndpoints"][0]["port"] = "prometheus"

    assert checks.selectors_select_pods(_broken(objects, "PodMonitor", port))


@pytest.mark.parametrize(
    ("key", "metric"), [("trtllm", manifests.QUEUE_COMPUTE_METRIC), ("llmapi-hpa", manifests.QUEUE_TIME_METRIC)]
)
def test_hpa_metric_is_the_recorded_one(written, key, metric):
    objects = _objects(written, key)
    assert checks.hpa_metric(objects) == []
    hpa = next(obj for obj in objects if obj["kind"] == "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == metric

    def rename_metric(obj):
        obj["spec"]["metrics"][0]["pods"]["metric"]["name"] = "triton:queue_compute:avg"

    assert checks.hpa_metric(_broken(objects, "HorizontalPodAutoscaler", rename_metric))

    def rename_record(obj):
        obj["spec"]["groups"][0]["rules"][0]["record"] = "triton:queue:ratio"

    assert checks.hpa_metric(_broken(objects, "PrometheusRule", rename_record))

    def retarget(obj):
        obj["spec"]["scaleTargetRef"]["name"] = "elsewhere"

    assert checks.hpa_metric(_broken(objects, "HorizontalPodAutoscaler", retarget))


@pytest.mark.parametrize("key", ["trtllm", "llmapi"])
def test_engine_gpus_equal_the_plan(written, plans, key):
    objects = _objects(written, key)
    assert len(plans[key].memory.gpus) == 4 == plans[key].spec.target.tp_size
    assert checks.gpu_count(objects, plans[key]) == []
    assert checks.gpu_count(_objects(written, "torch"), plans["torch"]) == []

    def fewer(obj):
        _pod(obj)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"

    assert checks.gpu_count(_broken(objects, "Deployment", fewer), plans[key])
    # The torch flavor's CPU pods against a GPU flavor's plan: no GPUs asked for is caught too.
    assert checks.gpu_count(_objects(written, "torch"), plans[key])


def test_trtllm_serve_reads_its_files_from_the_volume(written):
    objects = _objects(written, "llmapi")
    assert checks.files_under_mounts(objects) == []

    def elsewhere(obj):
        args = _pod(obj)["containers"][0]["args"]
        args[args.index("--extra_llm_api_options") + 1] = "/etc/trtllm/trtllm-serve.yaml"

    problems = checks.files_under_mounts(_broken(objects, "Deployment", elsewhere))
    assert len(problems) == 1 and "options file /etc/trtllm/trtllm-serve.yaml is under no volume" in problems[0]

    def unmounted(obj):
        _pod(obj)["containers"][0]["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]

    assert len(checks.files_under_mounts(_broken(objects, "Deployment", unmounted))) == 2  # model and options

    def no_options(obj):
        args = _pod(obj)["containers"][0]["args"]
        del args[args.index("--extra_llm_api_options") :]

    assert "no options file" in checks.files_under_mounts(_broken(objects, "Deployment", no_options))[0]


# --- what the objects say -------------------------------------------------------------------------


def test_tensorrtllm_deployment(written, plans):
    objects = {obj["kind"]: obj for obj in _objects(written, "trtllm")}
    deployment = objects["Deployment"]
    pod = _pod(deployment)
    triton = pod["containers"][0]
    assert triton["image"].startswith("nvcr.io/nvidia/tritonserver:") and triton["image"].endswith("-trtllm-python-py3")
    argv = triton["command"] + triton["args"]
    # Orchestrator mode under mpirun, the repository on the volume, the drain as Triton's exit timeout.
    assert argv[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", "tritonserver"]
    assert "--model-repository=/models/model_repo" in argv
    assert "--exit-timeout-secs=25" in argv
    assert {"name": "TRTLLM_ORCHESTRATOR", "value": "1"} in triton["env"]
    # The restricted APIs' header value comes from the Secret the kustomization generates.
    restricted = [arg for arg in argv if arg.startswith("--http-restricted-api=")]
    assert restricted and restricted[0].endswith(f"trt-spec-admin-key=$({manifests.ADMIN_ENV})")
    secret_env = next(env for env in triton["env"] if env["name"] == manifests.ADMIN_ENV)
    assert secret_env["valueFrom"]["secretKeyRef"] == {"name": "llama70b-1b-admin", "key": manifests.ADMIN_SECRET_KEY}
    # GPU nodes of the spec's product; /dev/shm in memory; grace = preStop + drain + margin.
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0] == {
        "key": GPU_PRODUCT_LABEL,
        "operator": "In",
        "values": list(GPU_PRODUCTS["h100"]),
    }
    shm = next(volume for volume in pod["volumes"] if volume["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert pod["terminationGracePeriodSeconds"] == manifests.PRESTOP_SLEEP_S + 25 + manifests.STOP_MARGIN_S
    # Startup allows the engines' load at the default throughput; rolling updates keep capacity.
    startup = triton["startupProbe"]
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    assert budget >= manifests.engine_bytes(plans["trtllm"]) / 250e6 + manifests.STARTUP_FIXED_S
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    # The OpenAI sidecar and its Service port.
    assert pod["containers"][1]["name"] == "openai"
    assert "openai" in [port["name"] for port in objects["Service"]["spec"]["ports"]]


def test_torch_deployment_runs_serve_on_cpu(written):
    pod = _pod(next(obj for obj in _objects(written, "torch") if obj["kind"] == "Deployment"))
    (container,) = pod["containers"]
    argv = container["command"] + container["args"]
    assert argv[:4] == ["trt-spec", "serve", "--repo", "/models/model_repo"]
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert "affinity" not in pod


def test_hpa_target_is_an_option(tmp_path):
    result = CliRunner().invoke(
        main, ["k8s", "--spec", str(CPU_SPEC), "-o", str(tmp_path / "k"), "--hpa-target", "500m", "--max-replicas", "3"]
    )
    assert result.exit_code == 0, result.output
    hpa = next(obj for obj in manifests.read_objects(tmp_path / "k") if obj["kind"] == "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "500m"
    assert hpa["spec"]["maxReplicas"] == 3
    bad = CliRunner().invoke(main, ["k8s", "--spec", str(CPU_SPEC), "-o", str(tmp_path / "b"), "--hpa-target", "-1"])
    assert bad.exit_code != 0 and "--hpa-target" in bad.output


# --- kubectl kustomize ----------------------------------------------------------------------------


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
@pytest.mark.parametrize("key", KEYS)
def test_kubectl_kustomize_renders_the_same_objects(written, key):
    rendered = subprocess.run(
        [KUBECTL, "kustomize", str(written / key)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    docs = [doc for doc in yaml.safe_load_all(rendered) if doc]
    secrets_ = [doc for doc in docs if doc["kind"] == "Secret"]
    others = [doc for doc in docs if doc["kind"] != "Secret"]

    def key_of(obj):
        return (obj["kind"], obj["metadata"]["name"])

    assert sorted(others, key=key_of) == sorted(_objects(written, key), key=key_of)
    if key == "trtllm":  # only Triton in NVIDIA's image takes its admin key from a Secret
        (secret,) = secrets_
        assert secret["metadata"]["name"] == "llama70b-1b-admin"
        assert list(secret["data"]) == [manifests.ADMIN_SECRET_KEY]
        for version in K8S_VERSIONS:
            assert _strict_errors(secret, version) is None
    else:
        assert secrets_ == []  # `serve` keeps its own admin key; trtllm-serve has no admin APIs


# --- the repository on the volume -----------------------------------------------------------------


def test_tensorrtllm_repository_points_at_the_mounted_engines(tmp_path, plans):
    spec = plans["trtllm"].spec
    deployment = manifests.build(plans["trtllm"])
    tokenizer = ROOT / "examples" / "pystdlib-pair" / "target"  # Llama's tokenizer is not downloaded here
    result = write_mounted_repository(spec, deployment, tmp_path / "repo", tokenizer_dir=tokenizer)
    models = engine_models(result.path)
    assert {model.name for model in models} == {"tensorrt_llm", "tensorrt_llm_draft"}
    for model in models:
        assert str(model.engine_dir).startswith(f"{deployment.engines_path}/{spec.name}/")
        assert max(model.gpu_device_ids) < deployment.gpus
    assert checks.repository(result.path, deployment) == []
    # Negative control: the repository as `trt-spec repo` writes it without --engines-mount.
    local = write_repository(spec, tmp_path / "local", tokenizer_dir=tokenizer)
    problems = checks.repository(local.path, deployment)
    assert len(problems) == 2 and all("--engines-mount /models/engines" in line for line in problems)


def test_torch_repository_points_at_the_mounted_checkpoints(written):
    repo = written / "torch-repo"
    deployment = manifests.build(make_plan(load_spec(CPU_SPEC)))
    assert checks.repository(repo, deployment) == []
    for model in ("tensorrt_llm", "tensorrt_llm_draft"):
        config = configs.read_config(repo / model / "config.pbtxt")
        role = "target" if model == "tensorrt_llm" else "draft"
        assert config.parameters["hf_model_dir"].string_value == f"/models/checkpoints/{role}"


# --- the llmapi flavor: trtllm-serve ----------------------------------------------------------------


def test_llmapi_deployment_runs_trtllm_serve(written, plans):
    objects = {obj["kind"]: obj for obj in _objects(written, "llmapi")}
    pod = _pod(objects["Deployment"])
    (server,) = pod["containers"]
    assert server["image"] == images.TRTLLM_RELEASE_IMAGE.ref == "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"
    argv = server["command"] + server["args"]
    spec = plans["llmapi"].spec
    # The target's checkpoint and the options file (1.2.x's flag) on the volume; the API on every address.
    assert argv[:2] == ["trtllm-serve", "/models/checkpoints/target"]
    assert argv[argv.index("--extra_llm_api_options") + 1] == f"/models/model_repo/{OPTIONS_FILE}"
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[argv.index("--tp_size") + 1] == str(spec.target.tp_size)
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "4"
    # Probes on /health at the container's own port, the startup budget covering the weights' load.
    assert server["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"] == {"path": "/health", "port": "http"}
    startup = server["startupProbe"]
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    assert budget >= manifests.engine_bytes(plans["llmapi"]) / 250e6 + manifests.TRTLLM_SERVE_STARTUP_FIXED_S
    # GPU nodes, /dev/shm for NCCL, rolling update keeping capacity, graceful termination, no Secret.
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == list(GPU_PRODUCTS["h100"])
    shm = next(volume for volume in pod["volumes"] if volume["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert objects["Deployment"]["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    assert pod["terminationGracePeriodSeconds"] == manifests.PRESTOP_SLEEP_S + 25 + manifests.STOP_MARGIN_S
    assert server["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", str(manifests.PRESTOP_SLEEP_S)]
    assert "secretGenerator" not in yaml.safe_load((written / "llmapi" / "kustomization.yaml").read_text())
    assert [port["name"] for port in objects["Service"]["spec"]["ports"]] == ["http"]


def test_llmapi_autoscaling_scrapes_trtllm_serve(written):
    objects = {obj["kind"]: obj for obj in _objects(written, "llmapi-hpa")}
    endpoint = objects["PodMonitor"]["spec"]["podMetricsEndpoints"][0]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/prometheus/metrics")
    (rule,) = objects["PrometheusRule"]["spec"]["groups"][0]["rules"]
    assert rule["record"] == manifests.QUEUE_TIME_METRIC
    # Both names upstream has used for the queue-time histogram (unprefixed, then trtllm_).
    assert '{__name__=~"(trtllm_)?request_queue_time_seconds_sum",pod=~"llama70b-1b-' in rule["expr"]
    # --openai: the OpenAI API is trtllm-serve's own port, also on the Service's 9000.
    openai = next(port for port in objects["Service"]["spec"]["ports"] if port["name"] == "openai")
    assert (openai["port"], openai["targetPort"]) == (manifests.OPENAI_PORT, "http")


def test_llmapi_repository_names_the_mounted_checkpoints(written, plans):
    repo = written / "llmapi-repo"
    deployment = manifests.build(plans["llmapi"])
    assert deployment.trtllm_line == "1.2"
    assert checks.repository(repo, deployment) == []
    options = llm_args.validate_yaml(repo / OPTIONS_FILE, "1.2")
    assert options.speculative_config.speculative_model == "/models/checkpoints/draft"
    model_yaml = yaml.safe_load((repo / MODEL_YAML).read_text())
    assert model_yaml["model"] == "/models/checkpoints/target"
    llm_args.validate_yaml(repo / MODEL_YAML, "1.2", kind="model_yaml")
    script = (repo / "trtllm-serve.sh").read_text()
    assert "trtllm-serve /models/checkpoints/target" in script and "--extra_llm_api_options" in script


def test_llmapi_repository_checks_catch_what_does_not_fit(tmp_path, written, plans, llmapi_spec):
    deployment = manifests.build(plans["llmapi"])
    # Negative control: the repository as `trt-spec repo` writes it (this machine's checkpoints, 1.3+ line).
    local = write_repository(load_spec(llmapi_spec), tmp_path / "local", flavor="llmapi")
    problems = checks.repository(local.path, deployment)
    assert any("is not under the volume mounted at /models" in line for line in problems)
    # A tp that is not the pod's GPU count, and a key the image's line refuses.
    repo = tmp_path / "edited"
    shutil.copytree(written / "llmapi-repo", repo)
    options = yaml.safe_load((repo / OPTIONS_FILE).read_text())
    options["tensor_parallel_size"] = 2
    options["speculative_config"]["use_rejection_sampling"] = True  # 1.3+ only
    (repo / OPTIONS_FILE).write_text(yaml.safe_dump(options))
    problems = checks.repository(repo, deployment)
    assert any("tensor_parallel_size 2, but the pod has 4 GPU(s)" in line for line in problems)
    assert any("use_rejection_sampling" in line and "1.2.x" in line for line in problems)


def test_llmapi_image_tag_picks_the_line(tmp_path, plans):
    deployment = manifests.build(
        plans["llmapi"], manifests.DeployOptions(image="nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc27")
    )
    assert (deployment.trtllm_version, deployment.trtllm_line) == ("1.3.0rc27", "1.3")
    args = deployment.kind("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--config" in args and "--extra_llm_api_options" not in args
    assert checks.files_under_mounts(deployment.objects) == []
    assert manifests.image_trtllm_version("registry.local/trtllm:latest") is None
    with pytest.raises(manifests.DeployError):
        manifests.DeployOptions(trtllm_version="1.1")


# --- the versions table and the flavor registry ------------------------------------------------------


def test_every_flavor_has_a_launcher_and_an_image():
    for flavor in FLAVORS.values():
        assert flavor.launcher in manifests.SERVERS, flavor.name
        assert flavor.launcher in images.SERVER_IMAGES, flavor.name
    assert images.TRTLLM_IMAGE.ref.endswith(":26.07-trtllm-python-py3")
    assert images.TRTLLM_IMAGE.trtllm_version == images.TRTLLM_RELEASE_IMAGE.trtllm_version == "1.2.1"
    assert images.TRTLLM_RELEASE_IMAGE.ref.endswith(f":{images.TRTLLM_RELEASE_IMAGE.trtllm_version}")


def test_the_default_engine_image_carries_a_tensorrt_llm_trt_spec_serves():
    from trt_spec.engines.versions import trtllm_version_problem

    # The tensorrtllm flavor's default image serves engines built in it: 1.2.1 or a later 1.2.x
    # (engines/versions.py, MIN_TRTLLM: the chunked-context KV-cache reuse fix).
    assert images.TRTLLM_IMAGE.trtllm_version is not None
    assert trtllm_version_problem(images.TRTLLM_IMAGE.trtllm_version) is None
    assert trtllm_version_problem("1.2.0") is not None  # the check itself refuses what came before


def test_deploy_compares_no_flavor_name():
    """Issue 21's rule: deploy asks the Flavor objects (launcher, needs_gpus), it names no flavor."""
    for path in (ROOT / "trt_spec" / "deploy").glob("*.py"):
        text = path.read_text()
        for name in FLAVORS:
            assert f'flavor == "{name}"' not in text and f"flavor == '{name}'" not in text, path
        assert "flavor ==" not in text and "flavor !=" not in text and "flavor not in (" not in text, path
