"""Which filesystem a path is on, from mountinfo text (the CDI store writes on a memory
filesystem from the event loop, on a disk from a thread)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.state.filesystems import filesystem_of, on_memory_filesystem, parse_mountinfo

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
23 22 0:21 / /run rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,mode=755
24 23 0:22 / /run/cdi rw shared:6 - ramfs none rw
25 22 0:23 / /var/lib/kubelet rw - xfs /dev/sdb1 rw
26 22 0:24 / /mnt/with\\040space rw - tmpfs tmpfs rw
27 22 0:25 / /opt/odd rw master:2 propagate_from:1 - overlay overlay rw
garbage line
"""


def test_parse_mountinfo_reads_points_and_types() -> None:
    assert parse_mountinfo(MOUNTINFO) == [
        ("/", "ext4"),
        ("/run", "tmpfs"),
        ("/run/cdi", "ramfs"),
        ("/var/lib/kubelet", "xfs"),
        ("/mnt/with space", "tmpfs"),
        ("/opt/odd", "overlay"),
    ]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/var/run-not-run/cdi", "ext4"),  # a prefix of the text is not a parent
        ("/run", "tmpfs"),
        ("/run/fractional-gpu-dra/mps", "tmpfs"),
        ("/run/cdi/k8s.json", "ramfs"),  # the deepest mount wins
        ("/var/lib/kubelet/plugins/x", "xfs"),
        ("/mnt/with space/a", "tmpfs"),
        ("/etc/cdi", "ext4"),
    ],
)
def test_filesystem_of_picks_the_deepest_mount(path: str, expected: str) -> None:
    assert filesystem_of(path, parse_mountinfo(MOUNTINFO)) == expected


def test_a_path_not_made_yet_is_judged_by_its_nearest_parent(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(f"1 0 0:1 / / rw - ext4 x rw\n2 1 0:2 / {tmp_path} rw - tmpfs t rw\n")
    assert on_memory_filesystem(str(tmp_path / "not" / "yet"), str(info))
    assert not on_memory_filesystem("/etc", str(info))
    assert not on_memory_filesystem(str(tmp_path), str(tmp_path / "no-mountinfo"))
