"""A stand-in for ``nvidia-smi memory-limits`` (driver 615+), for the dmem hook's tests.

It accepts what NVIDIA documents and refuses the rest:

* "MPS v3 Memory Partitioning", "Setting Limits" / "Quick Reference":
  ``nvidia-smi memory-limits --set -n <cgroup> --soft-limit <MiB> --hard-limit <MiB> -i <idx>``
  (``--namespace`` the long form of ``-n``), ``--get`` to read back;
* the Dynamo guide "Per-GPU Compute and Memory Limits with MPS", "Know the command
  syntax": ``nvidia-smi memory-limits -i <gpu index or UUID> -n <cgroup dir>
  --soft-limit <MiB> --hard-limit <MiB>``; ``memory-limits`` must come first (else
  ``Option memory-limits is not recognized``); values are MiB integers, ``max`` or
  ``default`` (a unit suffix: ``--soft-limit must be a non-negative MebiByte value``);
  ``-n`` is the full path of the cgroup directory;
* a cgroup without dmem files is refused ("not found"); setting a soft limit adds
  the change to every ancestor's ``dmem.min`` up to the first one without it
  ("Ancestor reservation propagation").

Which forms the real binary takes beyond these (``--opt=value``, a missing limit)
is not documented, so the fake refuses them. Exact error texts other than the two
quoted above are the fake's own.

:func:`install` writes an ``nvidia-smi`` launcher into a directory for ``PATH``;
each call is appended to ``calls.jsonl`` beside its configuration.
"""

from __future__ import annotations

import json
import pathlib
import shlex
import sys
from collections.abc import Mapping, Sequence

MIB = 1 << 20
HELP = """nvidia-smi memory-limits -- set or read a cgroup's device-memory limits

    -i,  --id=            GPU index or UUID.
    -n,  --namespace=     Full path of the cgroup directory.
         --set            Set the limits (the default).
         --get            Read the limits back.
         --soft-limit=    Soft limit in MiB, or max / default.
         --hard-limit=    Hard limit in MiB, or max / default.
    -h,  --help           This text.
"""


def install(bin_dir: pathlib.Path, gpus: Mapping[str, str]) -> pathlib.Path:
    """An ``nvidia-smi`` in ``bin_dir`` knowing ``gpus`` (UUID -> dmem region, in index order)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    config = bin_dir / "fake-nvidia-smi.json"
    config.write_text(json.dumps({"gpus": list(gpus.items())}))
    launcher = bin_dir / "nvidia-smi"
    launcher.write_text(
        "#!/bin/sh\n"
        f"exec {shlex.quote(sys.executable)} {shlex.quote(__file__)} "
        f'{shlex.quote(str(config))} "$@"\n'
    )
    launcher.chmod(0o755)
    return launcher


def calls(bin_dir: pathlib.Path) -> list[list[str]]:
    """Every argv the launcher in ``bin_dir`` was run with, in order."""
    path = bin_dir / "calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


class Refused(Exception):
    pass


def _mib(option: str, value: str) -> int | str:
    if value in ("max", "default"):
        return value
    if not value.isdigit():
        raise Refused(f"{option} must be a non-negative MebiByte value")
    return int(value)


def _parse(args: Sequence[str]) -> dict[str, str]:
    takes_value = {"-i": "id", "--id": "id", "-n": "namespace", "--namespace": "namespace",
                   "--soft-limit": "soft", "--hard-limit": "hard"}  # fmt: skip
    out: dict[str, str] = {}
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg in ("--set", "--get", "-h", "--help"):
            out[arg.lstrip("-")] = "yes"
        elif arg in takes_value:
            if not rest:
                raise Refused(f"option {arg} needs a value")
            out[takes_value[arg]] = rest.pop(0)
        else:
            raise Refused(f"Option {arg} is not recognized")
    return out


def _lines(path: pathlib.Path) -> dict[str, str]:
    return dict(
        line.split(maxsplit=1) for line in path.read_text().splitlines() if len(line.split()) == 2
    )


def _write(path: pathlib.Path, entries: Mapping[str, str]) -> None:
    path.write_text("".join(f"{k} {v}\n" for k, v in entries.items()))


def _set(region: str, cgroup: pathlib.Path, soft: int | str, hard: int | str) -> None:
    hard_value = "max" if hard in ("max", "default") else str(int(hard) * MIB)
    soft_bytes = 0 if soft in ("max", "default") else int(soft) * MIB
    maxes = _lines(cgroup / "dmem.max")
    maxes[region] = hard_value
    _write(cgroup / "dmem.max", maxes)
    mins = _lines(cgroup / "dmem.min")
    before = int(mins.get(region, "0"))
    mins[region] = str(soft_bytes)
    _write(cgroup / "dmem.min", mins)
    delta = soft_bytes - before
    up = cgroup.parent
    while (up / "dmem.min").is_file():  # the walk stops at the first without dmem.min
        theirs = _lines(up / "dmem.min")
        theirs[region] = str(max(0, int(theirs.get(region, "0")) + delta))
        _write(up / "dmem.min", theirs)
        up = up.parent


def run(config: pathlib.Path, argv: Sequence[str]) -> int:
    with open(config.parent / "calls.jsonl", "a") as log:
        log.write(json.dumps(list(argv)) + "\n")
    gpus = [(str(uuid), str(region)) for uuid, region in json.loads(config.read_text())["gpus"]]
    if not argv or argv[0] != "memory-limits":
        word = "memory-limits" if "memory-limits" in argv else (argv[0] if argv else "")
        print(f"Option {word} is not recognized. Please run 'nvidia-smi -h'.", file=sys.stderr)
        return 2
    try:
        options = _parse(argv[1:])
        if "help" in options or "h" in options:
            print(HELP)
            return 0
        for needed in ("id", "namespace"):
            if needed not in options:
                raise Refused(f"memory-limits needs -i and -n (missing {needed})")
        regions = {str(i): region for i, (_, region) in enumerate(gpus)} | dict(gpus)
        region = regions.get(options["id"])  # an index or a UUID
        if region is None:
            raise Refused(f"No GPU matches -i {options['id']}")
        cgroup = pathlib.Path(options["namespace"])
        if not cgroup.is_absolute():
            raise Refused(f"-n must be the full path of the cgroup directory, got {cgroup}")
        if not (cgroup / "dmem.max").is_file():
            raise Refused("Unable to set memory limit: Not Found")
        if "get" in options:
            print(f"namespace: {cgroup}")
            return 0
        if "soft" not in options or "hard" not in options:
            raise Refused("memory-limits needs --soft-limit and --hard-limit")
        soft = _mib("--soft-limit", options["soft"])
        hard = _mib("--hard-limit", options["hard"])
        _set(region, cgroup, soft, hard)
    except Refused as refused:
        print(str(refused), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run(pathlib.Path(sys.argv[1]), sys.argv[2:]))
