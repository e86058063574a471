"""Start-up reconciliation and two plugin instances sharing one plugin dir."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid

import pytest

from dra_driver.app.plugin import start_plugin
from dra_driver.base.errors import CheckpointCorruptError
from dra_driver.base.ids import ClaimRef
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.kubelet import FakeKubelet
from dra_driver.fakes.objects import Allocated, claim_ref, resource_claim, share
from dra_driver.state.checkpoint import CheckpointStore, ClaimState
from tests.support.node import NodeDirs, run_checked, serving


async def prepare_via_plugin(
    dirs: NodeDirs, source: InMemoryClaimSource, refs: list[ClaimRef]
) -> None:
    async with serving(dirs, source) as (_, plugin):
        results = await plugin.prepare(refs)
        assert all(not r.error for r in results.values()), results


def test_reboot_drops_prepared_claims_and_their_specs(node_dirs: NodeDirs) -> None:
    claim = resource_claim("ns", "c", devices=[Allocated("gpu-0")])
    source = InMemoryClaimSource([claim])

    async def scenario() -> None:
        await prepare_via_plugin(node_dirs, source, [claim_ref(claim)])
        assert len(node_dirs.cdi_files()) == 1
        node_dirs.set_boot_id("boot-2")  # the node rebooted; /var/run/cdi survived here
        runtime = await start_plugin(node_dirs.parts(source))
        await runtime.stop()
        assert runtime.reconcile_report is not None
        assert len(runtime.reconcile_report.orphans_removed) == 1
        assert node_dirs.cdi_files() == []
        store = CheckpointStore(os.path.join(node_dirs.plugin, "checkpoint.json"), "boot-2")
        assert store.load().claims == {}

    run_checked(scenario())


def test_missing_spec_is_rewritten_on_start(node_dirs: NodeDirs) -> None:
    claim = resource_claim("ns", "c", devices=[Allocated("gpu-1")])
    source = InMemoryClaimSource([claim])

    async def scenario() -> None:
        await prepare_via_plugin(node_dirs, source, [claim_ref(claim)])
        [name] = node_dirs.cdi_files()
        path = os.path.join(node_dirs.cdi, name)
        with open(path, "rb") as handle:
            before = handle.read()
        os.unlink(path)
        runtime = await start_plugin(node_dirs.parts(source))
        await runtime.stop()
        assert runtime.reconcile_report is not None
        assert runtime.reconcile_report.rewritten == (claim_ref(claim).uid,)
        with open(path, "rb") as handle:
            assert handle.read() == before

    run_checked(scenario())


def test_half_prepared_claim_is_rolled_back_and_orphans_removed(node_dirs: NodeDirs) -> None:
    claim = resource_claim("ns", "c", devices=[Allocated("gpu-2")])
    source = InMemoryClaimSource([claim])
    orphan = os.path.join(node_dirs.cdi, f"k8s.gpu.fractional.dev-claim_{uuid.uuid4()}.json")
    temp = os.path.join(node_dirs.cdi, ".k8s.gpu.fractional.dev-claim_x.json.1234.tmp")
    foreign = os.path.join(node_dirs.cdi, "nvidia.com-gpu.yaml")

    async def scenario() -> None:
        await prepare_via_plugin(node_dirs, source, [claim_ref(claim)])
        # Turn the entry back into a prepare that died after writing its spec.
        store = CheckpointStore(os.path.join(node_dirs.plugin, "checkpoint.json"), "boot-1")
        checkpoint = store.load()
        entry = checkpoint.claims[claim_ref(claim).uid]
        started = dataclasses.replace(entry, state=ClaimState.PREPARE_STARTED)
        store.save(checkpoint.with_claim(started))
        for path in (orphan, temp, foreign):
            with open(path, "w", encoding="utf-8") as handle:
                handle.write("{}")

        runtime = await start_plugin(node_dirs.parts(source))
        await runtime.stop()
        report = runtime.reconcile_report
        assert report is not None
        assert report.rolled_back == (claim_ref(claim).uid,)
        assert report.orphans_removed == (orphan,)
        # Only files that are ours are touched.
        assert node_dirs.cdi_files() == ["nvidia.com-gpu.yaml"]
        assert store.load().claims == {}

    run_checked(scenario())


def test_two_instances_share_the_plugin_dir(node_dirs: NodeDirs) -> None:
    """A maxSurge rolling update: old and new pod both registered, calls on either."""
    claims = [resource_claim("ns", f"c{i}", devices=[share(f"gpu-{i % 4}")]) for i in range(40)]
    source = InMemoryClaimSource(claims)

    async def scenario() -> None:
        old_parts = node_dirs.parts(source, rolling_update_uid="old-pod-uid")
        new_parts = node_dirs.parts(source, rolling_update_uid="new-pod-uid")
        old = await start_plugin(old_parts)
        new = await start_plugin(new_parts)
        kubelet = FakeKubelet(node_dirs.registry)
        try:
            first = await kubelet.register_socket(old.sockets.registration)
            second = await kubelet.register_socket(new.sockets.registration)
            assert first.endpoint != second.endpoint
            plugins = [first, second]
            results = await asyncio.gather(
                *(plugins[i % 2].prepare([claim_ref(c)]) for i, c in enumerate(claims))
            )
            assert all(not r[claim_ref(c).uid].error for r, c in zip(results, claims, strict=True))
            # A repeat through the other instance finds the recorded result.
            again = await asyncio.gather(
                *(plugins[(i + 1) % 2].prepare([claim_ref(c)]) for i, c in enumerate(claims))
            )
            assert again == results
            store = CheckpointStore(os.path.join(node_dirs.plugin, "checkpoint.json"), "boot-1")
            assert len(store.load().claims) == 40
            assert len(node_dirs.cdi_files()) == 40
            await asyncio.gather(
                *(plugins[i % 2].unprepare([claim_ref(c)]) for i, c in enumerate(claims))
            )
            assert store.load().claims == {}
            assert node_dirs.cdi_files() == []
        finally:
            await kubelet.close()
            await old.stop()
            await new.stop()
        assert os.listdir(node_dirs.registry) == []

    run_checked(scenario())


def test_repeat_prepare_rewrites_a_spec_removed_at_runtime(node_dirs: NodeDirs) -> None:
    claim = resource_claim("ns", "c", devices=[Allocated("gpu-0")])
    source = InMemoryClaimSource([claim])

    async def scenario() -> None:
        async with serving(node_dirs, source) as (_, plugin):
            first = await plugin.prepare([claim_ref(claim)])
            [name] = node_dirs.cdi_files()
            path = os.path.join(node_dirs.cdi, name)
            with open(path, "rb") as handle:
                before = handle.read()
            os.unlink(path)
            assert await plugin.prepare([claim_ref(claim)]) == first
            with open(path, "rb") as handle:
                assert handle.read() == before

    run_checked(scenario())


def test_corrupt_checkpoint_stops_the_plugin_with_a_clear_error(node_dirs: NodeDirs) -> None:
    checkpoint = os.path.join(node_dirs.plugin, "checkpoint.json")
    with open(checkpoint, "w", encoding="utf-8") as handle:
        handle.write('{"kind": "FractionalGpuDraCheckpoint", "version": 1, "checksum": "x", ')

    async def scenario() -> None:
        parts = node_dirs.parts(InMemoryClaimSource())
        with pytest.raises(CheckpointCorruptError, match=f"move {checkpoint} aside"):
            await start_plugin(parts)  # closes what it had made (run_checked: nothing leaks)

        # The backend too: its health events end at once.
        async def events() -> list[object]:
            return [e async for e in parts.backend.health_events()]

        assert await asyncio.wait_for(events(), 5) == []
        assert os.listdir(node_dirs.registry) == [], "no socket before the state is sound"

    run_checked(scenario())
