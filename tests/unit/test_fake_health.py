"""Fault injection into the fake backend through files: the format, applying, the watcher."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from dra_driver.cli import build_parser
from dra_driver.cli import plugin as plugin_cli
from dra_driver.cli.plugin import _plugin_backend
from dra_driver.core.model import HealthEvent
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.gpu_faults import (
    SETTLE_S,
    Fault,
    FaultDirWatcher,
    FaultFileError,
    FaultKind,
    parse_fault,
)
from tests.support.eventually import eventually
from tests.support.node import run_checked

# --- the format -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ('{"gpu": "gpu-1", "xid": 79}', Fault(FaultKind.XID, "gpu-1", xid=79)),
        ('{"gpu": 2, "xid": 94, "mig": 1}', Fault(FaultKind.XID, 2, xid=94, mig=1)),
        (
            '{"gpu": " GPU-x ", "xid": 48, "mig": "MIG-y", "message": "DBE"}',
            Fault(FaultKind.XID, "GPU-x", xid=48, mig="MIG-y", message="DBE"),
        ),
        ('{"gpu": "gpu-0", "xid": 0}', Fault(FaultKind.XID, "gpu-0", xid=0)),
        ('{"gpu": "gpu-1", "lost": true}', Fault(FaultKind.LOST, "gpu-1")),
        (
            '{"gpu": "gpu-1", "lost": true, "message": "gone"}',
            Fault(FaultKind.LOST, "gpu-1", message="gone"),
        ),
        ('{"gpu": "gpu-1", "restore": true}', Fault(FaultKind.RESTORE, "gpu-1")),
        ('{"restore": true}', Fault(FaultKind.RESTORE, None)),
        ('{"gpu": 0, "reset": true}\n', Fault(FaultKind.RESET, 0)),
        ('{"reset": true}', Fault(FaultKind.RESET, None)),
    ],
)
def test_parse(text: str, fault: Fault) -> None:
    assert parse_fault(text) == fault


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1]", 'expected a JSON object such as {"gpu": "gpu-1", "xid": 79}, not [1]'),
        (
            '{"gpu": "gpu-1", "xid": 79, "when": 1}',
            "unknown keys when; allowed: gpu, xid, mig, message, lost, restore, reset",
        ),
        (
            '{"gpu": "gpu-1"}',
            'give exactly one of xid, lost, restore, reset, e.g. {"gpu": "gpu-1", "xid": 79}',
        ),
        (
            '{"gpu": "gpu-1", "xid": 79, "reset": true}',
            "give exactly one of xid, lost, restore, reset (found xid, reset), "
            'e.g. {"gpu": "gpu-1", "xid": 79}',
        ),
        ('{"gpu": "gpu-1", "lost": "yes"}', '"lost" must be true, not "yes"'),
        ('{"reset": false}', '"reset" must be true, not false'),
        (
            '{"xid": 79}',
            '"xid" needs "gpu": "gpu-1", a UUID "GPU-..." or an index such as 1, '
            'e.g. {"gpu": "gpu-1", "xid": 79}',
        ),
        ('{"lost": true}', '"lost" needs "gpu"'),
        ('{"gpu": "", "xid": 79}', '"gpu" must be "gpu-1", a UUID "GPU-..." or an index'),
        ('{"gpu": -1, "xid": 79}', '"gpu" must be'),
        ('{"gpu": true, "xid": 79}', '"gpu" must be'),
        (
            '{"gpu": 1, "xid": "79"}',
            '"xid" must be a whole number such as 79 (0: the event source failed), not "79"',
        ),
        ('{"gpu": 1, "xid": 7.9}', '"xid" must be a whole number'),
        ('{"gpu": 1, "xid": true}', '"xid" must be a whole number'),
        ('{"gpu": 1, "xid": 79, "mig": 1.5}', '"mig" must be a GPU-instance id such as 1'),
        ('{"gpu": 1, "reset": true, "mig": 1}', '"mig" goes with "xid" only'),
        ('{"gpu": 1, "reset": true, "message": "x"}', '"message" goes with "xid" or "lost"'),
        ('{"gpu": 1, "xid": 79, "message": 5}', '"message" must be a string, not 5'),
    ],
)
def test_parse_errors_say_what_to_write(text: str, message: str) -> None:
    with pytest.raises(FaultFileError) as info:
        parse_fault(text)
    assert str(info.value).startswith(message)
    assert not info.value.incomplete


@pytest.mark.parametrize("text", ["", '{"gpu": "gpu-1", "xi', "xid 79"])
def test_not_json_may_be_half_written(text: str) -> None:
    with pytest.raises(FaultFileError, match=r"^not JSON .*; write one object such as") as info:
        parse_fault(text)
    assert info.value.incomplete


# --- applying to the fake ---------------------------------------------------------------


def events_of(backend: FakeGpuBackend) -> list[HealthEvent]:
    events = []
    while not backend._events.empty():
        event = backend._events.get_nowait()
        assert event is not None
        events.append(event)
    return events


def test_xids_name_the_gpu_by_device_name_uuid_or_index() -> None:
    backend = FakeGpuBackend("h100-80gb:2,h100-80gb:1:mig", "node-a")
    gpus = backend._inventory.gpus
    assert backend.apply_fault(parse_fault('{"gpu": "gpu-1", "xid": 79}')) == (
        "injected XID 79 on GPU gpu-1"
    )
    backend.apply_fault(Fault(FaultKind.XID, gpus[0].uuid, xid=48, message="DBE"))
    backend.apply_fault(Fault(FaultKind.XID, 1, xid=0))
    assert events_of(backend) == [
        HealthEvent(gpus[1].uuid, 79),
        HealthEvent(gpus[0].uuid, 48, "DBE"),
        HealthEvent(gpus[1].uuid, 0),
    ]


def test_xid_on_a_mig_device_by_instance_id_or_uuid(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "gpus:\n- model: h100-80gb\n  mig: true\n  migInstances:\n"
        "  - {profile: 3g.40gb, start: 0}\n  - {profile: 1g.10gb, start: 4}\n"
    )
    backend = FakeGpuBackend(str(path), "node-a")
    gpu = backend._inventory.gpus[0]
    second = gpu.mig_devices[1]
    assert backend.apply_fault(Fault(FaultKind.XID, "gpu-0", xid=94, mig=2)) == (
        f"injected XID 94 on GPU gpu-0 MIG device {second.uuid}"
    )
    backend.apply_fault(Fault(FaultKind.XID, 0, xid=94, mig=second.uuid))
    assert events_of(backend) == [HealthEvent(gpu.uuid, 94, mig_uuid=second.uuid)] * 2
    with pytest.raises(FaultFileError) as info:
        backend.apply_fault(Fault(FaultKind.XID, 0, xid=94, mig=3))
    assert str(info.value) == (
        "GPU gpu-0 has no MIG device 3; its MIG devices by GPU-instance id: "
        f"1 ({gpu.mig_devices[0].uuid}, 3g.40gb), 2 ({second.uuid}, 1g.10gb)"
    )


def test_unknown_gpus_and_mig_devices_are_refused_with_the_known_ones() -> None:
    backend = FakeGpuBackend("l4:2", "node-a")
    gpus = backend._inventory.gpus
    with pytest.raises(FaultFileError) as info:
        backend.apply_fault(Fault(FaultKind.XID, "gpu-2", xid=79))
    assert str(info.value) == (
        'no GPU "gpu-2" here; name one by device name, UUID or index 0-1: '
        f"gpu-0 ({gpus[0].uuid}), gpu-1 ({gpus[1].uuid})"
    )
    with pytest.raises(FaultFileError, match="no GPU 7 here"):
        backend.apply_fault(Fault(FaultKind.LOST, 7))
    with pytest.raises(FaultFileError, match=r'it has none \(omit "mig" for the whole GPU\)'):
        backend.apply_fault(Fault(FaultKind.XID, 0, xid=94, mig=1))
    assert events_of(backend) == []


def test_lost_restore_and_reset_act_through_the_probe() -> None:
    async def scenario() -> None:
        backend = FakeGpuBackend("h100-80gb:3", "node-a")
        uuids = [gpu.uuid for gpu in backend._inventory.gpus]
        assert backend.apply_fault(Fault(FaultKind.LOST, "gpu-1", message="off the bus")) == (
            "GPU gpu-1 is lost until restored or reset (seen at the next probe)"
        )
        backend.apply_fault(Fault(FaultKind.LOST, 2))
        assert await backend.probe() == {
            uuids[0]: None,
            uuids[1]: "off the bus",
            uuids[2]: "GPU is lost: it has fallen off the bus",
        }
        backend.apply_fault(Fault(FaultKind.RESTORE, "gpu-1"))
        assert (await backend.probe())[uuids[1]] is None
        assert backend.apply_fault(Fault(FaultKind.RESTORE, None)) == (
            "every GPU answers again (seen at the next probe)"
        )
        assert set((await backend.probe()).values()) == {None}
        assert backend.apply_fault(Fault(FaultKind.RESET, None)) == (
            "every GPU is being reset (seen over the next two probes)"
        )
        assert set((await backend.probe()).values()) == {"the GPU is being reset"}
        assert set((await backend.probe()).values()) == {None}

    asyncio.run(scenario())


# --- the watcher ------------------------------------------------------------------------


class Recorder:
    def __init__(self, refuse: str = "") -> None:
        self.faults: list[Fault] = []
        self.refuse = refuse

    def __call__(self, fault: Fault) -> str:
        if fault.gpu == self.refuse:
            raise FaultFileError(f"no GPU {self.refuse!r} here")
        self.faults.append(fault)
        return f"applied {fault.kind}"


def drop(directory: Path, name: str, text: str, age_s: float = 10.0) -> Path:
    path = directory / name
    path.write_text(text)
    then = path.stat().st_mtime - age_s
    os.utime(path, (then, then))
    return path


def test_files_are_applied_once_in_order_and_renamed_done(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "dra_driver.fakes.gpu_faults")
    apply = Recorder()
    watcher = FaultDirWatcher(str(tmp_path), apply)
    drop(tmp_path, "b-reset.json", '{"gpu": "gpu-1", "reset": true}', age_s=5)
    drop(tmp_path, "a-xid.json", '{"gpu": "gpu-1", "xid": 79}', age_s=6)
    drop(tmp_path, "c", '{"gpu": "gpu-1", "lost": true}', age_s=5)  # same time: by name
    for skipped in (".hidden", "x.json.tmp", "old.json.done", "old.json.bad"):
        drop(tmp_path, skipped, '{"gpu": "gpu-1", "xid": 13}')
    (tmp_path / "folder").mkdir()

    assert asyncio.run(watcher.poll_once()) == ["a-xid.json", "b-reset.json", "c"]
    assert [f.kind for f in apply.faults] == [FaultKind.XID, FaultKind.RESET, FaultKind.LOST]
    ignored = {".hidden", "x.json.tmp", "old.json.done", "old.json.bad", "folder"}
    assert {p.name for p in tmp_path.iterdir()} - ignored == {
        "a-xid.json.done",
        "b-reset.json.done",
        "c.done",
    }
    assert f"{tmp_path}/a-xid.json: applied xid" in caplog.text
    assert asyncio.run(watcher.poll_once()) == []
    assert len(apply.faults) == 3

    drop(tmp_path, "a-xid.json", '{"gpu": "gpu-0", "xid": 48}')  # the same name again
    assert asyncio.run(watcher.poll_once()) == ["a-xid.json"]
    assert apply.faults[-1] == Fault(FaultKind.XID, "gpu-0", xid=48)
    assert (tmp_path / "a-xid.json.done").read_text() == '{"gpu": "gpu-0", "xid": 48}'


def test_bad_files_are_logged_with_the_fix_and_renamed_bad(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, "dra_driver.fakes.gpu_faults")
    apply = Recorder(refuse="gpu-9")
    watcher = FaultDirWatcher(str(tmp_path), apply)
    drop(tmp_path, "typo.json", '{"gpu": "gpu-1", "xdi": 79}')
    drop(tmp_path, "nine.json", '{"gpu": "gpu-9", "xid": 79}')
    drop(tmp_path, "good.json", '{"gpu": "gpu-1", "xid": 79}')
    assert sorted(asyncio.run(watcher.poll_once())) == ["good.json", "nine.json", "typo.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "good.json.done",
        "nine.json.bad",
        "typo.json.bad",
    ]
    assert len(apply.faults) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(f"{tmp_path}/typo.json: unknown keys xdi; allowed: gpu, xid" in e for e in errors)
    assert any(
        e.startswith(f"fake backend: {tmp_path}/nine.json: no GPU 'gpu-9' here; renamed it ")
        and e.endswith("nine.json.bad (drop a new file to try again)")
        for e in errors
    )


def test_a_half_written_file_is_read_again_until_it_settles(tmp_path: Path) -> None:
    apply = Recorder()
    watcher = FaultDirWatcher(str(tmp_path), apply)
    path = drop(tmp_path, "x.json", '{"gpu": "gpu-1", ', age_s=0)
    assert asyncio.run(watcher.poll_once()) == []
    assert path.exists()
    path.write_text('{"gpu": "gpu-1", "xid": 79}')
    assert asyncio.run(watcher.poll_once()) == ["x.json"]
    assert apply.faults == [Fault(FaultKind.XID, "gpu-1", xid=79)]

    stale = drop(tmp_path, "y.json", '{"gpu": ', age_s=SETTLE_S + 1)
    assert asyncio.run(watcher.poll_once()) == ["y.json"]
    assert not stale.exists() and (tmp_path / "y.json.bad").exists()


def test_the_directory_is_made_and_an_unusable_one_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "dra_driver.fakes.gpu_faults")
    made = tmp_path / "a" / "fake-health"
    assert asyncio.run(FaultDirWatcher(str(made), Recorder()).poll_once()) == []
    assert made.is_dir()

    (tmp_path / "file").write_text("")
    watcher = FaultDirWatcher(str(tmp_path / "file" / "dir"), Recorder())
    for _ in range(3):
        assert asyncio.run(watcher.poll_once()) == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "cannot read the fault-injection directory" in warnings[0]
    assert "set --fake-health-dir (FAKE_HEALTH_DIR) to a writable directory" in warnings[0]


def test_a_file_that_cannot_be_renamed_is_not_applied_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "dra_driver.fakes.gpu_faults")
    apply = Recorder()
    watcher = FaultDirWatcher(str(tmp_path), apply)
    drop(tmp_path, "x.json", '{"gpu": "gpu-1", "xid": 79}')

    def refuse(src: str, dst: str) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    for _ in range(2):
        asyncio.run(watcher.poll_once())
    assert len(apply.faults) == 1
    assert "cannot rename" in caplog.text and "will not be applied again" in caplog.text


# --- the backend runs the watcher ---------------------------------------------------------


def test_health_events_start_the_watcher_and_close_stops_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        backend = FakeGpuBackend(
            "h100-80gb:2", "node-a", health_dir=str(tmp_path), health_poll_s=0.01
        )
        events = backend.health_events()
        drop(tmp_path, "xid.json", '{"gpu": "gpu-1", "xid": 79, "message": "off the bus"}')
        drop(tmp_path, "bad.json", '{"gpu": "gpu-1", "xid": "lots"}')
        event = await asyncio.wait_for(anext(events), 5)
        assert event == HealthEvent(backend._inventory.gpus[1].uuid, 79, "off the bus")
        await eventually((tmp_path / "bad.json.bad").exists, "bad.json set aside")
        await backend.close()
        assert [e async for e in events] == []
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json.bad", "xid.json.done"]

    run_checked(scenario())


def test_no_watcher_without_a_directory_or_after_close(tmp_path: Path) -> None:
    async def scenario() -> None:
        plain = FakeGpuBackend("l4", "node-a")
        await plain.close()
        assert [e async for e in plain.health_events()] == []
        closed = FakeGpuBackend("l4", "node-a", health_dir=str(tmp_path))
        await closed.close()
        assert [e async for e in closed.health_events()] == []
        assert closed._watcher is None

    run_checked(scenario())


# --- the flag ---------------------------------------------------------------------------


def test_flag_defaults_to_the_plugin_dir_and_has_an_env_twin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = build_parser().parse_args(["kubelet-plugin", "--fake-gpus", "l4"])
    backend = _plugin_backend(args, "node-a", str(tmp_path))
    assert isinstance(backend, FakeGpuBackend)
    assert backend.health_dir == str(tmp_path / "fake-health")

    monkeypatch.setenv("FAKE_HEALTH_DIR", "/elsewhere")
    args = build_parser().parse_args(["kubelet-plugin"])
    backend = _plugin_backend(args, "node-a", str(tmp_path))
    assert isinstance(backend, FakeGpuBackend) and backend.health_dir == "/elsewhere"
    args = build_parser().parse_args(["kubelet-plugin", "--fake-health-dir", "/there"])
    assert args.fake_health_dir == "/there"


def test_the_nvml_backend_ignores_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    other = FakeGpuBackend("l4", "node-a")  # stands in for what make_backend makes

    def backend(args: object, node_name: str) -> FakeGpuBackend:
        made.append(node_name)
        return other

    monkeypatch.setattr(plugin_cli, "make_backend", backend)
    args = build_parser().parse_args(
        ["kubelet-plugin", "--backend", "nvml", "--fake-health-dir", "/x"]
    )
    assert _plugin_backend(args, "node-a", "/plugin") is other
    assert made == ["node-a"] and other.health_dir is None
