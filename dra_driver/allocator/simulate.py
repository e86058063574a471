"""Packing simulation: a fake cluster, a workload of memory shares, the real allocator.

The cluster is ``nodes`` nodes with the fake GPUs ``gpus`` (``MODEL[:COUNT]``, as
``--fake-gpus``), each node's slices built by the real slice builder for a
Kubernetes 1.36 (or 1.34) cluster with every GPU controller-managed. The workload is
a list of memory requests, given or drawn from a seeded mix of model sizes; each
request becomes a one-device ResourceClaim of the shared class. Claims go through
:class:`~dra_driver.allocator.allocate.AllocatorState` one after another, as one
batch placed largest first (:func:`order_batch`, the controller's batching window).

Metrics: GPUs used, the lower bound ``ceil(sum of memory / GPU memory)``, their
ratio, memory utilisation of the used GPUs, what whole-GPU allocation would need
(one GPU per claim) and fragmentation (free memory stranded on partly used GPUs).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dra_driver.allocator.allocate import AllocatorState
from dra_driver.allocator.cel import sentinel_expression
from dra_driver.allocator.packing import Policy, best_fit, first_fit
from dra_driver.base.errors import ConfigError
from dra_driver.base.quantity import format_bytes, parse_quantity
from dra_driver.core.settings import Allocator, Capabilities, GpuSettings, NodeSettings
from dra_driver.core.slices import build_slices
from dra_driver.fakes.gpu import build_inventory, load_spec

DRIVER = "gpu.fractional.dev"
CLASS = "share.gpu.fractional.dev"
GI = 2**30
INFERENCE_MIX = "14Gi:40,28Gi:30,40Gi:15,6Gi:10,72Gi:5"
"""Inference model sizes (memory:weight): the mix the packing target is set on."""
POLICIES: dict[str, Policy] = {"best-fit": best_fit, "first-fit": first_fit}


def parse_mix(text: str) -> list[tuple[int, float]]:
    """``"14Gi:40,28Gi:30"`` → ``[(14 GiB, 40.0), (28 GiB, 30.0)]``; weights need not sum to 100."""
    mix = []
    for item in text.split(","):
        size, _, weight = item.strip().partition(":")
        try:
            amount = parse_quantity(size)
            share = float(weight or "1")
        except ValueError as err:
            raise ConfigError(f"--mix: {item!r} is not MEMORY[:WEIGHT] ({err})") from None
        if amount <= 0 or share < 0:
            raise ConfigError(f"--mix: {item!r}: memory must be > 0 and weight >= 0")
        mix.append((math.ceil(amount), share))
    if not mix or sum(w for _, w in mix) <= 0:
        raise ConfigError(f"--mix: {text!r} has no positive weight")
    return mix


def generate(claims: int, seed: int, mix: str = INFERENCE_MIX) -> list[int]:
    """``claims`` memory requests (bytes) drawn from ``mix`` with ``random.Random(seed)``."""
    entries = parse_mix(mix)
    rng = random.Random(seed)
    return rng.choices([m for m, _ in entries], weights=[w for _, w in entries], k=claims)


def order_batch(memory: Iterable[int]) -> list[int]:
    """A burst in the order it is placed: largest first (stable among equals)."""
    return sorted(memory, key=lambda m: -m)


def device_class(driver: str = DRIVER) -> dict[str, Any]:
    """The controller-managed shared class, as the Helm chart writes it."""
    return {
        "metadata": {"name": CLASS},
        "spec": {"selectors": [{"cel": {"expression": sentinel_expression(driver)}}]},
    }


def claim_object(number: int, memory: int) -> dict[str, Any]:
    """A one-device claim of ``memory`` bytes on the shared class."""
    return {
        "metadata": {"namespace": "sim", "name": f"claim-{number}", "uid": f"uid-{number}"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": CLASS,
                            "capacity": {"requests": {"memory": format_bytes(memory)}},
                        },
                    }
                ]
            }
        },
    }


def build_cluster(nodes: int, gpus: str = "h100-80gb:8", kube_minor: int = 36) -> list[Any]:
    """The ResourceSlices (``{"spec": ...}``) of ``nodes`` nodes with fake GPUs ``gpus``."""
    entries = load_spec(gpus)
    settings = NodeSettings(default=GpuSettings(allocator=Allocator.CONTROLLER))
    caps = Capabilities.for_version(kube_minor)
    out: list[Any] = []
    width = len(str(max(nodes - 1, 0)))
    for n in range(nodes):
        node = f"node-{n:0{width}d}"
        built = build_slices(
            build_inventory(entries, node),
            driver_name=DRIVER,
            node_name=node,
            settings=settings,
            capabilities=caps,
        )
        out.extend({"spec": s.spec} for s in built)
    return out


@dataclass(frozen=True)
class Report:
    policy: str
    claims: int
    placed: int
    gpus_total: int
    gpus_used: int
    gpu_memory: int
    """Memory one GPU offers shares (the largest in the cluster)."""
    memory_requested: int
    """Sum of the placed claims' memory (as consumed: rounded to the step)."""
    lower_bound: int
    whole_gpu: int
    """GPUs whole-GPU allocation would need: one per claim that fits a GPU."""
    stranded: int
    """Free memory left on partly used GPUs."""
    seconds: float
    examined: int

    @property
    def ratio(self) -> float:
        return self.gpus_used / self.lower_bound if self.lower_bound else 0.0

    @property
    def utilisation(self) -> float:
        capacity = self.gpus_used * self.gpu_memory
        return self.memory_requested / capacity if capacity else 0.0

    @property
    def fragmentation(self) -> float:
        """Stranded memory as a share of the used GPUs' memory."""
        capacity = self.gpus_used * self.gpu_memory
        return self.stranded / capacity if capacity else 0.0

    @property
    def claims_per_second(self) -> float:
        return self.claims / self.seconds if self.seconds else float("inf")


