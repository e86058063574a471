"""The generated stubs speak exactly the kubelet's wire protocol.

The expected tables below are written by hand from the DRA fact sheet
(dra-facts.md §1.1-1.4: the upstream ``api.proto`` files of the kubelet), not
from the generated code, so a wrong or stale ``proto/`` copy shows up here.
Both directions are checked: everything listed exists with the same number,
type, label, map-ness and presence, and nothing unlisted exists.

Field numbers, types and labels are the wire format; message, service and
package names are the gRPC method paths the kubelet dials. Field *names* do
not travel on the wire but are what our code is written against.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    FileDescriptor,
)

# --- the expected tables (from dra-facts.md §1.1-1.4) --------------------------------


@dataclass(frozen=True)
class Field:
    name: str
    number: int
    type: int
    """A ``FieldDescriptor.TYPE_*``; for a map the field's own type (TYPE_MESSAGE)."""
    type_name: str | None = None
    """Full name of the message or enum type (for a map: of the value type)."""
    repeated: bool = False
    optional: bool = False
    """Declared with proto3 ``optional``: explicit presence on the wire."""
    map_key: int | None = None
    """For ``map<K, V>``: the key's ``TYPE_*`` (the value is ``type_name``)."""


def string(name: str, number: int, *, repeated: bool = False, optional: bool = False) -> Field:
    return Field(name, number, FieldDescriptor.TYPE_STRING, repeated=repeated, optional=optional)


def message(name: str, number: int, full_name: str, *, repeated: bool = False) -> Field:
    return Field(name, number, FieldDescriptor.TYPE_MESSAGE, full_name, repeated=repeated)


def string_map(name: str, number: int, value_full_name: str) -> Field:
    return Field(
        name,
        number,
        FieldDescriptor.TYPE_MESSAGE,
        value_full_name,
        repeated=True,
        map_key=FieldDescriptor.TYPE_STRING,
    )


def int64(name: str, number: int) -> Field:
    return Field(name, number, FieldDescriptor.TYPE_INT64)


def boolean(name: str, number: int) -> Field:
    return Field(name, number, FieldDescriptor.TYPE_BOOL)


def enum(name: str, number: int, full_name: str) -> Field:
    return Field(name, number, FieldDescriptor.TYPE_ENUM, full_name)


@dataclass(frozen=True)
class Method:
    name: str
    input: str
    output: str
    server_streaming: bool = False
    client_streaming: bool = False


@dataclass(frozen=True)
class Service:
    name: str
    methods: tuple[Method, ...]


@dataclass(frozen=True)
class ProtoFile:
    module: str
    """The generated ``*_pb2`` module (its ``*_pb2_grpc`` twin sits next to it)."""
    package: str
    messages: dict[str, tuple[Field, ...]]
    """Top-level messages by short name."""
    services: tuple[Service, ...]
    enums: dict[str, dict[str, int]]
    """Top-level enums by short name: value name → number."""

    def full(self, short: str) -> str:
        return f"{self.package}.{short}"


def dra_file(module: str, package: str, *, share_id: bool) -> ProtoFile:
    """§1.2: v1 and v1beta1 are identical except ``Device.share_id``."""

    def p(short: str) -> str:
        return f"{package}.{short}"

    device = [
        string("request_names", 1, repeated=True),
        string("pool_name", 2),
        string("device_name", 3),
        string("cdi_device_ids", 4, repeated=True),
    ]
    if share_id:
        device.append(string("share_id", 5, optional=True))
    return ProtoFile(
        module=module,
        package=package,
        messages={
            "NodePrepareResourcesRequest": (message("claims", 1, p("Claim"), repeated=True),),
            "NodePrepareResourcesResponse": (
                string_map("claims", 1, p("NodePrepareResourceResponse")),
            ),
            "NodePrepareResourceResponse": (
                message("devices", 1, p("Device"), repeated=True),
                string("error", 2),
            ),
            "Device": tuple(device),
            "NodeUnprepareResourcesRequest": (message("claims", 1, p("Claim"), repeated=True),),
            "NodeUnprepareResourcesResponse": (
                string_map("claims", 1, p("NodeUnprepareResourceResponse")),
            ),
            "NodeUnprepareResourceResponse": (string("error", 1),),
            "Claim": (string("namespace", 1), string("uid", 2), string("name", 3)),
        },
        services=(
            Service(
                "DRAPlugin",
                (
                    Method(
                        "NodePrepareResources",
                        p("NodePrepareResourcesRequest"),
                        p("NodePrepareResourcesResponse"),
                    ),
                    Method(
                        "NodeUnprepareResources",
                        p("NodeUnprepareResourcesRequest"),
                        p("NodeUnprepareResourcesResponse"),
                    ),
                ),
            ),
        ),
        enums={},
    )


