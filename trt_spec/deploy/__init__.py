"""Kubernetes manifests for a spec's deployment (``trt-spec k8s``): a kustomization of a Deployment
of Triton on the plan's GPUs (or the torch flavor on CPU), its Service, PodDisruptionBudget and
autoscaling on Triton's queue/compute ratio (PodMonitor, PrometheusRule, prometheus-adapter rule,
HPA). ``manifests`` builds and writes the objects, ``checks`` cross-checks them and the
repository they serve, ``images`` is the versions table, ``repository`` writes the repository for
the pod's mount points. docs/deploy.md is the guide."""
