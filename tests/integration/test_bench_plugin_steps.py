"""hack/bench/plugin_steps.py runs the path it times (a real agent client against a
server process) and prints a figure for each step."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_it_prints_each_steps_cpu() -> None:
    script = os.path.join(ROOT, "hack", "bench", "plugin_steps.py")
    done = subprocess.run(
        [sys.executable, script, "--requests", "40", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    figures = dict(re.findall(r"^(\S.*?) +([0-9.]+)$", done.stdout, re.MULTILINE))
    steps = ["agent request", "parse_whole", "checkpoint encode", "mps_namespaces"]
    assert sorted(figures) == sorted(steps), done.stdout
    assert all(float(figures[step]) > 0 for step in steps)