def health_file(module: str, package: str) -> ProtoFile:
    """§1.4: same numbering in v1alpha1 (as of 1.36) and v1."""

    def p(short: str) -> str:
        return f"{package}.{short}"

    return ProtoFile(
        module=module,
        package=package,
        messages={
            "NodeWatchResourcesRequest": (),
            "DeviceIdentifier": (string("pool_name", 1), string("device_name", 2)),
            "DeviceHealth": (
                message("device", 1, p("DeviceIdentifier")),
                enum("health", 2, p("HealthStatus")),
                int64("last_updated_time", 3),
                int64("health_check_timeout_seconds", 4),
                string("message", 5),
            ),
            "NodeWatchResourcesResponse": (
                message("devices", 1, p("DeviceHealth"), repeated=True),
            ),
        },
        services=(
            Service(
                "DRAResourceHealth",
                (
                    Method(
                        "NodeWatchResources",
                        p("NodeWatchResourcesRequest"),
                        p("NodeWatchResourcesResponse"),
                        server_streaming=True,
                    ),
                ),
            ),
        ),
        enums={"HealthStatus": {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}},
    )


REGISTRATION = ProtoFile(
    module="dra_driver._gen.pluginregistration.v1.api_pb2",
    package="pluginregistration",
    messages={
        "InfoRequest": (),
        "PluginInfo": (
            string("type", 1),
            string("name", 2),
            string("endpoint", 3),
            string("supported_versions", 4, repeated=True),
        ),
        "RegistrationStatus": (boolean("plugin_registered", 1), string("error", 2)),
        "RegistrationStatusResponse": (),
    },
    services=(
        Service(
            "Registration",
            (
                Method(
                    "GetInfo", "pluginregistration.InfoRequest", "pluginregistration.PluginInfo"
                ),
                Method(
                    "NotifyRegistrationStatus",
                    "pluginregistration.RegistrationStatus",
                    "pluginregistration.RegistrationStatusResponse",
                ),
            ),
        ),
    ),
    enums={},
)

FILES = [
    dra_file("dra_driver._gen.dra.v1.api_pb2", "k8s.io.kubelet.pkg.apis.dra.v1", share_id=True),
    dra_file(
        "dra_driver._gen.dra.v1beta1.api_pb2", "k8s.io.kubelet.pkg.apis.dra.v1beta1", share_id=False
    ),
    REGISTRATION,
    health_file("dra_driver._gen.dra_health.v1alpha1.api_pb2", "v1alpha1"),
    health_file("dra_driver._gen.dra_health.v1.api_pb2", "v1"),
]
FILE_IDS = ["dra-v1", "dra-v1beta1", "pluginregistration", "health-v1alpha1", "health-v1"]

# The gRPC method paths the kubelet dials, spelled out in full once more
# (fact sheet tables), so a wrong package *and* a matching wrong table above
# cannot both slip through.
METHOD_PATHS = {
    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
    "/pluginregistration.Registration/GetInfo",
    "/pluginregistration.Registration/NotifyRegistrationStatus",
    "/v1alpha1.DRAResourceHealth/NodeWatchResources",
    "/v1.DRAResourceHealth/NodeWatchResources",
}

# --- helpers -----------------------------------------------------------------------


def file_descriptor(spec: ProtoFile) -> FileDescriptor:
    module = importlib.import_module(spec.module)
    descriptor: FileDescriptor = module.DESCRIPTOR
    return descriptor


def grpc_module(spec: ProtoFile) -> ModuleType:
    return importlib.import_module(spec.module + "_grpc")


