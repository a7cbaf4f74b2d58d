"""``k8s`` writes the Kubernetes manifests of a spec's deployment: a kustomization directory."""

from __future__ import annotations

import dataclasses

import click

from trt_spec.cli.common import read_spec, spec_option
from trt_spec.errors import ServerError


@click.command()
@spec_option
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(file_okay=False),
    default="k8s",
    show_default=True,
    help="The kustomization directory to write (replaced as a whole; its admin.env is kept).",
)
@click.option("--name", default=None, help="The objects' name. Default: the spec's name.")
@click.option(
    "--image",
    default=None,
    help="The server's image. Default, from the versions table: NVIDIA's Triton TensorRT-LLM container "
    "(tensorrtllm flavor; use the one your engines were built in), TensorRT-LLM's release container (llmapi "
    "flavor), the trt-spec image (torch flavor).",
)
@click.option(
    "--trt-spec-image",
    default=None,
    help="An image with trt-spec[triton,openai] installed (docs/deploy.md): the torch flavor's server and the "
    "OpenAI sidecar. Default: trt-spec:<version>.",
)
@click.option(
    "--gpu-product",
    "gpu_products",
    multiple=True,
    metavar="LABEL",
    help="A nvidia.com/gpu.product value the pods may run on (repeatable). Default: the spec's GPU's.",
)
@click.option(
    "--pvc", default=None, help="The PersistentVolumeClaim holding the repository and engines. Default: <name>-models."
)
@click.option(
    "--mount-path",
    default="/models",
    show_default=True,
    help="Where the volume is mounted: the repository at <mount>/model_repo, engines at <mount>/engines.",
)
@click.option("--min-replicas", default=1, show_default=True, type=click.IntRange(1))
@click.option("--max-replicas", default=4, show_default=True, type=click.IntRange(1))
@click.option(
    "--hpa-target",
    default="1",
    show_default=True,
    metavar="R",
    help="What the autoscaler aims for per replica: Triton's queue/compute ratio (time queued over time computing; "
    "tensorrtllm and torch flavors), or the mean seconds a request waited in trtllm-serve's queue (llmapi flavor).",
)
@click.option("--openai", is_flag=True, help="Also serve the OpenAI-compatible endpoint (port 9000).")
@click.option(
    "--drain-timeout",
    default=25,
    show_default=True,
    type=click.IntRange(0),
    help="On SIGTERM, seconds requests in flight may finish; the grace period adds 15 s.",
)
@click.option(
    "--allow-client-apis",
    default="none",
    show_default=True,
    metavar="APIS",
    help="Triton APIs open to every client (as `serve`'s): shared-memory, model-repository, logging, trace, all, none.",
)
@click.option(
    "--load-throughput",
    default=250.0,
    show_default=True,
    type=click.FloatRange(min=1),
    metavar="MB/S",
    help="How fast a replica reads its engines from the volume: sets the startup probe's budget.",
)
@click.option(
    "--trtllm-version",
    default=None,
    metavar="V",
    help="llmapi flavor: the TensorRT-LLM release of the image (picks the options' line and flag). "
    "Default: the image tag's version, else the versions table's.",
)
@click.option(
    "--repo",
    "repo",
    default=None,
    type=click.Path(exists=True, file_okay=False),
    help="A repository written for this deployment: checked against the mount and the GPUs.",
)
@click.option(
    "--write-repo",
    default=None,
    type=click.Path(file_okay=False),
    help="Also write the repository for the pod's mount points here (copy it to <volume>/model_repo).",
)
def k8s(
    spec_path,
    out_dir,
    name,
    image,
    trt_spec_image,
    gpu_products,
    pvc,
    mount_path,
    min_replicas,
    max_replicas,
    hpa_target,
    openai,
    drain_timeout,
    allow_client_apis,
    load_throughput,
    trtllm_version,
    repo,
    write_repo,
) -> None:
    """Write Kubernetes manifests for the spec's deployment: a kustomization (`kubectl apply -k DIR`).

    A Deployment on the plan's GPUs (tensorrtllm flavor: Triton in NVIDIA's TensorRT-LLM container,
    orchestrator mode; llmapi flavor: trtllm-serve in TensorRT-LLM's release container; torch flavor:
    `trt-spec serve` on CPU), with probes sized to model loading, a rolling update that keeps
    capacity, a drain on termination (Triton: the admin APIs behind a header from a Secret); a
    Service, a PodDisruptionBudget, and autoscaling: PodMonitor, PrometheusRule, prometheus-adapter
    rule, HPA on Triton's queue/compute ratio, or on trtllm-serve's request queue time when its
    options set return_perf_metrics (else no autoscaling, and a note says so).

    The pods read the repository and engines (or checkpoints) from a PersistentVolumeClaim mounted at
    --mount-path; write the repository for it with --write-repo (or `trt-spec repo --engines-mount
    MOUNT/engines`). See docs/deploy.md.

    \b
    Examples:
      trt-spec k8s --spec examples/llama70b-1b-4xh100.yaml -o k8s/llama70b --image nvcr.io/nvidia/tritonserver:<tag>
      trt-spec k8s --spec examples/pystdlib-demo.yaml -o k8s/demo --write-repo k8s/demo-repo
      trt-spec k8s --spec llmapi-spec.yaml -o k8s/llmapi --write-repo k8s/llmapi-repo   # triton.flavor: llmapi
      kubectl apply -k k8s/llama70b
    """
    from trt_spec.deploy import checks, manifests
    from trt_spec.deploy.repository import perf_metrics_enabled, write_mounted_repository
    from trt_spec.plan import make_plan
    from trt_spec.serving.server import parse_client_apis

    if min_replicas > max_replicas:
        raise click.BadParameter(f"{min_replicas} > --max-replicas {max_replicas}", param_hint="--min-replicas")
    try:
        client_apis = parse_client_apis(allow_client_apis)
    except ServerError as exc:  # one line naming the valid names
        raise click.BadParameter(str(exc), param_hint="--allow-client-apis") from None
    spec = read_spec(spec_path)
    plan = make_plan(spec)
    options = manifests.DeployOptions(
        name=name,
        image=image,
        trt_spec_image=trt_spec_image,
        gpu_products=tuple(gpu_products),
        pvc=pvc,
        mount_path=mount_path,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        hpa_target=hpa_target,
        openai=openai,
        drain_timeout_s=drain_timeout,
        client_apis=client_apis,
        load_throughput_mb_s=load_throughput,
        trtllm_version=trtllm_version,
    )
    deployment = manifests.build(plan, options)
    if write_repo:
        result = write_mounted_repository(spec, deployment, write_repo)
        click.echo(f"wrote {result.path} ({result.flavor} flavor): copy it to the volume's model_repo/")
        repo = repo or str(result.path)
    if repo and perf_metrics_enabled(repo):  # trtllm-serve will serve Prometheus metrics: scale on them
        options = dataclasses.replace(options, perf_metrics=True)
        deployment = manifests.build(plan, options)
    problems = checks.cross_references(deployment.objects, plan)
    if repo:
        problems += checks.repository(repo, deployment)
    if problems:
        raise click.ClickException("the manifests do not hold together: " + "; ".join(problems))
    path = manifests.write(deployment, out_dir)
    for note in deployment.notes:
        click.echo(f"note: {note}")
    gpus = f"{deployment.gpus} GPU(s) per replica" if deployment.gpus else "CPU"
    click.echo(
        f"wrote {path}: {', '.join(obj['kind'] for obj in deployment.objects)} for {deployment.name} "
        f"({deployment.flavor} flavor, {gpus}, startup budget {deployment.startup_budget_s} s, /dev/shm "
        f"{deployment.shm_bytes >> 30} GiB)"
    )
    if not repo:
        click.echo(
            f"repository: add --write-repo DIR (it names the checkpoints under the mount too), or run "
            f"{manifests.repo_command(spec_path, deployment)}; then copy it to the volume's model_repo/"
        )
    click.echo(f"next: kubectl apply -k {path}")


commands = [k8s]
