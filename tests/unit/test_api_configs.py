"""Which configs apply to a result, their precedence, grant trust, and the limits they yield."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from dra_driver.api import (
    GpuConfig,
    GpuShare,
    GpuShareGrant,
    InvalidConfigError,
    Limits,
    LimitsOrigin,
    MpsConfig,
    TimeSliceInterval,
    TimeSlicingConfig,
    encode_config,
)
from dra_driver.base.ids import DeviceName, PoolName
from dra_driver.core.model import DeviceResult, OpaqueConfig
from dra_driver.core.prepare import (
    FROM_CLAIM,
    FROM_CLASS,
    EffectiveConfig,
    applies_to,
    apply_overrides,
    effective_config,
    granted_limits,
    limits_for,
)

GI = 2**30
DRIVER = "gpu.fractional.dev"
VERSION = f"{DRIVER}/v1alpha1"
SHARE = "7d3f52c1-8a4e-4b9f-9c1d-2e5f6a7b8c9d"
OTHER_SHARE = "11111111-2222-4333-8444-555555555555"
TOTAL = 80 * GI


def result(
    request: str = "gpu",
    device: str = "gpu-0",
    share_id: str | None = SHARE,
    consumed: Mapping[str, str] | None = None,
) -> DeviceResult:
    return DeviceResult(
        request=request,
        driver=DRIVER,
        pool=PoolName("node-a"),
        device=DeviceName(device),
        share_id=share_id,
        consumed_capacity=consumed or {},
    )


def mps(source: str = FROM_CLAIM, *requests: str, driver: str = DRIVER, **mps: Any) -> OpaqueConfig:
    parameters = {"apiVersion": VERSION, "kind": "GpuConfig", "mps": mps}
    return OpaqueConfig(source, tuple(requests), driver, parameters)


def grant_config(
    source: str = FROM_CLAIM,
    *,
    device: str = "gpu-0",
    share_id: str = SHARE,
    memory: int = 10 * GI,
    percent: int = 25,
    requests: tuple[str, ...] = ("gpu",),
) -> OpaqueConfig:
    grant = GpuShareGrant(device, share_id, memory, percent)
    return OpaqueConfig(source, requests, DRIVER, encode_config(grant))


@pytest.mark.parametrize(
    ("requests", "name", "applies"),
    [
        pytest.param((), "gpu", True, id="empty-means-all"),
        pytest.param((), "gpu/small", True, id="empty-means-all-sub"),
        pytest.param(("gpu",), "gpu", True, id="same"),
        pytest.param(("gpu",), "gpu/small", True, id="main-covers-sub"),
        pytest.param(("gpu/small",), "gpu/small", True, id="sub-exact"),
        pytest.param(("gpu/small",), "gpu/large", False, id="other-sub"),
        pytest.param(("gpu/small",), "gpu", False, id="sub-not-main"),
        pytest.param(("other",), "gpu", False, id="other-request"),
        pytest.param(("gpu2",), "gpu", False, id="prefix-is-not-main"),
        pytest.param(("other", "gpu"), "gpu/small", True, id="any-listed"),
    ],
)
def test_applies_to(requests: tuple[str, ...], name: str, applies: bool) -> None:
    assert applies_to(requests, name) is applies


@pytest.mark.parametrize(
    ("configs", "expected"),
    [
        pytest.param([], MpsConfig(), id="none"),
        pytest.param(
            [mps(FROM_CLASS, computePercent=50), mps(FROM_CLAIM, computePercent=20)],
            MpsConfig(compute_percent=20),
            id="claim-beats-class",
        ),
        pytest.param(
            [mps(FROM_CLAIM, computePercent=20), mps(FROM_CLASS, computePercent=50)],
            MpsConfig(compute_percent=20),
            id="claim-beats-class-whatever-the-order",
        ),
        pytest.param(
            [mps(FROM_CLASS, computePercent=50), mps(FROM_CLAIM, memoryLimit="4Gi")],
            MpsConfig(compute_percent=50, memory_limit_bytes=4 * GI),
            id="field-by-field",
        ),
        pytest.param(
            [mps(FROM_CLAIM, memorySoftLimit="2Gi"), mps(FROM_CLASS, memorySoftLimit="4Gi")],
            MpsConfig(memory_soft_limit_bytes=2 * GI),
            id="soft-limit-claim-beats-class",
        ),
        pytest.param(
            [mps(FROM_CLASS, memorySoftLimit="4Gi"), mps(FROM_CLAIM, memoryLimit="6Gi")],
            MpsConfig(memory_limit_bytes=6 * GI, memory_soft_limit_bytes=4 * GI),
            id="soft-limit-from-class-kept",
        ),
        pytest.param(
            [mps(FROM_CLAIM, "gpu", computePercent=30), mps(FROM_CLAIM, computePercent=40)],
            MpsConfig(compute_percent=40),
            id="later-claim-wins",
        ),
        pytest.param(
            [mps(FROM_CLAIM, "gpu/small", computePercent=30), mps(FROM_CLAIM, "gpu", **{})],
            MpsConfig(compute_percent=30),
            id="absent-never-resets",
        ),
        pytest.param(
            [mps(FROM_CLAIM, "other", computePercent=30)], MpsConfig(), id="other-request"
        ),
        pytest.param(
            [mps(FROM_CLAIM, "gpu/large", computePercent=30)], MpsConfig(), id="other-sub"
        ),
        pytest.param(
            [mps(FROM_CLAIM, driver="gpu.nvidia.com", computePercent=30, bogus=1)],
            MpsConfig(),
            id="other-driver-not-even-decoded",
        ),
    ],
)
def test_gpu_config_precedence(configs: list[OpaqueConfig], expected: MpsConfig) -> None:
    effective = effective_config(result("gpu/small"), configs, DRIVER)
    assert (effective.gpu.mps or MpsConfig()) == expected


def test_time_slicing_merge_and_default() -> None:
    ts = {"apiVersion": VERSION, "kind": "GpuConfig", "timeSlicing": {"interval": "Short"}}
    empty = {"apiVersion": VERSION, "kind": "GpuConfig", "timeSlicing": {}}
    configs = [
        OpaqueConfig(FROM_CLASS, (), DRIVER, ts),
        OpaqueConfig(FROM_CLAIM, (), DRIVER, empty),
    ]
    effective = effective_config(result(), configs)
    assert effective.gpu.time_slicing == TimeSlicingConfig(TimeSliceInterval.SHORT)
    assert effective.time_slice_interval is TimeSliceInterval.SHORT
    assert EffectiveConfig().time_slice_interval is TimeSliceInterval.DEFAULT


def test_shares_are_collected_and_never_limits() -> None:
    parameters = encode_config(GpuShare(40 * GI, 50))
    effective = effective_config(result(), [OpaqueConfig(FROM_CLAIM, (), DRIVER, parameters)])
    assert effective.shares == (GpuShare(40 * GI, 50),)
    assert effective.grant is None
    assert limits_for(result(), effective, TOTAL) == Limits(TOTAL, 100, "gpu-0")


def test_malformed_config_names_its_entry_and_field() -> None:
    configs = [mps(FROM_CLASS, "other"), mps(FROM_CLAIM, computePercent=500)]
    with pytest.raises(InvalidConfigError, match=r"devices\.config\[1\] \(FromClaim\)") as info:
        effective_config(result(), configs)
    assert info.value.field == "mps.computePercent"


def test_unknown_source_is_refused() -> None:
    with pytest.raises(InvalidConfigError, match="allowed: FromClass, FromClaim"):
        effective_config(result(), [mps("FromNowhere", computePercent=5)])


@pytest.mark.parametrize(
    ("the_result", "config", "trusted", "reason"),
    [
        pytest.param(result(), grant_config(), True, "", id="matching-claim-grant"),
        pytest.param(result(share_id=SHARE.upper()), grant_config(), True, "", id="share-id-case"),
        pytest.param(result(share_id=None), grant_config(), True, "", id="api-dropped-share-id"),
        pytest.param(
            result(), grant_config(source=FROM_CLASS), False, "not FromClass", id="from-class"
        ),
        pytest.param(
            result(), grant_config(device="gpu-1"), False, "device gpu-1", id="other-device"
        ),
        pytest.param(
            result(), grant_config(share_id=OTHER_SHARE), False, OTHER_SHARE, id="other-share"
        ),
    ],
)
def test_grant_trust(
    the_result: DeviceResult, config: OpaqueConfig, trusted: bool, reason: str
) -> None:
    effective = effective_config(the_result, [config])
    if trusted:
        assert effective.grant == GpuShareGrant("gpu-0", SHARE, 10 * GI, 25)
        assert effective.ignored == ()
    else:
        assert effective.grant is None
        [ignored] = effective.ignored
        assert (ignored.index, ignored.source) == (0, config.source)
        assert reason in ignored.reason


def test_grant_for_another_request_is_not_considered() -> None:
    effective = effective_config(result(), [grant_config(requests=("other",))])
    assert effective.grant is None
    assert effective.ignored == ()


def test_two_grants_for_one_result_fail() -> None:
    configs = [grant_config(), grant_config(memory=20 * GI)]
    with pytest.raises(InvalidConfigError, match=r"config\[0\] and devices\.config\[1\]"):
        effective_config(result(), configs)


def test_grants_for_other_results_of_the_request_are_ignored() -> None:
    configs = [grant_config(device="gpu-1", share_id=OTHER_SHARE), grant_config()]
    effective = effective_config(result(), configs)
    assert effective.grant is not None
    assert effective.grant.device == "gpu-0"
    assert [i.index for i in effective.ignored] == [0]


@pytest.mark.parametrize(
    ("the_result", "grant", "expected"),
    [
        pytest.param(
            result(consumed={"memory": "10Gi", "computePercent": "25", "clients": "1"}),
            None,
            Limits(10 * GI, 25, "gpu-0", LimitsOrigin.CONSUMED_CAPACITY),
            id="native",
        ),
        pytest.param(
            result(consumed={"memory": "10Gi"}),
            None,
            Limits(10 * GI, 0, "gpu-0", LimitsOrigin.CONSUMED_CAPACITY),
            id="native-no-percent-means-no-cap",
        ),
        pytest.param(
            result(consumed={"memory": "10Gi", "computePercent": "25"}),
            GpuShareGrant("gpu-0", SHARE, 10 * GI, 25),
            Limits(10 * GI, 25, "gpu-0", LimitsOrigin.CONSUMED_CAPACITY),
            id="native-and-agreeing-grant",
        ),
        pytest.param(
            result(share_id=None),
            GpuShareGrant("gpu-0", SHARE, 20 * GI, 0),
            Limits(20 * GI, 0, "gpu-0", LimitsOrigin.GRANT),
            id="controller",
        ),
        pytest.param(
            result(share_id=None),
            None,
            Limits(TOTAL, 100, "gpu-0", LimitsOrigin.WHOLE_GPU),
            id="exclusive",
        ),
    ],
)
def test_granted_limits(
    the_result: DeviceResult, grant: GpuShareGrant | None, expected: Limits
) -> None:
    assert granted_limits(the_result, grant, TOTAL) == expected


@pytest.mark.parametrize(
    ("the_result", "grant", "message"),
    [
        pytest.param(
            result(consumed={"memory": "10Gi", "computePercent": "25"}),
            GpuShareGrant("gpu-0", SHARE, 20 * GI, 25),
            "disagrees with consumedCapacity",
            id="grant-disagrees",
        ),
        pytest.param(
            result(consumed={"memory": "100Gi"}), None, "which has 80Gi", id="more-than-gpu"
        ),
        pytest.param(
            result(consumed={"memory": "1.5"}), None, "not a whole number", id="bad-quantity"
        ),
        pytest.param(
            result(consumed={"memory": "1Gi", "computePercent": "150"}),
            None,
            "allowed: 0 to 100",
            id="bad-percent",
        ),
        pytest.param(
            result(), GpuShareGrant("gpu-1", SHARE, GI, 0), "allowed: a grant for gpu-0", id="dev"
        ),
    ],
)
def test_granted_limits_refuses_impossible_allocations(
    the_result: DeviceResult, grant: GpuShareGrant | None, message: str
) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        granted_limits(the_result, grant, TOTAL)


GRANTED = Limits(10 * GI, 25, "gpu-0", LimitsOrigin.GRANT)


@pytest.mark.parametrize(
    ("granted", "config", "expected"),
    [
        pytest.param(GRANTED, GpuConfig(), GRANTED, id="no-mps-section"),
        pytest.param(GRANTED, GpuConfig(mps=MpsConfig()), GRANTED, id="empty-mps-section"),
        pytest.param(
            GRANTED,
            GpuConfig(mps=MpsConfig(compute_percent=10, memory_limit_bytes=4 * GI)),
            Limits(4 * GI, 10, "gpu-0", LimitsOrigin.GRANT),
            id="lower-both",
        ),
        pytest.param(
            GRANTED,
            GpuConfig(mps=MpsConfig(compute_percent=25, memory_limit_bytes=10 * GI)),
            GRANTED,
            id="equal-is-fine",
        ),
        pytest.param(
            Limits(10 * GI, 0, "gpu-0"),
            GpuConfig(mps=MpsConfig(compute_percent=100)),
            Limits(10 * GI, 100, "gpu-0"),
            id="no-cap-compares-as-100",
        ),
        pytest.param(
            Limits(10 * GI, 0, "gpu-0"),
            GpuConfig(mps=MpsConfig(compute_percent=30)),
            Limits(10 * GI, 30, "gpu-0"),
            id="cap-an-uncapped-share",
        ),
        pytest.param(
            GRANTED,
            GpuConfig(mps=MpsConfig(memory_soft_limit_bytes=6 * GI)),
            Limits(10 * GI, 25, "gpu-0", LimitsOrigin.GRANT, soft_memory_bytes=6 * GI),
            id="soft-limit-under-the-grant",
        ),
        pytest.param(
            GRANTED,
            GpuConfig(mps=MpsConfig(memory_soft_limit_bytes=10 * GI)),
            Limits(10 * GI, 25, "gpu-0", LimitsOrigin.GRANT, soft_memory_bytes=10 * GI),
            id="soft-limit-equal-to-the-grant",
        ),
        pytest.param(
            GRANTED,
            GpuConfig(mps=MpsConfig(memory_limit_bytes=4 * GI, memory_soft_limit_bytes=3 * GI)),
            Limits(4 * GI, 25, "gpu-0", LimitsOrigin.GRANT, soft_memory_bytes=3 * GI),
            id="soft-limit-under-the-lowered-hard-limit",
        ),
    ],
)
def test_overrides_may_lower(granted: Limits, config: GpuConfig, expected: Limits) -> None:
    assert apply_overrides(granted, config) == expected


@pytest.mark.parametrize(
    ("config", "field", "message"),
    [
        pytest.param(
            GpuConfig(mps=MpsConfig(memory_limit_bytes=20 * GI)),
            "mps.memoryLimit",
            "mps.memoryLimit: 20Gi exceeds the 10Gi this claim was granted on gpu-0;"
            " allowed: 1 to 10Gi",
            id="memory",
        ),
        pytest.param(
            GpuConfig(mps=MpsConfig(compute_percent=26)),
            "mps.computePercent",
            "mps.computePercent: 26 exceeds the 25 this claim was granted on gpu-0;"
            " allowed: 1 to 25",
            id="compute",
        ),
        pytest.param(
            GpuConfig(mps=MpsConfig(memory_soft_limit_bytes=12 * GI)),
            "mps.memorySoftLimit",
            "mps.memorySoftLimit: 12Gi exceeds the hard memory limit of 10Gi (what this claim"
            " was granted on gpu-0); allowed: 1 to 10Gi",
            id="soft-above-the-grant",
        ),
        pytest.param(
            # Built in code (unvalidated): merged configs can pair these, see below.
            GpuConfig(mps=MpsConfig(memory_limit_bytes=4 * GI, memory_soft_limit_bytes=6 * GI)),
            "mps.memorySoftLimit",
            "mps.memorySoftLimit: 6Gi exceeds the hard memory limit of 4Gi (mps.memoryLimit);"
            " allowed: 1 to 4Gi",
            id="soft-above-the-lowered-hard-limit",
        ),
    ],
)
def test_overrides_may_not_raise(config: GpuConfig, field: str, message: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        apply_overrides(GRANTED, config)
    assert info.value.field == field
    assert message in str(info.value)


def test_limits_for_end_to_end_on_the_controller_path() -> None:
    the_result = result(share_id=None)
    configs = [
        mps(FROM_CLASS, computePercent=20),
        grant_config(),
        mps(FROM_CLAIM, "gpu", memoryLimit="8Gi"),
        mps(FROM_CLAIM, "other", memoryLimit="80Gi"),
    ]
    effective = effective_config(the_result, configs)
    assert limits_for(the_result, effective, TOTAL) == Limits(
        8 * GI, 20, "gpu-0", LimitsOrigin.GRANT
    )
    asking_more = [*configs, mps(FROM_CLAIM, computePercent=50)]
    with pytest.raises(InvalidConfigError, match="exceeds the 25 this claim was granted"):
        limits_for(the_result, effective_config(the_result, asking_more), TOTAL)


def test_a_soft_limit_must_fit_the_hard_limit_the_merged_configs_leave() -> None:
    """Class and claim each valid alone; merged, the soft limit exceeds the hard one."""
    the_result = result(consumed={"memory": "10Gi"})
    configs = [mps(FROM_CLASS, memoryLimit="4Gi"), mps(FROM_CLAIM, memorySoftLimit="6Gi")]
    with pytest.raises(InvalidConfigError) as info:
        limits_for(the_result, effective_config(the_result, configs), TOTAL)
    assert info.value.field == "mps.memorySoftLimit"
    assert "6Gi exceeds the hard memory limit of 4Gi (mps.memoryLimit)" in str(info.value)

    # The claim may lower the class's hard limit and set a soft one under it.
    configs = [mps(FROM_CLASS, memorySoftLimit="3Gi"), mps(FROM_CLAIM, memoryLimit="5Gi")]
    limits = limits_for(the_result, effective_config(the_result, configs), TOTAL)
    assert (limits.memory_bytes, limits.soft_memory_bytes) == (5 * GI, 3 * GI)
