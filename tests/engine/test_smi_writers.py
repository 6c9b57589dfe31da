"""Every nvidia-smi the node's script runs sends its output whole at its end.

A reader waits for an nvidia-smi's first byte with a deadline (``smi_timeout``) and reads
the rest without one (lib.sh: fc_smi_read; under ``read -t`` bash reads a pipe a byte at a
time). That is safe only where nothing reaches the pipe before nvidia-smi has finished:
a call that streamed its rows and then stopped in a wedged driver would hold the script
for good. So each call is ``o=$(nvidia-smi ...)``, then ``printf`` (or goes through
``fc_smi``, which is written so).
"""

from __future__ import annotations

import re
from pathlib import Path

from fleetclean.engine.render import SMI_NOTES, early_reads

STAGES = Path(__file__).resolve().parents[2] / "fleetclean" / "engine" / "stages"
# nvidia-smi run as a command: at a line's start, after ; & | ( or $(, then its arguments
# (not "nvidia-smi:" in a message, nor "command -v nvidia-smi").
CALL = re.compile(r"(?:^|[;&|(]|\$\()\s*nvidia-smi\s")


def unbuffered(text: str) -> list[str]:
    """The lines of ``text`` that run nvidia-smi other than as ``o=$(nvidia-smi``."""
    bad = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        bad += [line.strip() for m in CALL.finditer(line)
                if not line[:m.end()].rstrip().endswith("o=$(nvidia-smi")]
    return bad


def test_every_nvidia_smi_of_the_stages_and_the_early_reads_sends_its_output_whole() -> None:
    found = {p.name: unbuffered(p.read_text()) for p in sorted(STAGES.glob("*.sh"))}
    assert {name: lines for name, lines in found.items() if lines} == {}
    for q_only, calls in ((False, 2), (True, 1)):
        gpu, _ = early_reads(q_only)
        # Its calls (one of two, as the node's count says), each with a PATH before it:
        # o=$(PATH=... nvidia-smi ...).
        assert gpu.count("nvidia-smi") == calls, gpu
        assert len(re.findall(r"o=\$\(PATH=\S+ nvidia-smi ", gpu)) == calls, gpu


def test_the_lint_sees_a_streaming_call() -> None:
    assert unbuffered("exec {fd}< <(nvidia-smi -q -d PIDS 2>&1; printf '@%d' $?)")
    assert unbuffered("    out=$(nvidia-smi --query-gpu=index --format=csv)")
    assert unbuffered('mapfile -t a < <(nvidia-smi --query-compute-apps=pid)')
    assert not unbuffered('o=$(nvidia-smi -q -d ROW_REMAPPER 2>&1)')
    assert not unbuffered('fc_rec nvsmi 127 "nvidia-smi: command not found"')
    assert not unbuffered("    if command -v nvidia-smi >/dev/null 2>&1; then")


def test_the_early_read_looks_for_the_notes_the_script_writes() -> None:
    """A status's first line starts no GPU read where a note says an earlier run's
    nvidia-smi waits in a hung driver: the paths it tests are lib.sh's FC_SMI_NOTES."""
    lib = (STAGES / "lib.sh").read_text()
    found = re.search(r"^FC_SMI_NOTES=\(([^)]*)\)", lib, re.M)
    assert found is not None
    notes = tuple(w.strip('"') for w in found.group(1).split())
    assert notes == SMI_NOTES
    root, mine, xdg = notes
    for q_only in (False, True):
        gpu, _ = early_reads(q_only)
        mine_dir, xdg_dir = mine.rsplit("/", 1)[0], xdg.rsplit("/", 1)[0]
        assert (f"[[ -e {root} || $EUID -gt 0 && (-O {mine_dir} && -O {mine} || "
                f"-O {xdg_dir} && -O {xdg}) ]] || {{ ") in gpu, gpu
    # fc_begin tests the same, and the writer writes where fc_smi_noted reads.
    assert ("[[ -e ${FC_SMI_NOTES[0]} || $EUID -gt 0 && (-O ${FC_SMI_NOTES[1]%/*} &&\n"
            "        -O ${FC_SMI_NOTES[1]} || -O ${FC_SMI_NOTES[2]%/*} && -O ${FC_SMI_NOTES[2]})"
            " ]]") in lib
    # Another login's note is written and read in FC_SMI_NOTES' own directories.
    assert 'fc_own_dir make "${FC_SMI_NOTES[1]%/*}" "${FC_SMI_NOTES[2]%/*}"' in lib
    assert lib.count('fc_own_dir look "${FC_SMI_NOTES[1]%/*}"') == 1
    assert lib.count('fc_own_dir look "${FC_SMI_NOTES[2]%/*}"') == 1
