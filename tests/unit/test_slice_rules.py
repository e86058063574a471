"""The API server's ResourceSlice rules: each one broken on purpose, named by location."""

from __future__ import annotations

import copy
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest

from dra_driver.base.errors import DriverError
from dra_driver.base.quantity import parse_quantity
from dra_driver.core.settings import Capabilities
from dra_driver.core.slices import (
    SliceInvalidError,
    pool_problems,
    slice_problems,
    validate_pool,
    validate_slice,
)

Spec = dict[str, Any]
Mutation = Callable[[Spec], None]

V136 = Capabilities.for_version(36)
V135 = Capabilities.for_version(35)
# 1.34 rules with every DRA gate switched on by hand.
V134_GATES = Capabilities(
    consumable_capacity=True,
    partitionable_devices=True,
    device_taints=True,
    counters_in_own_slice=False,
)


def base(devices: list[dict[str, Any]] | None = None, **spec: Any) -> Spec:
    return {
        "driver": "gpu.fractional.dev",
        "pool": {"name": "node-a", "generation": 3, "resourceSliceCount": 2},
        "nodeName": "node-a",
        **({"devices": devices} if devices is not None else {}),
        **spec,
    }


def shared_gpu(name: str = "gpu-0") -> dict[str, Any]:
    return {
        "name": name,
        "allowMultipleAllocations": True,
        "attributes": {
            "type": {"string": "gpu"},
            "index": {"int": 0},
            "migCapable": {"bool": False},
            "driverVersion": {"version": "580.65.6"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
        },
        "capacity": {
            "memory": {
                "value": "80Gi",
                "requestPolicy": {
                    "default": "80Gi",
                    "validRange": {"min": "256Mi", "step": "256Mi"},
                },
            },
            "computePercent": {
                "value": "100",
                "requestPolicy": {"default": "0", "validValues": ["0", "25", "50", "100"]},
            },
        },
    }


def mig_device(name: str = "gpu-1-mig-1g10gb-19-0") -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"type": {"string": "mig"}},
        "capacity": {"memory": {"value": "9856Mi"}},
        "consumesCounters": [
            {
                "counterSet": "gpu-1-counters",
                "counters": {"memory-slice-0": {"value": "1"}, "compute-slices": {"value": "1"}},
            }
        ],
    }


def counter_set(name: str = "gpu-1-counters") -> dict[str, Any]:
    return {
        "name": name,
        "counters": {
            "memory-slice-0": {"value": "1"},
            "memory-slice-1": {"value": "1"},
            "compute-slices": {"value": "7"},
        },
    }


def devices_slice() -> Spec:
    return base([shared_gpu(), mig_device()])


def counters_slice() -> Spec:
    return base(sharedCounters=[counter_set()])


def legacy_slice() -> Spec:
    """1.34: the counter set beside the devices that consume it."""
    spec = base([shared_gpu(), mig_device()], sharedCounters=[counter_set()])
    spec["pool"]["resourceSliceCount"] = 1
    return spec


# --- mutation helpers -----------------------------------------------------------------


def _walk(spec: Spec, path: tuple[Any, ...]) -> Any:
    node: Any = spec
    for key in path:
        node = node[key]
    return node


def put(*path: Any, value: Any) -> Mutation:
    def mutate(spec: Spec) -> None:
        _walk(spec, path[:-1])[path[-1]] = value

    return mutate


def drop(*path: Any) -> Mutation:
    def mutate(spec: Spec) -> None:
        del _walk(spec, path[:-1])[path[-1]]

    return mutate


def both(*mutations: Mutation) -> Mutation:
    def mutate(spec: Spec) -> None:
        for mutation in mutations:
            mutation(spec)

    return mutate


def many_devices(count: int, template: Callable[[str], dict[str, Any]]) -> Mutation:
    return put("devices", value=[template(f"dev-{i}") for i in range(count)])


def tainted(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "taints": [{"key": "gpu.fractional.dev/unhealthy", "effect": "NoSchedule"}],
    }


def plain(name: str) -> dict[str, Any]:
    return {"name": name}


def with_attributes(count: int) -> Mutation:
    return put("devices", 1, "attributes", value={f"a{i}": {"int": i} for i in range(count)})


