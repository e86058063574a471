"""The chart's ValidatingAdmissionPolicy ``*-mps-shares-one-daemon``, run by the fake
API server as the real one runs it (CEL, ``tests/support/fakekube_admission.py``).

The kubelet plugin refuses, at every prepare, a claim whose MPS shares are on two
GPUs or MIG instances (``core/prepare/mps_namespaces.py`` ``mps_daemon_conflict``:
each has its own daemon and pipe directory, a CUDA client has one). The policy
refuses, when a ResourceClaim or ResourceClaimTemplate is written, every claim
whose share requests could be allocated so, and admits those a ``matchAttribute``
on ``<driver>/uuid`` (MIG shares: ``<driver>/migUUID``) keeps on one, those with
one share at most, and every example in ``deploy/examples``. Writes go over HTTP as
the cluster admin (a user's ``kubectl``). Needs ``helm`` (``hack/install-helm.sh``):
without it these fail and say so, as every test of the chart-installed fake does.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.chart import EXTENDED_VALUES, chart_api, render_chart
from tests.support.examples import EXAMPLES_DIR, render_example
from tests.support.fakekube import FakeKubeApi
from tests.support.fakekube_types import DEFAULT_KINDS, ResourceKind
from tests.support.http import send

DRIVER = "gpu.fractional.dev"
GPU, MIG, SHARE = DRIVER, f"mig.{DRIVER}", f"share.{DRIVER}"
UUID, MIG_UUID = f"{DRIVER}/uuid", f"{DRIVER}/migUUID"
NAMESPACE = "ns"
POLICY = "fractional-gpu-dra-mps-shares-one-daemon"
TEMPLATE_KIND = ResourceKind(
    "resource.k8s.io",
    "v1",
    "resourceclaimtemplates",
    "ResourceClaimTemplate",
    namespaced=True,
    status_subresource=False,
)
KINDS = (*DEFAULT_KINDS, TEMPLATE_KIND)
MANY_ONE = 'request "gpus" asks for more than one MPS share (count above 1, or allocationMode All)'
FIX_GPU = f"Fix: add the constraint {{matchAttribute: {UUID}}}"
FIX_MIG = f"Fix: add the constraint {{matchAttribute: {MIG_UUID}}}"

Obj = dict[str, Any]


# --- claims --------------------------------------------------------------------------


def exact(
    cls: str = GPU, *, memory: str | None = "10Gi", count: int | None = None, mode: str = ""
) -> Obj:
    """An ``exactly`` request (or a sub-request's fields): a share with ``memory``."""
    found: Obj = {"deviceClassName": cls}
    if memory is not None:
        found["capacity"] = {"requests": {"memory": memory}}
    if mode:
        found["allocationMode"] = mode
    if count is not None:
        found["count"] = count
    return found


def request(name: str, **kwargs: Any) -> Obj:
    return {"name": name, "exactly": exact(**kwargs)}


def first_available(name: str, *subs: tuple[str, Obj]) -> Obj:
    return {"name": name, "firstAvailable": [{"name": n, **e} for n, e in subs]}


def match(attribute: str, *requests: str) -> Obj:
    found: Obj = {"matchAttribute": attribute}
    if requests:
        found["requests"] = list(requests)
    return found


def claim(*requests: Obj, constraints: tuple[Obj, ...] = (), name: str = "c") -> Obj:
    devices: Obj = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = list(constraints)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": devices},
    }


def template(of: Obj, name: str = "t") -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": of["metadata"]["namespace"]},
        "spec": {"spec": copy.deepcopy(of["spec"])},
    }


def _path(obj: Obj) -> str:
    plural = {"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates"}
    if obj["kind"] == "Namespace":
        return "/api/v1/namespaces"
    namespace = obj["metadata"]["namespace"]
    return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/{plural[obj['kind']]}"


def write(api: FakeKubeApi, obj: Obj) -> tuple[int, Any]:
    """POST ``obj`` as the cluster admin: (status, body)."""
    return send(api, "POST", _path(obj), json.dumps(obj).encode())


@pytest.fixture
def fake() -> Iterator[FakeKubeApi]:
    """The fake with the default chart installed, 1.36, and the namespace ``ns``."""
    with chart_api(kinds=KINDS) as api:
        assert write(api, {"kind": "Namespace", "metadata": {"name": NAMESPACE}})[0] == 201
        yield api


def refused(api: FakeKubeApi, obj: Obj) -> str:
    """The policy's message refusing ``obj`` (fails when it is admitted)."""
    code, body = write(api, obj)
    assert code == 422, body
    kind = "resourceclaimtemplates" if obj["kind"] == "ResourceClaimTemplate" else "resourceclaims"
    prefix = (
        f'{kind}.resource.k8s.io "{obj["metadata"]["name"]}" is forbidden: '
        f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request: "
    )
    message: str = body["message"]
    assert message.startswith(prefix), message
    return message.removeprefix(prefix)


