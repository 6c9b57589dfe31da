"""Process trees of the common inference engines, as ``programs.py`` ``tree`` specs.

Runs inside a node, imported by ``launcher.py`` as a sibling module (standard library
only). Each tree has the real engine's shape, command lines and ``comm`` names; which of
its processes hold GPUs follows the real engine too. Workers are forked, not exec'd, so a
busy node costs one interpreter per tree.

Example: ``vllm([0, 1], "/models/m", 8000)`` is ``python3 -m
vllm.entrypoints.openai.api_server ...`` -> ``VLLM::EngineCore`` -> ``VLLM::Worker_TP0``
(GPU 0) and ``VLLM::Worker_TP1`` (GPU 1).

>>> [c["title"] for c in vllm([0, 1], "/m", 8000)["children"][0]["children"]]
['VLLM::Worker_TP0', 'VLLM::Worker_TP1']
>>> sorted(ENGINES)
['ray', 'tgi', 'triton', 'trtllm', 'vllm']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Spec = dict[str, Any]
PY = "/usr/bin/python3"


def titled(title: str, gpus: list[int] | None = None, **extra: Any) -> Spec:
    """A setproctitle user (``VLLM::Worker_TP0``): NUL-padded title, comm = title[:15]."""
    spec: Spec = {"role": "tree", "title": title, "comm": title[:15], "setproctitle": True}
    spec.update(gpus=gpus or [], **extra)
    return spec


def binary(argv: list[str], comm: str, gpus: list[int] | None = None, **extra: Any) -> Spec:
    """A process whose /proc/PID/cmdline is ``argv`` (an executable run by name)."""
    spec: Spec = {"role": "tree", "argv": argv, "comm": comm[:15], "title": " ".join(argv)}
    spec.update(gpus=gpus or [], **extra)
    return spec


def vllm(gpus: list[int], model: str, port: int) -> Spec:
    """vLLM V1 with tensor parallelism: the API server and EngineCore hold no GPU."""
    workers = [titled(f"VLLM::Worker_TP{rank}", [gpu]) for rank, gpu in enumerate(gpus)]
    argv = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    argv += ["--tensor-parallel-size", str(len(gpus)), "--port", str(port)]
    return binary(argv, "python3", children=[titled("VLLM::EngineCore", children=workers)])


def trtllm(gpus: list[int], model: str, port: int) -> Spec:
    """trtllm-serve (a console script: python3 + its path; comm is the script's name) is
    rank 0 on the first GPU; the other ranks are MPI-spawned workers, one GPU each."""
    argv = [PY, "/usr/local/bin/trtllm-serve", "serve", model, "--tp_size", str(len(gpus))]
    argv += ["--host", "0.0.0.0", "--port", str(port)]
    ranks = [binary([PY, "-m", "mpi4py.futures.server"], "python3", [g]) for g in gpus[1:]]
    return binary(argv, "trtllm-serve", gpus[:1], children=ranks)


def triton(gpus: list[int], model: str, port: int) -> Spec:
    """tritonserver is one process that holds every GPU it serves."""
    argv = ["tritonserver", f"--model-repository={model}", f"--http-port={port}"]
    return binary(argv, "tritonserver", gpus)


def tgi(gpus: list[int], model: str, port: int) -> Spec:
    """text-generation-launcher (Rust) starts one Python shard per GPU and the router."""
    shards = [
        binary(
            [
                PY,
                "/usr/local/bin/text-generation-server",
                "serve",
                model,
                "--sharded",
                "--uds-path",
                "/tmp/text-generation-server",
                "--json-output",
            ],
            "text-generation-server",
            [gpu],
        )
        for gpu in gpus
    ]
    router = binary(
        ["text-generation-router", "--port", str(port), "--tokenizer-name", model],
        "text-generation-router",
    )
    argv = ["text-generation-launcher", "--model-id", model, "--num-shard", str(len(gpus))]
    argv += ["--port", str(port)]
    return binary(argv, "text-generation-launcher", children=[*shards, router])


def ray(gpus: list[int], model: str, port: int) -> Spec:
    """``ray start --head --block`` with its gcs_server and raylet; the raylet's workers
    (``ray::RayWorkerWrapper``) hold one GPU each, an idle worker holds none."""
    base = "/usr/local/lib/python3.10/dist-packages/ray/core/src/ray"
    workers = [titled("ray::RayWorkerWrapper", [gpu]) for gpu in gpus] + [titled("ray::IDLE")]
    raylet = binary(
        [
            f"{base}/raylet/raylet",
            "--raylet_socket_name=/tmp/ray/session_latest/sockets/raylet",
            f"--node_manager_port={port}",
            f"--num_gpus={len(gpus)}",
        ],
        "raylet",
        children=workers,
    )
    gcs = binary([f"{base}/gcs/gcs_server", "--gcs_server_port=6379"], "gcs_server")
    argv = [PY, "/usr/local/bin/ray", "start", "--head", f"--num-gpus={len(gpus)}", "--block"]
    return binary(argv, "ray", children=[gcs, raylet])


ENGINES: dict[str, Callable[[list[int], str, int], Spec]] = {
    "vllm": vllm,
    "trtllm": trtllm,
    "triton": triton,
    "tgi": tgi,
    "ray": ray,
}
DEFAULT_MODEL = "/models/Llama-3.1-70B-Instruct"
DEFAULT_PORT = {"vllm": 8000, "trtllm": 8000, "triton": 8001, "tgi": 8080, "ray": 6380}


def longest(spec: Spec) -> int:
    """Longest command line in the tree: the argv area every process inherits must hold it.

    >>> longest(binary(["a", "bcd"], "a", children=[titled("x" * 10)]))
    10
    """
    own = len(spec.get("title", ""))
    return max([own, *(longest(c) for c in spec.get("children", []))])