MEM = ("devices", 0, "capacity", "memory")
POLICY = (*MEM, "requestPolicy")
RANGE = (*POLICY, "validRange")
PCT = ("devices", 0, "capacity", "computePercent", "requestPolicy")
CONSUME = ("devices", 1, "consumesCounters")
TAINTS = ("devices", 1, "taints")
ATTRS = ("devices", 0, "attributes")
D0 = "spec.devices[0]"
D1 = "spec.devices[1]"
MEM_AT = f"{D0}.capacity[memory]"
RANGE_AT = f"{MEM_AT}.requestPolicy.validRange"
PCT_AT = f"{D0}.capacity[computePercent].requestPolicy"


def taint(effect: str = "NoExecute", key: str = "gpu.fractional.dev/xid", value: str = "79") -> Any:
    return {"key": key, "value": value, "effect": effect}


# (id, capabilities, starting slice, mutation, location the problem must name)
CASES: list[tuple[str, Capabilities, Callable[[], Spec], Mutation, str]] = [
    # spec and pool
    ("driver-not-dns", V136, devices_slice, put("driver", value="gpu_fractional!"), "spec.driver"),
    ("driver-too-long", V136, devices_slice, put("driver", value="a" * 60 + ".dev"), "spec.driver"),
    ("driver-missing", V136, devices_slice, drop("driver"), "spec.driver"),
    ("unknown-spec-field", V136, devices_slice, put("colour", value="green"), "spec.colour"),
    ("pool-missing", V136, devices_slice, drop("pool"), "spec.pool"),
    (
        "pool-name-underscore",
        V136,
        devices_slice,
        put("pool", "name", value="node_a"),
        "spec.pool.name",
    ),
    (
        "pool-name-empty-part",
        V136,
        devices_slice,
        put("pool", "name", value="a//b"),
        "spec.pool.name",
    ),
    (
        "pool-name-too-long",
        V136,
        devices_slice,
        put("pool", "name", value="/".join(["a" * 60] * 5)),
        "spec.pool.name",
    ),
    (
        "generation-negative",
        V136,
        devices_slice,
        put("pool", "generation", value=-1),
        "spec.pool.generation",
    ),
    (
        "generation-not-int",
        V136,
        devices_slice,
        put("pool", "generation", value="3"),
        "spec.pool.generation",
    ),
    (
        "slice-count-zero",
        V136,
        devices_slice,
        put("pool", "resourceSliceCount", value=0),
        "spec.pool.resourceSliceCount",
    ),
    ("no-node-selection", V136, devices_slice, drop("nodeName"), "spec"),
    ("two-node-selections", V136, devices_slice, put("allNodes", value=True), "spec"),
    ("all-nodes-false", V136, devices_slice, put("allNodes", value=False), "spec.allNodes"),
    ("node-name-empty", V136, devices_slice, put("nodeName", value=""), "spec.nodeName"),
    ("node-name-invalid", V136, devices_slice, put("nodeName", value="Node_A"), "spec.nodeName"),
    (
        "node-selector-two-terms",
        V136,
        devices_slice,
        both(drop("nodeName"), put("nodeSelector", value={"nodeSelectorTerms": [{}, {}]})),
        "spec.nodeSelector.nodeSelectorTerms",
    ),
    (
        "per-device-nodes-without-gate",
        V135,
        lambda: base([plain("gpu-0")]),
        both(
            drop("nodeName"),
            put("perDeviceNodeSelection", value=True),
            put("devices", 0, "allNodes", value=True),
        ),
        "spec.perDeviceNodeSelection",
    ),
    (
        "device-node-without-per-device-selection",
        V136,
        devices_slice,
        put("devices", 0, "nodeName", value="node-a"),
        D0,
    ),
    (
        "per-device-selection-device-without-node",
        V136,
        devices_slice,
        both(drop("nodeName"), put("perDeviceNodeSelection", value=True)),
        D0,
    ),
    # device limits
    ("too-many-devices", V136, devices_slice, many_devices(129, plain), "spec.devices"),
    ("65-devices-with-taints", V136, devices_slice, many_devices(65, tainted), "spec.devices"),
    (
        "65-devices-with-counters",
        V136,
        devices_slice,
        many_devices(65, mig_device),
        "spec.devices",
    ),
    (
        "devices-and-counters",
        V136,
        devices_slice,
        put("sharedCounters", value=[counter_set()]),
        "spec",
    ),
    # counter sets
    (
        "nine-counter-sets",
        V136,
        counters_slice,
        put("sharedCounters", value=[counter_set(f"set-{i}") for i in range(9)]),
        "spec.sharedCounters",
    ),
    (
        "33-counters-in-a-set",
        V136,
        counters_slice,
        put("sharedCounters", 0, "counters", value={f"c-{i}": {"value": "1"} for i in range(33)}),
        "spec.sharedCounters[0].counters",
    ),
    (
        "counter-set-name-not-label",
        V136,
        counters_slice,
        put("sharedCounters", 0, "name", value="GPU_1"),
        "spec.sharedCounters[0].name",
    ),
    (
        "counter-name-not-label",
        V136,
        counters_slice,
        put("sharedCounters", 0, "counters", "memory_slice", value={"value": "1"}),
        "spec.sharedCounters[0].counters[memory_slice]",
    ),
    (
        "counter-set-duplicate",
        V136,
        counters_slice,
        put("sharedCounters", value=[counter_set(), counter_set()]),
        "spec.sharedCounters[1].name",
    ),
    (
        "counter-set-empty",
        V136,
        counters_slice,
        put("sharedCounters", 0, "counters", value={}),
        "spec.sharedCounters[0].counters",
    ),
    (
        "counter-value-not-quantity",
        V136,
        counters_slice,
        put("sharedCounters", 0, "counters", "compute-slices", "value", value="seven"),
        "spec.sharedCounters[0].counters[compute-slices].value",
    ),
    (
        "counter-sets-without-gate",
        V135,
        base,
        put("sharedCounters", value=[counter_set()]),
        "spec.sharedCounters",
    ),
    (
        "1.34-33-counters-over-all-sets",
        V134_GATES,
        legacy_slice,
        put(
            "sharedCounters",
            value=[
                counter_set(),
                {"name": "extra", "counters": {f"c-{i}": {"value": "1"} for i in range(30)}},
            ],
        ),
        "spec.sharedCounters",
    ),
    # devices
    (
        "device-name-underscore",
        V136,
        devices_slice,
        put("devices", 0, "name", value="gpu_0"),
        f"{D0}.name",
    ),
    (
        "device-name-too-long",
        V136,
        devices_slice,
        put("devices", 0, "name", value="g" * 64),
        f"{D0}.name",
    ),
    (
        "device-name-duplicate",
        V136,
        devices_slice,
        put("devices", 1, "name", value="gpu-0"),
        f"{D1}.name",
    ),
    (
        "unknown-device-field",
        V136,
        devices_slice,
        put("devices", 0, "basic", value={}),
        f"{D0}.basic",
    ),
    ("33-attributes-and-capacities", V136, devices_slice, with_attributes(32), D1),
    (
        "attribute-name-hyphen",
        V136,
        devices_slice,
        put(*ATTRS, "memory-step", value={"int": 1}),
        f"{D0}.attributes[memory-step]",
    ),
    (
        "attribute-name-too-long",
        V136,
        devices_slice,
        put(*ATTRS, "a" * 33, value={"int": 1}),
        f"{D0}.attributes[{'a' * 33}]",
    ),
    (
        "attribute-domain-invalid",
        V136,
        devices_slice,
        put(*ATTRS, "bad_domain/model", value={"string": "x"}),
        f"{D0}.attributes[bad_domain/model]",
    ),
    (
        "attribute-domain-too-long",
        V136,
        devices_slice,
        put(*ATTRS, "a" * 60 + ".com/model", value={"string": "x"}),
        f"{D0}.attributes[{'a' * 60}.com/model]",
    ),
    (
        "attribute-two-slashes",
        V136,
        devices_slice,
        put(*ATTRS, "a.com/b/c", value={"string": "x"}),
        f"{D0}.attributes[a.com/b/c]",
    ),
    (
        "attribute-two-values",
        V136,
        devices_slice,
        put(*ATTRS, "type", value={"string": "gpu", "int": 1}),
        f"{D0}.attributes[type]",
    ),
    (
        "attribute-no-value",
        V136,
        devices_slice,
        put(*ATTRS, "type", value={}),
        f"{D0}.attributes[type]",
    ),
    (
        "attribute-list-value",
        V136,
        devices_slice,
        put(*ATTRS, "type", value={"strings": ["a"]}),
        f"{D0}.attributes[type].strings",
    ),
    (
        "string-too-long",
        V136,
        devices_slice,
        put(*ATTRS, "type", value={"string": "x" * 65}),
        f"{D0}.attributes[type].string",
    ),
    (
        "version-leading-zero",
        V136,
        devices_slice,
        put(*ATTRS, "driverVersion", value={"version": "580.65.06"}),
        f"{D0}.attributes[driverVersion].version",
    ),
    (
        "version-two-parts",
        V136,
        devices_slice,
        put(*ATTRS, "driverVersion", value={"version": "9.0"}),
        f"{D0}.attributes[driverVersion].version",
    ),
    (
        "int-attribute-is-bool",
        V136,
        devices_slice,
        put(*ATTRS, "index", value={"int": True}),
        f"{D0}.attributes[index].int",
    ),
    # capacities and request policies
    (
        "capacity-name-hyphen",
        V136,
        devices_slice,
        put("devices", 0, "capacity", "compute-percent", value={"value": "100"}),
        f"{D0}.capacity[compute-percent]",
    ),
    (
        "capacity-value-spaced",
        V136,
        devices_slice,
        put(*MEM, "value", value="80 Gi"),
        f"{MEM_AT}.value",
    ),
    (
        "capacity-value-bad-suffix",
        V136,
        devices_slice,
        put(*MEM, "value", value="80GB"),
        f"{MEM_AT}.value",
    ),
    ("capacity-value-missing", V136, devices_slice, drop(*MEM, "value"), f"{MEM_AT}.value"),
    (
        "policy-without-multiple-allocations",
        V136,
        devices_slice,
        drop("devices", 0, "allowMultipleAllocations"),
        f"{MEM_AT}.requestPolicy",
    ),
    (
        "multiple-allocations-without-gate",
        V135,
        lambda: base([plain("gpu-0")]),
        put("devices", 0, "allowMultipleAllocations", value=True),
        f"{D0}.allowMultipleAllocations",
    ),
    (
        "range-and-values",
        V136,
        devices_slice,
        put(*POLICY, "validValues", value=["80Gi"]),
        f"{MEM_AT}.requestPolicy",
    ),
    (
        "range-without-default",
        V136,
        devices_slice,
        drop(*POLICY, "default"),
        f"{MEM_AT}.requestPolicy.default",
    ),
    ("range-without-min", V136, devices_slice, drop(*RANGE, "min"), f"{RANGE_AT}.min"),
    (
        "default-below-min",
        V136,
        devices_slice,
        put(*POLICY, "default", value="128Mi"),
        f"{RANGE_AT}.min",
    ),
    (
        "default-above-value",  # aligned, but more than the 80Gi there is: never grantable
        V136,
        devices_slice,
        put(*POLICY, "default", value="82176Mi"),
        f"{MEM_AT}.requestPolicy.default",
    ),
    (
        "default-not-aligned",
        V136,
        devices_slice,
        put(*POLICY, "default", value="1000Mi"),
        f"{RANGE_AT}.step",
    ),
    (
        "min-plus-step-above-value",
        V136,
        devices_slice,
        put(*RANGE, "step", value="80Gi"),
        f"{RANGE_AT}.step",
    ),
    ("min-above-value", V136, devices_slice, put(*RANGE, "min", value="81Gi"), f"{RANGE_AT}.min"),
    ("max-below-min", V136, devices_slice, put(*RANGE, "max", value="128Mi"), f"{RANGE_AT}.max"),
    ("max-above-value", V136, devices_slice, put(*RANGE, "max", value="96Gi"), f"{RANGE_AT}.max"),
    (
        "max-not-aligned",
        V136,
        devices_slice,
        put(*RANGE, "max", value="1000Mi"),
        f"{RANGE_AT}.step",
    ),
    ("default-above-max", V136, devices_slice, put(*RANGE, "max", value="40Gi"), f"{RANGE_AT}.max"),
    ("step-zero", V136, devices_slice, put(*RANGE, "step", value="0"), f"{RANGE_AT}.step"),
    ("negative-min", V136, devices_slice, put(*RANGE, "min", value="-256Mi"), f"{RANGE_AT}.min"),
    (
        "eleven-valid-values",
        V136,
        devices_slice,
        put(*PCT, "validValues", value=[str(i) for i in range(11)]),
        f"{PCT_AT}.validValues",
    ),
    (
        "valid-values-unsorted",
        V136,
        devices_slice,
        put(*PCT, "validValues", value=["0", "50", "25"]),
        f"{PCT_AT}.validValues[2]",
    ),
    (
        "valid-values-duplicate",
        V136,
        devices_slice,
        put(*PCT, "validValues", value=["0", "25", "25"]),
        f"{PCT_AT}.validValues[2]",
    ),
    (
        "valid-values-without-default-value",
        V136,
        devices_slice,
        put(*PCT, "validValues", value=["25", "50"]),
        f"{PCT_AT}.validValues",
    ),
    (
        "valid-values-without-default",
        V136,
        devices_slice,
        drop(*PCT, "default"),
        f"{PCT_AT}.default",
    ),
    (
        "valid-value-above-capacity",
        V136,
        devices_slice,
        put(*PCT, "validValues", value=["0", "200"]),
        f"{PCT_AT}.validValues[1]",
    ),
    (
        "unknown-policy-field",
        V136,
        devices_slice,
        put(*POLICY, "maximum", value="1"),
        f"{MEM_AT}.requestPolicy.maximum",
    ),
    # counter consumption
    (
        "three-consumption-entries",
        V136,
        devices_slice,
        put(
            *CONSUME,
            value=[
                {"counterSet": f"s-{i}", "counters": {"memory-slice-0": {"value": "1"}}}
                for i in range(3)
            ],
        ),
        f"{D1}.consumesCounters",
    ),
    (
        "33-counters-in-an-entry",
        V136,
        devices_slice,
        put(*CONSUME, 0, "counters", value={f"c-{i}": {"value": "1"} for i in range(33)}),
        f"{D1}.consumesCounters[0].counters",
    ),
    (
        "duplicate-consumption-entry",
        V136,
        devices_slice,
        put(*CONSUME, value=[mig_device()["consumesCounters"][0]] * 2),
        f"{D1}.consumesCounters[1].counterSet",
    ),
    (
        "consumption-without-counters",
        V136,
        devices_slice,
        put(*CONSUME, 0, "counters", value={}),
        f"{D1}.consumesCounters[0].counters",
    ),
    (
        "consumption-set-name-invalid",
        V136,
        devices_slice,
        put(*CONSUME, 0, "counterSet", value="GPU 1"),
        f"{D1}.consumesCounters[0].counterSet",
    ),
    (
        "consumption-without-gate",
        V135,
        lambda: base([plain("gpu-0")]),
        put("devices", 0, "consumesCounters", value=mig_device()["consumesCounters"]),
        f"{D0}.consumesCounters",
    ),
    (
        "1.34-device-consumes-33-counters",
        V134_GATES,
        legacy_slice,
        put(*CONSUME, 0, "counters", value={f"c-{i}": {"value": "1"} for i in range(33)}),
        f"{D1}.consumesCounters",
    ),
    (
        "1.34-set-not-in-slice",
        V134_GATES,
        legacy_slice,
        put(*CONSUME, 0, "counterSet", value="gpu-9-counters"),
        f"{D1}.consumesCounters[0].counterSet",
    ),
    (
        "1.34-counter-not-in-set",
        V134_GATES,
        legacy_slice,
        put(*CONSUME, 0, "counters", "memory-slice-7", value={"value": "1"}),
        f"{D1}.consumesCounters[0].counters[memory-slice-7]",
    ),
    (
        "1.34-more-than-1024-consumed-counters",
        V134_GATES,
        legacy_slice,
        put(
            "devices",
            value=[
                {
                    "name": f"dev-{i}",
                    "consumesCounters": [
                        {
                            "counterSet": "big",
                            "counters": {f"c-{j}": {"value": "1"} for j in range(30)},
                        }
                    ],
                }
                for i in range(35)
            ],
        ),
        "spec.devices",
    ),
    # taints
    ("17-taints", V136, devices_slice, put(*TAINTS, value=[taint()] * 17), f"{D1}.taints"),
    ("1.34-5-taints", V134_GATES, legacy_slice, put(*TAINTS, value=[taint()] * 5), f"{D1}.taints"),
    (
        "taint-effect-prefer",
        V136,
        devices_slice,
        put(*TAINTS, value=[taint("PreferNoSchedule")]),
        f"{D1}.taints[0].effect",
    ),
    (
        "1.34-taint-effect-none",
        V134_GATES,
        legacy_slice,
        put(*TAINTS, value=[taint("None")]),
        f"{D1}.taints[0].effect",
    ),
    (
        "taint-effect-missing",
        V136,
        devices_slice,
        put(*TAINTS, value=[{"key": "a"}]),
        f"{D1}.taints[0].effect",
    ),
    (
        "taint-key-invalid",
        V136,
        devices_slice,
        put(*TAINTS, value=[taint(key="-bad-")]),
        f"{D1}.taints[0].key",
    ),
    (
        "taint-value-invalid",
        V136,
        devices_slice,
        put(*TAINTS, value=[taint(value="not valid")]),
        f"{D1}.taints[0].value",
    ),
    (
        "taints-without-gate",
        V135,
        lambda: base([plain("gpu-0")]),
        put("devices", 0, "taints", value=[taint()]),
        "spec.devices[0].taints",
    ),
]