def admitted(api: FakeKubeApi, obj: Obj) -> None:
    code, body = write(api, obj)
    assert code == 201, body


# --- what is refused -----------------------------------------------------------------

REFUSED = {
    "count-2-share": (claim(request("gpus", count=2)), [MANY_ONE, FIX_GPU]),
    "all-share": (claim(request("gpus", mode="All")), [MANY_ONE]),
    "two-share-requests": (
        claim(request("a"), request("b")),
        ['requests "a" and "b" ask for MPS shares and no constraint keeps them on one GPU'],
    ),
    "three-share-requests": (
        claim(request("a"), request("b"), request("c", memory="1Gi")),
        ['requests "a" and "b" (and 1 more) ask for MPS shares'],
    ),
    "share-and-controller-share": (
        claim(request("a"), request("b", cls=SHARE, memory=None)),
        ['requests "a" and "b" ask for MPS shares'],
    ),
    "first-available-share-count-2": (
        claim(
            first_available(
                "gpus", ("big", exact(memory=None)), ("shares", exact(memory="5Gi", count=2))
            )
        ),
        [MANY_ONE],
    ),
    "controller-class-count-2": (
        claim(request("gpus", cls=SHARE, memory=None, count=2)),
        [MANY_ONE],
    ),
    "distinct-uuid (the old count-two-distinct)": (
        claim(request("gpus", count=2), constraints=({"distinctAttribute": UUID},)),
        [MANY_ONE],
    ),
    "match-on-another-attribute": (
        claim(request("gpus", count=2), constraints=(match(f"{DRIVER}/productName"),)),
        [MANY_ONE],
    ),
    "match-covering-one-of-two": (
        claim(
            request("a"),
            request("b"),
            request("w", memory=None),
            constraints=(match(UUID, "a", "w"),),
        ),
        ['requests "a" and "b" ask for MPS shares'],
    ),
    "mig-share-count-2": (
        claim(request("gpus", cls=MIG, memory="2Gi", count=2)),
        [
            MANY_ONE + " and no constraint keeps them on one MIG instance",
            FIX_MIG,
            "publish no migUUID",
        ],
    ),
    "mig-shares-matched-on-the-gpu-uuid": (
        claim(request("gpus", cls=MIG, memory="2Gi", count=2), constraints=(match(UUID),)),
        [FIX_MIG],
    ),
    "gpu-share-and-mig-share": (
        claim(request("g"), request("m", cls=MIG, memory="2Gi"), constraints=(match(UUID),)),
        ['request "g" asks for an MPS share of a GPU and request "m" for one of a MIG instance'],
    ),
}


@pytest.mark.parametrize(("obj", "says"), REFUSED.values(), ids=REFUSED.keys())
def test_a_claim_whose_shares_could_split_is_refused_with_the_fix(
    fake: FakeKubeApi, obj: Obj, says: list[str]
) -> None:
    message = refused(fake, obj)
    for text in says:
        assert text in message, message
    assert "the kubelet plugin would refuse to prepare the claim" in message


def test_a_template_is_refused_as_its_claims_would_be(fake: FakeKubeApi) -> None:
    """The old count-two-distinct example: two 10Gi shares on two distinct GPUs."""
    old = claim(
        request("gpus", count=2), constraints=({"requests": ["gpus"], "distinctAttribute": UUID},)
    )
    message = refused(fake, template(old, name="two-shares"))
    assert message.startswith(MANY_ONE + " and no constraint keeps them on one GPU"), message
    assert FIX_GPU in message
    admitted(fake, template(claim(request("gpus", count=2), constraints=(match(UUID),))))


# --- what is admitted ----------------------------------------------------------------

ADMITTED = {
    "count-1-share": claim(request("gpus")),
    "count-2-share-matched-on-uuid": claim(
        request("gpus", count=2), constraints=(match(UUID, "gpus"),)
    ),
    "count-2-share-matched-on-uuid-for-all-requests": claim(
        request("gpus", count=2), constraints=(match(UUID),)
    ),
    "all-share-matched-on-uuid": claim(request("gpus", mode="All"), constraints=(match(UUID),)),
    "two-share-requests-matched-on-uuid": claim(
        request("a"), request("b"), constraints=(match(UUID, "b", "a"),)
    ),
    "count-2-whole-gpus": claim(
        request("gpus", memory=None, count=2), constraints=({"distinctAttribute": UUID},)
    ),
    "controller-class-count-1": claim(request("gpus", cls=SHARE, memory=None)),
    "one-share-beside-whole-gpus": claim(request("s"), request("w", memory=None, count=2)),
    "first-available-one-share-or-two-whole": claim(
        first_available("gpus", ("share", exact()), ("whole", exact(memory=None, count=2)))
    ),
    "mig-shares-matched-on-mig-uuid": claim(
        request("gpus", cls=MIG, memory="2Gi", count=2), constraints=(match(MIG_UUID),)
    ),
    "whole-mig-instances-count-2": claim(request("gpus", cls=MIG, memory=None, count=2)),
    "another-drivers-shares": claim(request("nics", cls="nic.example.com", count=2)),
}


