"""The benchmarks' CPU readers (tests/support/processes): a process's own CPU, its
reaped children's and its live children's, read from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.support.processes import cpu_s, live_children, reaped_cpu_s

BURN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
"""A child that spends 0.3 s of CPU, then exits."""


def test_a_reaped_childs_cpu_counts_for_its_parent_and_a_gone_process_reads_zero() -> None:
    before = reaped_cpu_s(os.getpid())
    child = subprocess.run([sys.executable, "-c", BURN], check=True)
    assert child.returncode == 0
    assert reaped_cpu_s(os.getpid()) - before >= 0.2
    assert cpu_s(os.getpid()) > 0
    assert cpu_s(2**22 + 1) == 0.0  # above the kernel's pid_max
    assert reaped_cpu_s(2**22 + 1) == 0.0
    assert live_children(2**22 + 1) == []


def test_a_live_childs_cpu_counts_with_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", BURN + "import sys\nsys.stdin.read()\n"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        assert child.pid in live_children(os.getpid())
        for _ in range(200):  # until it has burnt its 0.3 s
            if cpu_s(child.pid) >= 0.25:
                break
            time.sleep(0.05)
        me = os.getpid()
        # Beyond this process's own CPU and its reaped children's: the live child's.
        assert cpu_s(me, children=True) - cpu_s(me) - reaped_cpu_s(me) >= 0.25
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
