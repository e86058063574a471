"""What the chart's admission policies refuse on a real API server, before any allocation.

A claim whose MPS shares could land on two GPUs is never served: each GPU has its
own MPS daemon and a container reaches only one, so the kubelet plugin refuses it
at every prepare and the pod stays ContainerCreating. The chart's
ValidatingAdmissionPolicy ``*-mps-shares-one-daemon`` refuses it when it is
written (``admission.mpsSharesOnOneDaemon``, on by default). Here the real API
server evaluates the policy's CEL: the old ``count-two-distinct`` example (two 10Gi
shares on two distinct GPUs) is refused with the policy's message, and the same
shares kept on one GPU by ``matchAttribute`` on ``uuid`` are admitted; on every
version (1.34 included, which drops ``capacity.requests``), two shares of the
controller's class ``share.gpu.fractional.dev`` in one request are refused. Nothing is
allocated: the tests write claim templates only, in a namespace of their own that
they delete.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.e2e.test_examples_e2e import require_native as examples_require_native
from tests.support.cluster import Cluster, delete_namespace
from tests.support.examples import Obj

pytestmark = pytest.mark.e2e

NAMESPACE = "fgd-e2e-admission"
POLICY_SUFFIX = "-mps-shares-one-daemon"


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace (one left over from an earlier run is deleted first), deleted
    and waited for afterwards; the chart's policy must be installed."""
    policies = cluster.objects("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy")
    if not any(p["metadata"]["name"].endswith(POLICY_SUFFIX) for p in policies):
        pytest.fail(
            f"no ValidatingAdmissionPolicy *{POLICY_SUFFIX} on this cluster: install the chart"
            " with admission.mpsSharesOnOneDaemon=true (the default)"
        )
    assert delete_namespace(cluster, NAMESPACE), f"{NAMESPACE}: left over and stuck"
    cluster.core.create_namespace({"metadata": {"name": NAMESPACE}})
    yield NAMESPACE
    assert delete_namespace(cluster, NAMESPACE), (
        f"{NAMESPACE}: not gone after {cluster.delete_timeout_s:.0f}s"
    )


def require_native(cluster: Cluster) -> None:
    examples_require_native(
        cluster, "before admission, so the claim is a whole-GPU claim the policy admits"
    )


def two_shares(constraint: Obj) -> Obj:
    """The old ``count-two-distinct`` template: two 10Gi shares in one request."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "two-shares", "namespace": NAMESPACE},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpus",
                            "exactly": {
                                "deviceClassName": "gpu.fractional.dev",
                                "count": 2,
                                "capacity": {"requests": {"memory": "10Gi"}},
                            },
                        }
                    ],
                    "constraints": [{"requests": ["gpus"], **constraint}],
                }
            }
        },
    }


def refusal(cluster: Cluster, obj: Obj) -> str:
    """The API server's message refusing ``obj``; fails when it is admitted."""
    from kubernetes.client.exceptions import ApiException

    templates = cluster.resource("resource.k8s.io/v1", "ResourceClaimTemplate")
    try:
        templates.create(body=obj, namespace=obj["metadata"]["namespace"])
    except ApiException as err:
        assert err.status == 422, f"expected 422 Invalid, got {err.status}: {err.body}"
        message: str = json.loads(err.body or "{}").get("message", "")
        return message
    pytest.fail(f"the API server admitted {obj['kind']}/{obj['metadata']['name']}: {obj}")


def test_two_shares_on_two_gpus_are_refused_with_the_fix(cluster: Cluster, namespace: str) -> None:
    require_native(cluster)
    message = refusal(cluster, two_shares({"distinctAttribute": f"{cluster.driver}/uuid"}))
    assert message.startswith('resourceclaimtemplates.resource.k8s.io "two-shares" is forbidden:')
    assert "ValidatingAdmissionPolicy '" in message, message
    assert f"{POLICY_SUFFIX}' with binding" in message, message
    assert 'request "gpus" asks for more than one MPS share' in message, message
    assert f"{{matchAttribute: {cluster.driver}/uuid}}" in message, message


def test_shares_kept_on_one_gpu_are_admitted(cluster: Cluster, namespace: str) -> None:
    require_native(cluster)
    templates = cluster.resource("resource.k8s.io/v1", "ResourceClaimTemplate")
    obj = two_shares({"matchAttribute": f"{cluster.driver}/uuid"})
    templates.create(body=obj, namespace=namespace)
    stored = templates.get(name="two-shares", namespace=namespace).to_dict()
    (request,) = stored["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["capacity"]["requests"] == {"memory": "10Gi"}, stored


def test_two_controller_shares_are_refused_on_every_version(
    cluster: Cluster, namespace: str
) -> None:
    """The controller's class is a share whatever the API drops (its amount is a
    ``GpuShare`` config): count 2 without ``matchAttribute`` is refused on 1.34 too."""
    obj = two_shares({"distinctAttribute": f"{cluster.driver}/uuid"})
    spec = obj["spec"]["spec"]["devices"]
    (request,) = spec["requests"]
    request["exactly"] = {"deviceClassName": "share.gpu.fractional.dev", "count": 2}
    del spec["constraints"]
    spec["config"] = [
        {
            "requests": ["gpus"],
            "opaque": {
                "driver": cluster.driver,
                "parameters": {
                    "apiVersion": f"{cluster.driver}/v1alpha1",
                    "kind": "GpuShare",
                    "memory": "10Gi",
                },
            },
        }
    ]
    message = refusal(cluster, obj)
    assert 'request "gpus" asks for more than one MPS share' in message, message
