"""Health signals from NVML: XID/ECC events on a thread of their own, and the liveness probe.

Events
    On first use, an event set registered for XID and double-bit ECC events
    on every GPU that supports them; a double-bit ECC event is reported as XID
    48, the XID the driver logs for it. (Single-bit errors are corrected by the
    hardware and not asked for; XID 92 reports an excessive rate.) An event's
    MIG device is found among the MIG devices the latest inventory saw. A
    failing wait is reported once as an event (xid 0) for every GPU; the
    streams end at :meth:`HealthEvents.stop`, or if the event thread dies
    (the caller's supervisor sees it).

    ``nvmlEventSetWait_v2`` blocks for up to ``poll_ms`` at a time, so it runs
    on a thread of its own, not the serialised NVML thread. That is safe
    because NVML is thread-safe and the event thread calls NVML only on its
    event set, which it owns from registration until :meth:`HealthEvents.release`
    has joined it; only then is the set freed. The event thread checks a stop
    flag after every wait, so stopping takes at most about one ``poll_ms``.

Probe
    :func:`probe_gpu`: a GPU's handle by UUID and its temperature: a sensor
    read that reaches the GPU, so one that fell off the bus answers
    ``NVMLError_GpuIsLost`` and one that needs a reset ``NVMLError_ResetRequired``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

from dra_driver.base.errors import InventoryError
from dra_driver.base.ids import GpuUUID, MigUUID
from dra_driver.core.model import HealthEvent
from dra_driver.gpu.nvml.calls import ABSENT, NvmlCalls, handle_key, log

_NO_INSTANCE: Final = 0xFFFFFFFF
"""gpuInstanceId/computeInstanceId of an event NVML does not attribute to a MIG device."""
_DBE_XID: Final = 48
"""The XID the driver logs for a double-bit ECC error (NVIDIA's XID catalog)."""

Subscriber = tuple[asyncio.AbstractEventLoop, asyncio.Queue[HealthEvent | None]]
MigKey = tuple[GpuUUID, int, int]
"""(GPU, GPU instance id, compute instance id) of a MIG device."""


# docs/nvidia-interfaces.md: nvml-events
class HealthEvents:
    """The event set, the event thread, and every consumer's stream of events.

    ``mig_uuids`` returns the MIG devices of the latest inventory (a map the
    backend replaces whole, never mutates).
    """

    def __init__(
        self,
        nvml: NvmlCalls,
        *,
        poll_ms: int,
        mig_uuids: Callable[[], Mapping[MigKey, MigUUID]],
    ) -> None:
        self._nvml = nvml
        self._lib: Any = nvml.lib
        self._poll_ms = poll_ms
        self._mig_uuids = mig_uuids
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._event_set: Any = None
        self._subscribers: list[Subscriber] = []
        self._subscribers_lock = threading.Lock()
        self._ended = False  # no more events: stopped, or the event thread failed

    def subscribe(self, subscriber: Subscriber) -> bool:
        """Add a consumer; False (and not added) once the streams have ended."""
        with self._subscribers_lock:
            if self._ended:
                return False
            self._subscribers.append(subscriber)
        return True

    def unsubscribe(self, subscriber: Subscriber) -> None:
        with self._subscribers_lock:
            self._subscribers.remove(subscriber)

    def start(self) -> None:
        """Register for events and start the event thread, the first time only (NVML thread)."""
        if self._watcher is not None:
            return
        self._nvml.ensure_init()
        event_set = self._nvml.call("NVML", "nvmlEventSetCreate")
        try:
            gpus = self._register(event_set)
        except BaseException:
            self._free_event_set(event_set)
            raise
        self._event_set = event_set
        self._watcher = threading.Thread(
            target=self._watch, args=(event_set, gpus), name="nvml-events", daemon=True
        )
        self._watcher.start()

    def stop(self) -> None:
        """Tell the event thread to stop, and end every stream (any thread)."""
        self._stop.set()
        self._end_streams()

    def release(self) -> None:
        """Join the stopped event thread and free its event set (NVML thread)."""
        watcher = self._watcher
        if watcher is not None:
            watcher.join(2 * self._poll_ms / 1000 + 0.5)
            if watcher.is_alive():
                log.warning("the NVML event thread did not stop; its event set is left allocated")
            else:
                self._free_event_set(self._event_set)

    def _register(self, event_set: Any) -> dict[int | None, GpuUUID]:
        lib = self._lib
        nvml = self._nvml
        wanted = lib.nvmlEventTypeXidCriticalError | lib.nvmlEventTypeDoubleBitEccError
        skip = (lib.NVMLError_NotSupported, lib.NVMLError_GpuIsLost)
        gpus: dict[int | None, GpuUUID] = {}
        for index in range(nvml.call("NVML", "nvmlDeviceGetCount")):
            handle, uuid, where = nvml.handle(index)
            supported = nvml.call(where, "nvmlDeviceGetSupportedEventTypes", handle, tolerate=skip)
            mask = 0 if supported is ABSENT else wanted & supported
            register = "nvmlDeviceRegisterEvents"
            if mask and nvml.call(where, register, handle, mask, event_set, tolerate=skip) is None:
                gpus[handle_key(handle)] = uuid
            else:
                log.warning("%s: XID/ECC events are not available; no health events from it", where)
        return gpus

    def _free_event_set(self, event_set: Any) -> None:
        try:
            self._lib.nvmlEventSetFree(event_set)
        except self._lib.NVMLError as err:
            log.warning("nvmlEventSetFree failed: %s", err)

    # -- the event thread ---------------------------------------------------

    def _watch(self, event_set: Any, gpus: dict[int | None, GpuUUID]) -> None:
        lib = self._lib
        failing = False
        try:
            while not self._stop.is_set():
                try:
                    data = lib.nvmlEventSetWait_v2(event_set, self._poll_ms)
                except lib.NVMLError_Timeout:
                    failing = False
                    continue
                except lib.NVMLError as err:
                    # As NVIDIA's device plugin does: a failing wait makes every GPU suspect.
                    if not failing:
                        log.error("nvmlEventSetWait_v2 failed: %s; reporting every GPU", err)
                        message = f"NVML event wait failed: {err}"
                        for gpu in gpus.values():
                            self._publish(HealthEvent(gpu_uuid=gpu, xid=0, message=message))
                    failing = True
                    self._stop.wait(self._poll_ms / 1000)
                    continue
                failing = False
                uuid = gpus.get(handle_key(data.device))
                if uuid is None:
                    log.warning("NVML event for a device we did not register; ignored")
                    continue
                event = self._health_event(uuid, data)
                if event is not None:
                    self._publish(event)
        except Exception:
            log.exception("the NVML event thread failed; no more health events")
        finally:
            self._end_streams()

    def _health_event(self, uuid: GpuUUID, data: Any) -> HealthEvent | None:
        lib = self._lib
        if data.eventType & lib.nvmlEventTypeXidCriticalError:
            xid, message = int(data.eventData), f"XID {int(data.eventData)}"
        elif data.eventType & lib.nvmlEventTypeDoubleBitEccError:
            xid, message = _DBE_XID, "double-bit ECC error"
        else:
            log.debug("GPU %s: NVML event type %#x ignored", uuid, data.eventType)
            return None
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        mig = None
        if gi != _NO_INSTANCE:
            # The MIG devices of that GPU instance (any, when no compute instance is named).
            found = [
                mig_uuid
                for (gpu, gi_id, ci_id), mig_uuid in self._mig_uuids().items()
                if gpu == uuid and gi_id == gi and ci in (ci_id, _NO_INSTANCE)
            ]
            mig = found[0] if len(found) == 1 else None
        return HealthEvent(gpu_uuid=uuid, xid=xid, message=message, mig_uuid=mig)

    def _end_streams(self) -> None:
        """End every consumer's stream, and those of consumers yet to come."""
        with self._subscribers_lock:
            self._ended = True
        self._publish(None)

    def _publish(self, item: HealthEvent | None) -> None:
        """Hand ``item`` to every consumer's loop (from any thread); None ends their streams."""
        with self._subscribers_lock:
            subscribers = list(self._subscribers)
        for loop, queue in subscribers:
            with contextlib.suppress(RuntimeError):  # that consumer's loop has closed
                loop.call_soon_threadsafe(queue.put_nowait, item)


# docs/nvidia-interfaces.md: nvml-probe
def probe_gpu(lib: Any, uuid: GpuUUID) -> str | None:
    """None when the GPU ``uuid`` answers a sensor read, else why not (NVML thread)."""
    unusable = (lib.NVMLError_LibraryNotFound, lib.NVMLError_DriverNotLoaded, OSError)
    try:
        handle = lib.nvmlDeviceGetHandleByUUID(uuid)
        lib.nvmlDeviceGetTemperature(handle, lib.NVML_TEMPERATURE_GPU)
    except (lib.NVMLError_NotSupported, lib.NVMLError_NoPermission):
        return None  # it answered, just not this question
    except lib.NVMLError_GpuIsLost as err:
        return f"{err}: it has fallen off the bus; it needs a reset or the node a reboot"
    except lib.NVMLError_ResetRequired as err:
        return f"{err}: it needs a GPU reset"
    except lib.NVMLError_NotFound:
        return "NVML no longer lists it (gone from the bus?)"
    except unusable as err:
        raise InventoryError(
            f"the GPU liveness probe cannot use NVML: {err}; check the NVIDIA driver"
        ) from err
    except lib.NVMLError as err:
        return f"nvmlDeviceGetTemperature failed: {err}"
    return None