def field_cases() -> Iterator[Any]:
    for spec, file_id in zip(FILES, FILE_IDS, strict=True):
        for message_name, fields in spec.messages.items():
            for expected in fields:
                yield pytest.param(
                    spec, message_name, expected, id=f"{file_id}-{message_name}.{expected.name}"
                )


def map_entry(field: FieldDescriptor) -> Descriptor | None:
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        return entry
    return None


# --- table → generated ---------------------------------------------------------------


@pytest.mark.parametrize("spec", FILES, ids=FILE_IDS)
def test_package(spec: ProtoFile) -> None:
    assert file_descriptor(spec).package == spec.package


@pytest.mark.parametrize(("spec", "message_name", "expected"), list(field_cases()))
def test_field(spec: ProtoFile, message_name: str, expected: Field) -> None:
    msg = file_descriptor(spec).message_types_by_name.get(message_name)
    assert msg is not None, f"message {spec.full(message_name)} is missing"
    assert msg.full_name == spec.full(message_name)
    field = msg.fields_by_name.get(expected.name)
    assert field is not None, f"{msg.full_name} has no field {expected.name}"
    assert field.number == expected.number, f"{field.full_name}: wrong field number"
    assert field.type == expected.type, f"{field.full_name}: wrong type"
    assert field.is_repeated == expected.repeated, f"{field.full_name}: wrong label"

    entry = map_entry(field)
    if expected.map_key is not None:
        assert entry is not None, f"{field.full_name} should be a map"
        key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
        assert (key.number, key.type) == (1, expected.map_key)
        assert (value.number, value.type) == (2, FieldDescriptor.TYPE_MESSAGE)
        assert value.message_type is not None
        assert value.message_type.full_name == expected.type_name
    else:
        assert entry is None, f"{field.full_name} should not be a map"
        if expected.type == FieldDescriptor.TYPE_MESSAGE:
            assert field.message_type is not None
            assert field.message_type.full_name == expected.type_name
        elif expected.type == FieldDescriptor.TYPE_ENUM:
            assert field.enum_type is not None
            assert field.enum_type.full_name == expected.type_name

    # proto3: scalars have no presence unless declared `optional`, which
    # protoc models as a synthetic one-field oneof; singular messages always
    # have presence; repeated fields never do.
    singular_message = expected.type == FieldDescriptor.TYPE_MESSAGE and not expected.repeated
    assert field.has_presence == (expected.optional or singular_message), (
        f"{field.full_name}: wrong presence"
    )
    oneof = field.containing_oneof
    if expected.optional:
        assert oneof is not None and [f.name for f in oneof.fields] == [expected.name]
    else:
        assert oneof is None, f"{field.full_name} is in oneof {oneof.name}"


@pytest.mark.parametrize("spec", FILES, ids=FILE_IDS)
def test_enums(spec: ProtoFile) -> None:
    generated = file_descriptor(spec).enum_types_by_name
    assert set(generated) == set(spec.enums)
    for name, values in spec.enums.items():
        descriptor: EnumDescriptor = generated[name]
        assert descriptor.full_name == spec.full(name)
        assert {v.name: v.number for v in descriptor.values} == values


@pytest.mark.parametrize("spec", FILES, ids=FILE_IDS)
def test_services(spec: ProtoFile) -> None:
    generated = file_descriptor(spec).services_by_name
    assert set(generated) == {s.name for s in spec.services}
    for service in spec.services:
        descriptor = generated[service.name]
        assert descriptor.full_name == spec.full(service.name)
        assert [m.name for m in descriptor.methods] == [m.name for m in service.methods]
        for expected in service.methods:
            method = descriptor.methods_by_name[expected.name]
            assert method.input_type.full_name == expected.input
            assert method.output_type.full_name == expected.output
            assert method.client_streaming == expected.client_streaming
            assert method.server_streaming == expected.server_streaming


def test_method_paths_match_fact_sheet() -> None:
    paths = {
        f"/{service.full_name}/{method.name}"
        for spec in FILES
        for service in file_descriptor(spec).services_by_name.values()
        for method in service.methods
    }
    assert paths == METHOD_PATHS


# --- generated → table: nothing extra -------------------------------------------------