def simulate(
    slices: Sequence[Mapping[str, Any]],
    memory: Sequence[int],
    *,
    policy: str = "best-fit",
    batch: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> Report:
    """Place ``memory`` (one claim each) on ``slices`` with ``policy``; see :class:`Report`."""
    chosen = POLICIES[policy]
    state = AllocatorState(
        slices=slices, classes=[device_class()], allocated_claims=[], driver_name=DRIVER
    )
    ids = iter(range(1 << 62))
    order = order_batch(memory) if batch else list(memory)
    start = clock()
    placed = 0
    for number, amount in enumerate(order):
        outcome = state.allocate(
            claim_object(number, amount),
            policy=chosen,
            share_id=lambda: f"share-{next(ids)}",
        )
        placed += outcome.allocation is not None
    seconds = clock() - start

    gpu_memory = 0
    used = 0
    consumed_total = Fraction(0)
    stranded = Fraction(0)
    for device in state.devices:
        caps = device.capacity
        total = caps["memory"].value if "memory" in caps else Fraction(0)
        if not total and isinstance(device.attributes.get("memoryUsable"), int):
            total = Fraction(int(device.attributes["memoryUsable"]))  # type: ignore[arg-type]
        gpu_memory = max(gpu_memory, int(total))
        use = state.ledger.use(device.key)
        if not use.in_use:
            continue
        used += 1
        taken = use.consumed.get("memory", total if use.exclusive else Fraction(0))
        consumed_total += taken
        stranded += max(total - taken, Fraction(0))
    fitting = sum(1 for m in memory if m <= gpu_memory)
    return Report(
        policy=policy,
        claims=len(memory),
        placed=placed,
        gpus_total=len(state.devices),
        gpus_used=used,
        gpu_memory=gpu_memory,
        memory_requested=int(consumed_total),
        lower_bound=math.ceil(consumed_total / gpu_memory) if gpu_memory else 0,
        whole_gpu=fitting,
        stranded=int(stranded),
        seconds=seconds,
        examined=state.examined,
    )


def format_report(reports: Sequence[Report]) -> str:
    """A table: one line per policy, then whole-GPU allocation."""
    lines = [
        f"{'POLICY':<10} {'PLACED':>9} {'GPUS':>6} {'BOUND':>6} {'RATIO':>6} {'UTIL':>6}"
        f" {'STRANDED':>10} {'FRAG':>6} {'CLAIMS/S':>9} {'EXAMINED/CLAIM':>14}"
    ]
    for r in reports:
        lines.append(
            f"{r.policy:<10} {r.placed:>5}/{r.claims:<3} {r.gpus_used:>6} {r.lower_bound:>6}"
            f" {r.ratio:>6.3f} {r.utilisation:>6.1%} {r.stranded / GI:>8.1f}Gi"
            f" {r.fragmentation:>6.1%} {r.claims_per_second:>9.0f}"
            f" {r.examined / max(r.claims, 1):>14.2f}"
        )
    if reports:
        r = reports[0]
        whole_ratio = r.whole_gpu / r.lower_bound if r.lower_bound else 0.0
        util = r.memory_requested / (r.whole_gpu * r.gpu_memory) if r.whole_gpu else 0.0
        lines.append(
            f"{'whole-GPU':<10} {r.whole_gpu:>5}/{r.claims:<3} {r.whole_gpu:>6} {r.lower_bound:>6}"
            f" {whole_ratio:>6.3f} {util:>6.1%}"
        )
        lines.append(
            f"{r.gpus_total} GPUs of {r.gpu_memory / GI:.2f}Gi shareable memory each;"
            f" lower bound = ceil({r.memory_requested / GI:.1f}Gi / {r.gpu_memory / GI:.2f}Gi)"
        )
    return "\n".join(lines)


def plot(reports: Sequence[Report], path: str) -> None:
    """A bar chart of GPUs used per policy beside the lower bound and whole-GPU allocation."""
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
    except ImportError:
        raise ConfigError(
            "--plot needs matplotlib, which is not installed (pip install matplotlib)"
        ) from None
    if not reports:
        raise ConfigError("--plot: nothing to plot")
    labels = ["lower bound", *(r.policy for r in reports), "whole GPU"]
    values = [reports[0].lower_bound, *(r.gpus_used for r in reports), reports[0].whole_gpu]
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar(labels, values, color=["grey", *["tab:blue"] * len(reports), "tab:red"])
    ax.bar_label(bars)
    ax.set_ylabel("GPUs used")
    ax.set_title(f"{reports[0].claims} claims")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
