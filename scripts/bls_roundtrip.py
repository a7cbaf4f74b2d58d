#!/usr/bin/env python3
"""Measure what one BLS call costs on this machine's Triton python backend, apart from trt-spec.

The loop model makes two BLS calls per draft -> verify iteration (draft, then target), so their
transport cost is a floor under the loop's overhead per iteration. This script serves a
repository of three python models: ``caller`` makes N blocking BLS calls (``exec()``, what the
loop model does for a lone request) to ``callee``, which busy-waits ``--work-ms`` (standing in
for an engine's forward pass) and returns its input. Printed per work time: the median and
10th/90th percentile of (call wall time - work), i.e. the transport alone.

    python scripts/bls_roundtrip.py                 # bundled CPU Triton (nvidia-pytriton)
    python scripts/bls_roundtrip.py --work-ms 0 --work-ms 8 --calls 300
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
from pathlib import Path

import numpy as np

from trt_spec.repository.configs import to_model_config, write_config
from trt_spec.serving.server import TritonServer

CALLEE = textwrap.dedent("""
    import time

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
                work_s = float(pb_utils.get_input_tensor_by_name(request, "work_ms").as_numpy().reshape(-1)[0]) / 1e3
                end = time.perf_counter() + work_s
                while time.perf_counter() < end:
                    pass
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("output_ids", ids)]))
            return responses
""")

CALLER = textwrap.dedent("""
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                calls = int(pb_utils.get_input_tensor_by_name(request, "calls").as_numpy().reshape(-1)[0])
                work = pb_utils.get_input_tensor_by_name(request, "work_ms").as_numpy().reshape(1, 1)
                ids = np.arange(64, dtype=np.int32).reshape(1, 64)
                transport_us = []
                for _ in range(calls):
                    call = pb_utils.InferenceRequest(
                        model_name="callee", inputs=[pb_utils.Tensor("input_ids", ids), pb_utils.Tensor("work_ms", work)],
                        requested_output_names=["output_ids"])
                    started = time.perf_counter()
                    response = call.exec()
                    elapsed = time.perf_counter() - started
                    if response.has_error():
                        raise RuntimeError(response.error().message())
                    transport_us.append(elapsed * 1e6 - float(work[0, 0]) * 1e3)
                responses.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("transport_us", np.array(transport_us, dtype=np.float64))]))
            return responses
""")


def _io(name: str, dtype: str, dims: list[int]) -> dict:
    return {"name": name, "data_type": f"TYPE_{dtype}", "dims": dims}


def write_repo(repo: Path) -> None:
    models = {
        "callee": (
            [_io("input_ids", "INT32", [-1]), _io("work_ms", "FP32", [1])],
            [_io("output_ids", "INT32", [-1])],
            8,
            CALLEE,
        ),
        "caller": (
            [_io("calls", "INT32", [1]), _io("work_ms", "FP32", [1])],
            [_io("transport_us", "FP64", [-1])],
            0,
            CALLER,
        ),
    }
    for name, (inputs, outputs, max_batch_size, source) in models.items():
        config = {
            "name": name,
            "backend": "python",
            "max_batch_size": max_batch_size,
            "input": inputs,
            "output": outputs,
            "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        }
        write_config(to_model_config(config), repo)
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "1" / "model.py").write_text(source)


def measure(url: str, work_ms: float, calls: int) -> np.ndarray:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    inputs = [grpcclient.InferInput("calls", [1], "INT32"), grpcclient.InferInput("work_ms", [1], "FP32")]
    inputs[0].set_data_from_numpy(np.array([calls], dtype=np.int32))
    inputs[1].set_data_from_numpy(np.array([work_ms], dtype=np.float32))
    transport = client.infer("caller", inputs, client_timeout=600).as_numpy("transport_us")
    client.close()
    return transport[min(10, calls // 10) :]  # the first calls pay one-time costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work-ms", type=float, action="append", help="callee busy time per call (repeatable); default 0, 1, 2, 8"
    )
    parser.add_argument("--calls", type=int, default=200, help="BLS calls per work time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trt-spec-bls-") as tmp:
        repo = Path(tmp) / "repo"
        write_repo(repo)
        with TritonServer(repo) as server:
            print(
                f"BLS exec() round trip to a python model, {args.calls} calls each; transport = call time - callee work"
            )
            for work_ms in args.work_ms or [0.0, 1.0, 2.0, 8.0]:
                transport = measure(server.grpc_url, work_ms, args.calls)
                p10, median, p90 = np.percentile(transport, [10, 50, 90]) / 1e3
                print(f"callee work {work_ms:5.1f} ms: transport median {median:.2f} ms (p10 {p10:.2f}, p90 {p90:.2f})")


if __name__ == "__main__":
    main()