@pytest.mark.parametrize("obj", ADMITTED.values(), ids=ADMITTED.keys())
def test_a_claim_with_its_shares_on_one_daemon_is_admitted(fake: FakeKubeApi, obj: Obj) -> None:
    admitted(fake, obj)
    admitted(fake, template(obj))


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES_DIR.iterdir() if p.is_dir()))
def test_every_example_is_admitted(fake: FakeKubeApi, name: str) -> None:
    objects = render_example(name, DRIVER)
    claims = [o for o in objects if o["kind"] in ("ResourceClaim", "ResourceClaimTemplate")]
    for obj in [o for o in objects if o["kind"] == "Namespace"] + claims:
        admitted(fake, obj)


def test_an_update_that_keeps_the_spec_is_admitted(fake: FakeKubeApi) -> None:
    """A claim written before the policy (or with it off) can still lose its finalizer,
    so its namespace can be deleted."""
    old = claim(request("gpus", count=2))
    old["metadata"]["finalizers"] = ["example.com/hold"]
    fake.create(old)  # in process: no admission, as if written before the policy
    path = f"{_path(old)}/c"
    patch = json.dumps({"metadata": {"finalizers": None, "annotations": {"a": "b"}}}).encode()
    code, body = send(fake, "PATCH", path, patch, "application/merge-patch+json")
    assert code == 200, body


# --- versions and values -------------------------------------------------------------


def test_on_134_only_the_controller_class_counts() -> None:
    """1.34/1.35 drop capacity.requests before admission: a native-path share is a
    whole-GPU request there; the controller's class is a share on every version."""
    with chart_api(kube_minor=34, kinds=KINDS) as api:
        admitted(api, {"kind": "Namespace", "metadata": {"name": NAMESPACE}})
        admitted(api, claim(request("gpus", count=2), name="native"))
        assert MANY_ONE in refused(
            api, claim(request("gpus", cls=SHARE, memory=None, count=2), name="controller")
        )


def test_the_value_turns_the_policy_off() -> None:
    values = ("admission.mpsSharesOnOneDaemon=false",)
    assert not [d for d in render_chart(values) if "mps-shares-one-daemon" in d["metadata"]["name"]]
    with chart_api(values, kinds=KINDS) as api:
        admitted(api, {"kind": "Namespace", "metadata": {"name": NAMESPACE}})
        admitted(api, claim(request("gpus", count=2)))


def test_the_policy_follows_the_driver_name_and_the_extended_classes() -> None:
    other = "gpus.example.com"
    values = (f"driverName={other}", *EXTENDED_VALUES)
    with chart_api(values, kinds=KINDS) as api:
        admitted(api, {"kind": "Namespace", "metadata": {"name": NAMESPACE}})
        says = refused(api, claim(request("gpus", count=2), constraints=(match(UUID),)))
        assert f"{{matchAttribute: {other}/uuid}}" in says
        admitted(api, claim(request("gpus", count=2), constraints=(match(f"{other}/uuid"),)))
        whole_class = "whole.gpu.fractional.dev"
        assert MANY_ONE in refused(api, claim(request("gpus", cls=whole_class, count=2), name="w"))
        mig_class = "mig-1g.10gb.gpu.fractional.dev"
        says = refused(api, claim(request("gpus", cls=mig_class, memory="2Gi", count=2), name="m"))
        assert f"{{matchAttribute: {other}/migUUID}}" in says


def test_the_policy_matches_claims_and_templates_in_v1_with_their_binding() -> None:
    docs = render_chart()
    (policy,) = [
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == POLICY
    ]
    constraints = policy["spec"]["matchConstraints"]
    assert constraints["matchPolicy"] == "Equivalent"
    assert constraints["resourceRules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["resourceclaims", "resourceclaimtemplates"],
        }
    ]
    (binding,) = [
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicyBinding" and d["metadata"]["name"] == POLICY
    ]
    assert binding["spec"] == {"policyName": POLICY, "validationActions": ["Deny"]}
    expressions = json.dumps(policy["spec"])
    assert "?." not in expressions and ".?" not in expressions, "no CEL optional syntax"
