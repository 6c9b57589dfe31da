"""The open-files limit a run works within (transport.fdlimit): the soft limit raised as
far as the hard one allows, and what does not fit scaled down, in a child process whose
limits the test sets (this process's own stay as they are)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

CHILD = r"""
import json, resource, sys
soft, hard = map(int, sys.argv[1:3])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
from fleetclean.transport import fdlimit
out = {"forks": fdlimit.forks_that_fit(int(sys.argv[3])),
       "kept": fdlimit.kept_that_fit(int(sys.argv[4]), int(sys.argv[5]))}
out["soft"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
print(json.dumps(out))
"""


def limited(soft: int, hard: int, forks: int, hosts: int, in_flight: int) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(soft), str(hard), str(forks),
                          str(hosts), str(in_flight)],
                         capture_output=True, text=True, check=True, timeout=60)
    result: dict[str, int] = json.loads(out.stdout)
    return result


@pytest.mark.parametrize(("limits", "asked", "want"), [
    # (soft, hard), (forks, hosts, hosts in flight beside the kept ones)
    # macOS's soft 256 under a higher hard limit: raised, nothing scaled down.
    ((256, 4096), (64, 1000, 64), {"forks": 64, "kept": 1000, "soft": 64 + 256 + 1000}),
    # Linux's 1,024: a watch of 1,000 hosts needs more; the hard limit allows it.
    ((1024, 4096), (64, 1000, 64), {"forks": 64, "kept": 1000, "soft": 1320}),
    # A hard limit that does not allow it: fewer hosts at once, fewer connections kept.
    ((100, 100), (64, 1000, 8), {"forks": 9, "kept": 4, "soft": 100}),
    ((200, 200), (8, 1000, 8), {"forks": 8, "kept": 104, "soft": 200}),
    # Room enough already: left as it is.
    ((20000, 20000), (64, 256, 64), {"forks": 64, "kept": 256, "soft": 20000}),
])
def test_the_soft_limit_is_raised_as_far_as_needed_and_what_does_not_fit_is_scaled_down(
        limits: tuple[int, int], asked: tuple[int, int, int], want: dict[str, int]) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < limits[1]:
        pytest.skip(f"this machine's hard limit on open files is {hard}, under {limits[1]}")
    assert limited(*limits, *asked) == want
