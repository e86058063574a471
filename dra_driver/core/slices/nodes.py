"""Which nodes a ResourceSlice and its devices are for (pure): the node-selection rules.

A slice names exactly one of ``nodeName``, ``nodeSelector``, ``allNodes`` and
``perDeviceNodeSelection``; with the last, each device names exactly one of
``nodeName``, ``nodeSelector`` and ``allNodes``, and without it none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.base.names import dns_subdomain
from dra_driver.core.settings import Capabilities
from dra_driver.core.slices.grammar import Problems, as_mapping


def check_node_selection(
    spec: Mapping[str, Any], caps: Capabilities, path: str, found: Problems
) -> None:
    chosen: list[str] = []
    if "nodeName" in spec and spec["nodeName"] is not None:
        node_name = spec["nodeName"]
        if node_name == "":
            found.add(f"{path}.nodeName", "must be either unset or a non-empty string")
        elif problem := dns_subdomain(node_name):
            found.add(f"{path}.nodeName", problem)
            chosen.append("nodeName")
        else:
            chosen.append("nodeName")
    if spec.get("nodeSelector") is not None:
        chosen.append("nodeSelector")
        _check_node_selector(spec["nodeSelector"], f"{path}.nodeSelector", found)
    for flag in ("allNodes", "perDeviceNodeSelection"):
        if flag in spec and spec[flag] is not None:
            if spec[flag] is True:
                chosen.append(flag)
            else:
                found.add(f"{path}.{flag}", "must be either unset or true")
    if len(chosen) != 1:
        found.add(
            path,
            "exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection is required"
            + (f", but {', '.join(chosen)} are set" if chosen else ""),
        )
    if spec.get("perDeviceNodeSelection") is True and not caps.partitionable_devices:
        found.add(
            f"{path}.perDeviceNodeSelection",
            "set, but this cluster drops it (DRAPartitionableDevices off)",
        )


def _check_node_selector(selector: object, path: str, found: Problems) -> None:
    selector_map = as_mapping(selector, path, found)
    if selector_map is None:
        return
    terms = selector_map.get("nodeSelectorTerms")
    if not isinstance(terms, list | tuple) or len(terms) != 1:
        found.add(f"{path}.nodeSelectorTerms", "must have exactly one node selector term")


def check_device_nodes(
    device: Mapping[str, Any], per_device_nodes: bool, path: str, found: Problems
) -> None:
    chosen = [f for f in ("nodeName", "nodeSelector", "allNodes") if device.get(f) is not None]
    if not per_device_nodes:
        if chosen:
            found.add(path, f"{', '.join(chosen)} only allowed with perDeviceNodeSelection")
        return
    if device.get("nodeName") == "":
        found.add(f"{path}.nodeName", "must not be empty")
    if device.get("allNodes") is False:
        found.add(f"{path}.allNodes", "must be either unset or true")
    if device.get("nodeSelector") is not None:
        _check_node_selector(device["nodeSelector"], f"{path}.nodeSelector", found)
    if len(chosen) != 1:
        found.add(
            path,
            "exactly one of nodeName, nodeSelector, allNodes is required"
            " with perDeviceNodeSelection",
        )
