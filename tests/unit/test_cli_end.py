"""The command's end (``cli.end``): the interpreter's teardown skipped, nothing lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Buffered standard streams, as a command's are (PYTHONUNBUFFERED would hide a lost flush).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def _python(code: str, **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-c", code], timeout=60, check=False, env=ENV,
                          **kwargs)  # type: ignore[call-overload]


def test_what_is_still_buffered_reaches_a_pipe_and_the_status_is_kept() -> None:
    # 100,003 characters into a pipe: the last block is still in Python's buffer at end().
    res = _python("from fleetclean.cli import end\n"
                  "print('x' * 100_000, end='', flush=False)\n"
                  "print('end')\n"
                  "end(1)", capture_output=True)
    assert res.returncode == 1, res.stderr
    assert res.stdout == b"x" * 100_000 + b"end\n"
    assert res.stderr == b""


def test_a_full_disk_is_a_failure_named_in_one_line() -> None:
    with open("/dev/full", "wb") as full:
        res = _python("from fleetclean.cli import end\nprint('{}')\nend(0)",
                      stdout=full, stderr=subprocess.PIPE)
    assert res.returncode == 2
    assert res.stderr == (b"fleetclean: error: the result could not be written to standard "
                          b"output: No space left on device\n")


def test_a_reader_gone_keeps_the_status() -> None:
    proc = subprocess.Popen([sys.executable, "-c",
                             "import sys, time\nfrom fleetclean.cli import end\n"
                             "sys.stdin.read()\nprint('x' * 10)\nend(1)"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before anything is written
    proc.stdin.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 1
    assert err == b""


def test_a_thread_still_at_work_is_waited_for(tmp_path: Path) -> None:
    done = tmp_path / "done"
    res = _python("import threading, time\nfrom fleetclean.cli import end\n"
                  "def work():\n"
                  "    time.sleep(0.3)\n"
                  f"    open({str(done)!r}, 'w').write('written')\n"
                  "threading.Thread(target=work).start()\n"
                  "end(0)", capture_output=True)
    assert res.returncode == 0, res.stderr
    assert done.read_text() == "written"


def test_a_closed_standard_output_or_error_is_no_crash() -> None:
    # As `fleetclean ... >&-` starts: Python's sys.stdout (or sys.stderr) is then None.
    for closed in (">&-", "2>&-"):
        res = subprocess.run(
            ["bash", "-c", f'exec "$0" -c "from fleetclean.cli import end; end(3)" {closed}',
             sys.executable], capture_output=True, timeout=60, check=False, env=ENV)
        assert res.returncode == 3, res.stderr
        assert res.stdout == res.stderr == b""


def test_a_command_that_fills_the_disk_says_so_in_one_line() -> None:
    # The bundle (100 KB) fails in its own write, inside the command: a failure, not a bug.
    with open("/dev/full", "wb") as full:
        res = subprocess.run([sys.executable, "-m", "fleetclean", "export", "script",
                              "post-extraction", "-i", "gpu01,"], stdout=full,
                             stderr=subprocess.PIPE, timeout=60, check=False, env=ENV)
    assert res.returncode == 2
    assert res.stderr == b"fleetclean: error: could not write: No space left on device\n"