@pytest.mark.parametrize(
    ("caps", "make", "mutate", "location"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_each_rule_names_its_location(
    caps: Capabilities, make: Callable[[], Spec], mutate: Mutation, location: str
) -> None:
    spec = make()
    assert slice_problems(spec, caps) == [], "the starting slice must be valid"
    mutate(spec)
    problems = slice_problems(spec, caps)
    locations = [problem.split(": ", 1)[0] for problem in problems]
    assert location in locations, problems
    with pytest.raises(SliceInvalidError) as raised:
        validate_slice(spec, caps)
    assert raised.value.problems == tuple(problems)
    assert all(problem in str(raised.value) for problem in problems)


@pytest.mark.parametrize(
    ("caps", "spec"),
    [
        pytest.param(V136, devices_slice(), id="devices-1.36"),
        pytest.param(V136, counters_slice(), id="counters-1.36"),
        pytest.param(V134_GATES, legacy_slice(), id="combined-1.34"),
        pytest.param(V135, base([plain("gpu-0")]), id="plain-1.35"),
        pytest.param(V136, base([plain("gpu-0")], nodeName=None, allNodes=True), id="all-nodes"),
        pytest.param(
            V136,
            {
                **base([plain("d")]),
                "pool": {"name": "a.b/c-d/e", "generation": 0, "resourceSliceCount": 1},
            },
            id="pool-name-with-slashes",
        ),
        pytest.param(V136, base([plain("d")], driver="GPU.Example.COM"), id="driver-upper-case"),
        pytest.param(V136, base([{"name": "d", "taints": [taint("None")] * 16}]), id="16-taints"),
        pytest.param(
            V136, base([mig_device(f"d-{i}") for i in range(64)]), id="64-devices-with-counters"
        ),
        pytest.param(V136, base([plain(f"d-{i}") for i in range(128)]), id="128-plain-devices"),
        pytest.param(
            V134_GATES,
            base([plain(f"d-{i}") for i in range(128)], sharedCounters=[counter_set()]),
            id="1.34-128-devices",
        ),
        pytest.param(
            V136,
            base(sharedCounters=[counter_set(f"s-{i}") for i in range(8)]),
            id="8-counter-sets",
        ),
    ],
)
def test_valid_slices_have_no_problems(caps: Capabilities, spec: Spec) -> None:
    assert slice_problems(spec, caps) == []
    validate_slice(spec, caps)


def test_error_is_a_driver_error_listing_every_problem() -> None:
    spec = devices_slice()
    spec["driver"] = "bad driver"
    spec["devices"][0]["name"] = "gpu_0"
    with pytest.raises(DriverError) as raised:
        validate_slice(spec, V136)
    assert isinstance(raised.value, SliceInvalidError)
    assert len(raised.value.problems) == 2
    assert "2 problems" in str(raised.value)
    assert "spec.driver: " in str(raised.value)
    assert "spec.devices[0].name: " in str(raised.value)


def test_not_an_object() -> None:
    assert slice_problems([], V136) == ["spec: must be an object"]  # type: ignore[arg-type]


# --- pools ----------------------------------------------------------------------------


def pool() -> list[Spec]:
    return [counters_slice(), devices_slice()]


PoolMutation = Callable[[list[Spec]], object]


def add_slice(extra: Spec) -> PoolMutation:
    def mutate(specs: list[Spec]) -> None:
        specs.append(extra)
        for spec in specs:
            spec["pool"]["resourceSliceCount"] = len(specs)

    return mutate


POOL_CASES: list[tuple[str, PoolMutation, str]] = [
    (
        "slice-count-wrong",
        lambda p: [s["pool"].update(resourceSliceCount=3) for s in p],
        "slices[0].spec.pool.resourceSliceCount",
    ),
    (
        "generation-differs",
        lambda p: p[1]["pool"].update(generation=4),
        "slices[1].spec.pool.generation",
    ),
    ("pool-name-differs", lambda p: p[1]["pool"].update(name="node-b"), "slices[1].spec.pool.name"),
    ("driver-differs", lambda p: p[1].update(driver="other.dev"), "slices[1].spec.driver"),
    ("node-differs", lambda p: p[1].update(nodeName="node-b"), "slices[1].spec.nodeName"),
    (
        "device-in-two-slices",
        add_slice(base([plain("gpu-0")])),
        "slices[2].spec.devices[0].name",
    ),
    (
        "counter-set-in-two-slices",
        add_slice(counters_slice()),
        "slices[2].spec.sharedCounters[0].name",
    ),
    (
        "missing-counter-set",
        lambda p: p[1]["devices"][1]["consumesCounters"][0].update(counterSet="gpu-7-counters"),
        "slices[1].spec.devices[1].consumesCounters[0].counterSet",
    ),
    (
        "missing-counter",
        lambda p: p[1]["devices"][1]["consumesCounters"][0]["counters"].update(
            {"encoders": {"value": "1"}}
        ),
        "slices[1].spec.devices[1].consumesCounters[0].counters[encoders]",
    ),
    (
        "consumes-more-than-the-set-has",
        lambda p: p[1]["devices"][1]["consumesCounters"][0]["counters"].update(
            {"compute-slices": {"value": "8"}}
        ),
        "slices[1].spec.devices[1].consumesCounters[0].counters[compute-slices]",
    ),
    (
        "slice-problem-is-prefixed",
        lambda p: p[1]["devices"][0].update(name="gpu_0"),
        "slices[1].spec.devices[0].name",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "location"), [pytest.param(*case[1:], id=case[0]) for case in POOL_CASES]
)
def test_each_pool_rule_names_its_location(mutate: PoolMutation, location: str) -> None:
    specs = pool()
    assert pool_problems(specs, V136) == []
    mutate(specs)
    problems = pool_problems(specs, V136)
    assert location in [problem.split(": ", 1)[0] for problem in problems], problems
    with pytest.raises(SliceInvalidError):
        validate_pool(specs, V136)


def test_valid_pools() -> None:
    validate_pool(pool(), V136)
    validate_pool([legacy_slice()], V134_GATES)
    validate_pool([], V136)
    single = base([plain("gpu-0")])
    single["pool"]["resourceSliceCount"] = 1
    validate_pool([single], V135)


def test_legacy_pool_resolves_references_per_slice() -> None:
    """1.34: a counter set in another slice of the pool does not count."""
    elsewhere = base(sharedCounters=[counter_set()])
    consumer = base([mig_device()], sharedCounters=[counter_set("other")])
    problems = pool_problems([elsewhere, consumer], V134_GATES)
    assert [p.split(": ", 1)[0] for p in problems] == [
        "slices[1].spec.devices[0].consumesCounters[0].counterSet"
    ]


def test_pool_check_does_not_mutate_its_input() -> None:
    specs = pool()
    before = copy.deepcopy(specs)
    pool_problems(specs, V136)
    assert specs == before


# --- quantities -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "amount"),
    [
        ("0", 0),
        ("100", 100),
        ("+5", 5),
        ("-5", -5),
        ("1.5", Fraction(3, 2)),
        ("1.", 1),
        (".5", Fraction(1, 2)),
        ("500m", Fraction(1, 2)),
        ("1k", 1000),
        ("1M", 10**6),
        ("2G", 2 * 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("1Ki", 1024),
        ("256Mi", 256 * 2**20),
        ("81408Mi", 81408 * 2**20),
        ("1.5Gi", 3 * 2**29),
        ("1Ti", 2**40),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("1e3", 1000),
        ("1E3", 1000),
        ("5e-1", Fraction(1, 2)),
        ("12e+2", 1200),
        (42, 42),
    ],
)
def test_parse_quantity(text: str | int, amount: Fraction | int) -> None:
    assert parse_quantity(text) == amount


@pytest.mark.parametrize(
    "text",
    [
        "",
        " 1",
        "1 ",
        "80 Gi",
        "80GB",
        "1ki",
        "1KI",
        "Mi",
        "1..5",
        "1.5.5",
        "0x10",
        "1e",
        "e3",
        "1e1.5",
        "--1",
        "1Gi ",
        "∞",
        True,
        1.5,
        None,
    ],
    ids=repr,
)
def test_parse_quantity_rejects(text: object) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(text)
