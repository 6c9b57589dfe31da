"""What a process is (``lib-match.sh``'s identity), on command lines as /proc/PID/cmdline
holds them: NUL-separated words, a setproctitle title NUL-padded to the end of the old
argv area, comm as /proc/PID/comm holds it (15 bytes at most).

One bash process reads every case (no simulator, no fork per case): each case is written as
its raw cmdline bytes, and bash reads it with ``mapfile -d ''`` as ``fc_cmdline`` does, drops
the empty tail (the padding) and calls ``fc_identity`` with those words in scope (``argv``,
``lo``), as ``fc_cmdline`` calls it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleetclean.engine.stages import template

PAD = "\0" * 180  # what setproctitle leaves after a short title in a long argv area

# (comm, raw cmdline, expected part, expected identity)
CASES: list[tuple[str, str, str, str]] = [
    # SGLang: the server, its setproctitle workers.
    ("python3", "python3\0-m\0sglang.launch_server\0--model-path\0/models/Kimi-K2.5\0--tp\0008"
     "\0--trust-remote-code\0", "module", "python3 -m sglang.launch_server"),
    ("sglang::schedul", "sglang::scheduler_TP0" + PAD, "title", "sglang::scheduler_TP0"),
    ("sglang::detoken", "sglang::detokenizer" + PAD, "title", "sglang::detokenizer"),
    ("python3", "/usr/bin/python3\0-c\0from multiprocessing.spawn import spawn_main; "
     "spawn_main(tracker_fd=8, pipe_handle=10)\0--multiprocessing-fork\0", "code",
     "/usr/bin/python3 -c from multiprocessing.spawn import spawn_main"),
    # vLLM.
    ("vllm", "/usr/bin/python3\0/usr/local/bin/vllm\0serve\0meta-llama/Llama-3.1-70B\0"
     "--tensor-parallel-size\0008\0", "script", "/usr/bin/python3 /usr/local/bin/vllm serve"),
    ("python3", "python3\0-m\0vllm.entrypoints.openai.api_server\0--model\0/m\0", "module",
     "python3 -m vllm.entrypoints.openai.api_server"),
    ("VLLM::EngineCor", "VLLM::EngineCore" + PAD, "title", "VLLM::EngineCore"),
    ("VLLM::Worker_TP", "VLLM::Worker_TP3" + PAD, "title", "VLLM::Worker_TP3"),
    # TensorRT-LLM.
    ("trtllm-serve", "/usr/bin/python3\0/usr/local/bin/trtllm-serve\0serve\0/models/m\0"
     "--tp_size\0008\0", "script", "/usr/bin/python3 /usr/local/bin/trtllm-serve serve"),
    ("python3", "/usr/bin/python3\0-m\0mpi4py.futures.server\0", "module",
     "/usr/bin/python3 -m mpi4py.futures.server"),
    # Triton, TGI: binaries.
    ("tritonserver", "/opt/tritonserver/bin/tritonserver\0--model-repository=/models\0"
     "--exit-timeout-secs=30\0", "executable", "/opt/tritonserver/bin/tritonserver"),
    ("text-generation", "text-generation-launcher\0--model-id\0/models/m\0--num-shard\0008\0",
     "executable", "text-generation-launcher"),
    ("text-generation", "/opt/conda/bin/python3.11\0/opt/conda/bin/text-generation-server\0"
     "serve\0/models/m\0--sharded\0", "script",
     "/opt/conda/bin/python3.11 /opt/conda/bin/text-generation-server serve"),
    # Ray.
    ("ray", "/usr/bin/python3\0/usr/local/bin/ray\0start\0--head\0--block\0", "script",
     "/usr/bin/python3 /usr/local/bin/ray start"),
    ("ray::IDLE", "ray::IDLE" + PAD, "title", "ray::IDLE"),
    ("raylet", "/usr/local/lib/python3.10/dist-packages/ray/core/src/ray/raylet/raylet\0"
     "--raylet_socket_name=/tmp/ray/session_latest/sockets/raylet\0", "executable",
     "/usr/local/lib/python3.10/dist-packages/ray/core/src/ray/raylet/raylet"),
    # torchrun, its workers, jupyter.
    ("torchrun", "/usr/bin/python3\0/usr/local/bin/torchrun\0--nproc-per-node=8\0train.py\0",
     "script", "/usr/bin/python3 /usr/local/bin/torchrun"),
    ("python3", "/usr/bin/python3\0-u\0train.py\0--local-rank=0\0", "script",
     "/usr/bin/python3 train.py"),
    ("jupyter-lab", "/usr/bin/python3\0/usr/local/bin/jupyter-lab\0--allow-root\0"
     "--ip=0.0.0.0\0", "script", "/usr/bin/python3 /usr/local/bin/jupyter-lab"),
    ("python3", "/usr/bin/python3\0-m\0ipykernel_launcher\0-f\0/root/.local/share/jupyter/"
     "runtime/kernel-1.json\0", "module", "/usr/bin/python3 -m ipykernel_launcher"),
    # Scripts and code; interpreter options skipped; wrappers skipped.
    ("run_vllm_bench.", "/bin/bash\0/root/run_vllm_bench.sh\0sglang\0", "script",
     "/bin/bash /root/run_vllm_bench.sh"),
    ("python3", "python3\0/root/analyze_sglang_results.py\0--in\0/root/sglang_out\0", "script",
     "python3 /root/analyze_sglang_results.py"),
    ("python3.11", "/usr/bin/python3.11\0-u\0script.py\0--model\0sglang\0", "script",
     "/usr/bin/python3.11 script.py"),
    ("python3", "python3\0-X\0dev\0-W\0ignore\0-um\0sglang.launch_server\0", "module",
     "python3 -m sglang.launch_server"),
    ("python3", "env\0FOO=1\0CUDA_VISIBLE_DEVICES=0,1\0python3\0-m\0sglang.launch_server\0",
     "module", "python3 -m sglang.launch_server"),
    ("python3", "timeout\0-s\0KILL\0003600\0taskset\0-c\0000-7\0python3\0/opt/sglang/launch.py\0",
     "script", "python3 /opt/sglang/launch.py"),
    ("sh", "sh\0-c\0cd /opt && exec python3 -m sglang.launch_server --tp 8\0", "code",
     "sh -c cd; python3 -m sglang.launch_server"),
    ("sh", "sh\0-c\0grep -c sglang /root/logs/x.log | tail -1\0", "code", "sh -c grep; tail"),
    # A loop that runs the server again (in tmux, or docker exec'd) is matched as it, also
    # while it sleeps between two runs: `do python3` read as a command "do" hid it.
    ("sh", "sh\0-c\0while :; do python3 -m sglang.launch_server --tp 8; sleep 1; done\0",
     "code", "sh -c :; python3 -m sglang.launch_server; sleep"),
    ("bash", "bash\0-c\0until false; do\n  if [ -f /tmp/stop ]; then break; fi\n"
     "  time CUDA_VISIBLE_DEVICES=0 python3 -m vllm.entrypoints.openai.api_server\ndone\0",
     "code", "bash -c false; [; break; python3 -m vllm.entrypoints.openai.api_server"),
    ("sh", "sh\0-c\0for i in sglang vllm; do echo $i; done\0", "code", "sh -c echo"),
    ("sh", "sh\0-c\0while :; do time -p python3 -m sglang.launch_server; done\0", "code",
     "sh -c :; python3 -m sglang.launch_server"),
    # Quoted text and comments are cut by the split, not parsed: their words never count
    # as commands (a shell driving a server on another node over ssh is no server here).
    ("bash", "bash\0-c\0echo \"usage: while :; do python3 -m sglang.launch_server; done\"; "
     "sleep 9\0", "code", "bash -c echo; do; done\"; sleep"),
    ("bash", "bash\0-c\0# was: while :; do python3 -m sglang.launch_server; done\nsleep 9\0",
     "code", "bash -c #; do; done; sleep"),
    ("bash", "bash\0-c\0ssh gpu07 \"while :; do python3 -m sglang.launch_server; done\"\0",
     "code", "bash -c ssh; do; done\""),
    ("python3", "python3\0-c\0import json; print(open('/root/sglang.json').read())\0", "code",
     "python3 -c import json"),
    ("java", "java\0-Xmx4g\0-Dname=sglang\0-jar\0/opt/proxy/gateway.jar\0--port\0001\0",
     "script", "java -jar /opt/proxy/gateway.jar"),
    ("node", "node\0--max-old-space-size=4096\0/opt/ui/server.js\0/root/sglang\0", "script",
     "node /opt/ui/server.js"),
    # Bystanders that only mention a server: file arguments never count.
    ("tail", "tail\0-f\0/root/logs/sglang_server.log\0", "executable", "tail"),
    ("less", "less\0/var/log/vllm/engine.log\0", "executable", "less"),
    ("vim", "vim\0/root/sglang/README.md\0", "executable", "vim"),
    ("watch", "watch\0-n\0001\0grep sglang /root/x\0", "executable", "watch"),
    ("tmux: server", "tmux\0new-session\0-d\0-s\0sglang\0", "executable", "tmux"),
    ("python3", "python3\0-m\0http.server\0008000\0", "module", "python3 -m http.server"),
    # Titles without padding, one-string command lines, login shells.
    ("sshd", "sshd: root@notty\0", "title", "sshd: root@notty"),
    ("python3", "python3 /opt/monitor/agent.py --interval 5\0", "script",
     "python3 /opt/monitor/agent.py"),
    ("bash", "-bash\0", "executable", "-bash"),
    ("python3", "python3\0", "executable", "python3"),
    # Words are split, never globbed: /bi? would be /bin.
    ("sh", "sh\0-c\0/bi?/sleep 1 && exec python3 -m sglang.launch_server\0", "code",
     "sh -c /bi?/sleep; python3 -m sglang.launch_server"),
    ("python3", "/usr/bi?/python3 /opt/monitor/agent.py --interval 5\0", "script",
     "/usr/bi?/python3 /opt/monitor/agent.py"),
    # A container's or a launcher's long script: every command, the server's among them.
    ("bash", "bash\0-c\0" + "; ".join([f"export V{i}=1 && echo step{i}" for i in range(60)])
     + "; cd /opt &&  taskset -c 0-7 python3 -m sglang.launch_server --tp 8\0", "code",
     "bash -c " + "; ".join(["export; echo"] * 60) + "; cd; python3 -m sglang.launch_server"),
]


def identities(cases: list[tuple[str, str, str, str]], tmp: Path) -> list[tuple[str, str]]:
    driver = [template("lib.sh"), template("lib-match.sh"), r"""