@pytest.mark.parametrize("spec", FILES, ids=FILE_IDS)
def test_no_unexpected_messages_or_fields(spec: ProtoFile) -> None:
    descriptor = file_descriptor(spec)
    assert set(descriptor.message_types_by_name) == set(spec.messages)
    assert not descriptor.extensions_by_name
    for name, msg in descriptor.message_types_by_name.items():
        expected = {f.name: f.number for f in spec.messages[name]}
        assert {f.name: f.number for f in msg.fields} == expected, msg.full_name
        assert not msg.enum_types, f"{msg.full_name} has nested enums"
        assert not msg.extensions
        # The only nested messages allowed are the synthetic map entries of
        # this message's own map fields.
        entries = {e.full_name for f in msg.fields if (e := map_entry(f)) is not None}
        assert {n.full_name for n in msg.nested_types} == entries, msg.full_name
        real_oneofs = [o.name for o in msg.oneofs if len(o.fields) != 1]
        assert not real_oneofs, f"{msg.full_name} has oneofs {real_oneofs}"


# --- the gRPC layer uses the same paths and streaming kinds ----------------------------


class RecordingChannel:
    """Stands in for ``grpc.Channel``: records which multicallables a stub asks for."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __getattr__(self, kind: str) -> Callable[..., object]:
        if kind not in {"unary_unary", "unary_stream", "stream_unary", "stream_stream"}:
            raise AttributeError(kind)

        def multicallable(path: str, **_: object) -> object:
            self.calls.append((kind, path))
            return object()

        return multicallable


class RecordingServer:
    """Stands in for ``grpc.Server``: records the handlers a servicer registers."""

    def __init__(self) -> None:
        self.registered: dict[str, dict[str, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.registered[service] = handlers


def _kind(method: Method) -> str:
    return (
        f"{'stream' if method.client_streaming else 'unary'}_"
        f"{'stream' if method.server_streaming else 'unary'}"
    )


@pytest.mark.parametrize("spec", FILES, ids=FILE_IDS)
def test_client_stub_dials_expected_paths(spec: ProtoFile) -> None:
    module = grpc_module(spec)
    for service in spec.services:
        channel = RecordingChannel()
        getattr(module, f"{service.name}Stub")(channel)
        expected = {(_kind(m), f"/{spec.full(service.name)}/{m.name}") for m in service.methods}
        assert set(channel.calls) == expected


@pytest.mark.parametrize("spec", FILES, ids=FILE_IDS)
def test_servicer_registers_expected_handlers(spec: ProtoFile) -> None:
    module = grpc_module(spec)
    for service in spec.services:
        server = RecordingServer()
        servicer = getattr(module, f"{service.name}Servicer")()
        getattr(module, f"add_{service.name}Servicer_to_server")(servicer, server)
        assert set(server.registered) == {spec.full(service.name)}
        handlers = server.registered[spec.full(service.name)]
        assert set(handlers) == {m.name for m in service.methods}
        for method in service.methods:
            handler = handlers[method.name]
            assert handler.request_streaming == method.client_streaming
            assert handler.response_streaming == method.server_streaming


# --- presence really reaches the wire ----------------------------------------------------


def test_v1_share_id_presence_on_the_wire() -> None:
    from dra_driver._gen.dra.v1 import api_pb2 as v1

    # An empty but *set* share_id is encoded (field 5, length-delimited, 0
    # bytes); an unset one is not. A kubelet tells "no share" from "share ''".
    assert v1.Device(share_id="").SerializeToString() == b"\x2a\x00"
    assert v1.Device().SerializeToString() == b""
    parsed = v1.Device.FromString(b"\x2a\x00")
    assert parsed.HasField("share_id")
    assert not v1.Device().HasField("share_id")


def test_v1beta1_reads_v1_share_id_as_unknown_field() -> None:
    from dra_driver._gen.dra.v1 import api_pb2 as v1
    from dra_driver._gen.dra.v1beta1 import api_pb2 as v1beta1

    blob = v1.Device(device_name="gpu-0", share_id="s1").SerializeToString()
    old = v1beta1.Device.FromString(blob)
    assert old.device_name == "gpu-0"
    # Unknown field 5 is kept and written back unchanged.
    assert old.SerializeToString() == blob
