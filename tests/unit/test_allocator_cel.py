"""The Kubernetes CEL view of a device on top of common-expression-language."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dra_driver.allocator.cel import CelError, SelectorCache, is_sentinel, sentinel_expression
from dra_driver.allocator.model import Capacity, Device, SemVer

DRIVER = "gpu.fractional.dev"
DEVICE = Device(
    driver=DRIVER,
    pool="node-a",
    generation=3,
    name="gpu-0",
    node_name="node-a",
    attributes={
        "type": "gpu",
        "index": 0,
        "migCapable": True,
        "driverVersion": SemVer("580.65.6"),
        "resource.kubernetes.io/pciBusID": "0000:18:00.0",
    },
    capacity={"memory": Capacity(Fraction(80 * 2**30)), "computePercent": Capacity(Fraction(100))},
    allow_multiple_allocations=True,
)
D = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (f'device.driver == "{DRIVER}"', True),
        (f'{D}.type == "gpu" && {D}.index == 0 && {D}.migCapable', True),
        ('device.attributes["resource.kubernetes.io"].pciBusID.startsWith("0000:18")', True),
        (f'{C}.memory.compareTo(quantity("10Gi")) >= 0', True),
        (f'{C}.memory.isGreaterThan(quantity("80Gi"))', False),
        (f'{C}.memory.isLessThan(quantity("81Gi"))', True),
        (f'{C}.memory == quantity("80Gi")', True),
        (f"{C}.computePercent.asInteger() == 100", True),
        (f'{D}.driverVersion.isGreaterThan(semver("580.9.0"))', True),
        (f'{D}.driverVersion.compareTo(semver("580.65.6")) == 0', True),
        (f"{D}.driverVersion.major() == 580", True),
        (f"has({D}.missing)", False),
        ('has(device.attributes["other.dev"].x)', False),  # unknown domain: empty map
        ("device.allowMultipleAllocations", True),
        (f'{D}.type.upperAscii() == "GPU"', True),
    ],
)
def test_expressions(expression: str, expected: bool) -> None:
    assert SelectorCache().matches(expression, DEVICE) is expected


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        (f"{D}.missing == 1", "failed on device"),
        (f'{C}.memory.compareTo(quantity("ten"))', "failed on device"),
        (f"{D}.index", "not a bool"),
        ("device.driver ==", "does not compile"),
        (f'{D}.type.format(["x"]) == "gpu"', "unsupported function"),
        ("cel.bind(x, 1, x == 1)", "cel.bind"),
    ],
)
def test_errors(expression: str, words: str) -> None:
    with pytest.raises(CelError, match=words):
        SelectorCache().matches(expression, DEVICE)


def test_evaluated_once_per_device_and_generation() -> None:
    cache = SelectorCache()
    expr = f'{D}.type == "gpu"'
    for _ in range(3):
        assert cache.matches(expr, DEVICE)
    assert cache.evaluations == 1
    newer = Device(**{**DEVICE.__dict__, "generation": 4})
    assert cache.matches(expr, newer)
    assert cache.evaluations == 2
    cache.forget_older({(DRIVER, "node-a"): 4})
    assert cache.matches(expr, newer)
    assert cache.evaluations == 2


def test_sentinel() -> None:
    marker = '"share.gpu.fractional.dev/controller-managed" == "sentinel"'
    expr = f'device.driver == "{DRIVER}" && {marker}'
    assert sentinel_expression(DRIVER) == expr
    assert is_sentinel(expr, DRIVER)
    assert not is_sentinel(expr, "other.dev")
    assert not SelectorCache().matches(expr, DEVICE)  # it matches nothing when evaluated