while IFS= read -r -d '' comm && IFS= read -r -d '' file; do
    mapfile -d '' -t argv <"$file"
    n=${#argv[@]} lo=${#argv[@]}
    while ((lo > 0)) && [[ -z ${argv[lo - 1]} ]]; do lo=$((lo - 1)); done
    fc_identity 1 "$comm" "$((n > lo))"
    printf '%s\t%s\n' "${FC_IDPART[1]}" "${FC_IDENT[1]}"
done
"""]
    feed = ""
    for i, (comm, raw, _, _) in enumerate(cases):
        f = tmp / f"cmdline{i}"
        f.write_bytes(raw.encode())
        feed += f"{comm}\0{f}\0"
    out = subprocess.run(["bash", "-c", "\n".join(driver)], input=feed, capture_output=True,
                         text=True, check=True).stdout
    return [tuple(line.split("\t", 1)) for line in out.splitlines()]  # type: ignore[misc]


@pytest.fixture(scope="module")
def got(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str]]:
    return identities(CASES, tmp_path_factory.mktemp("identity"))


@pytest.mark.parametrize("index", range(len(CASES)),
                         ids=[c[3][:40] or c[1][:20] for c in CASES])
def test_identity_of_a_captured_command_line(got: list[tuple[str, str]], index: int) -> None:
    _comm, raw, part, identity = CASES[index]
    assert got[index] == (part, identity), raw.replace("\0", "|")


def test_a_file_argument_naming_the_server_is_not_its_identity(
        got: list[tuple[str, str]]) -> None:
    spared = [got[i][1] for i, c in enumerate(CASES) if c[0] in ("tail", "less", "vim", "watch")]
    assert spared and not any("sglang" in s or "vllm" in s for s in spared)
