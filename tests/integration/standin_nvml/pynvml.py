"""A stand-in ``pynvml`` (nvidia-ml-py) for machines without an NVIDIA driver: NVML as a node's
driver would answer it, for the GPUs a JSON file describes (`standin_pynvml.write_node` writes it).

Put this directory first on ``PYTHONPATH`` (the launch forwards it to the ranks) and point
``GPUCLUSTER_STANDIN_NVML`` at the node's description (``{host}`` is replaced by the hostname, so
one template serves every namespace node). The file is read again on every call, so a test can
change a node between two readings:

- ``gpus``: each GPU's ``name``, ``uuid``, ``bus_id`` (``00000000:18:00.0``) and ``memory_bytes``;
  its counters read as a healthy GPU's (no ECC error, no retired page, no remapped row, ECC on);
- ``lost``: bus ids of GPUs that fell off the bus: looking one up, or calling NVML on a handle of
  it, raises ``NVMLError_GpuIsLost`` (NVML_ERROR_GPU_IS_LOST, 15), as the driver's NVML does;
- ``gpus[i].recovery_action``: the GPU's current ``nvmlDeviceGpuRecoveryAction_t`` code, answered as
  the field value ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (and by ``nvmlDeviceGetGpuRecoveryAction``
  where the installed nvidia-ml-py has that function); absent, the field's own status is
  ``NVML_ERROR_NOT_SUPPORTED``, as a driver before the field answers. Every other field is too;
- ``xid_queue``: a file of JSON lines ``{"device": <index>, "xid": <n>}`` (``{host}`` replaced):
  ``nvmlEventSetWait`` delivers the first line as an XID event and removes it, else times out.

The error classes and constants are the installed nvidia-ml-py's own (loaded beside this module,
under another name), so an error here has the real class, code and message. An NVML function this
stand-in does not answer raises ``NVMLError_NotSupported``, as a GPU without that feature does;
a node with no description is a node without a driver (``NVMLError_DriverNotLoaded`` at init).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import socket
import sys
import time
from types import SimpleNamespace
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load_real() -> Any:
    """The installed nvidia-ml-py, as module ``_pynvml_real`` (its error classes name themselves
    through ``sys.modules[__name__]``, so it is registered before it runs)."""
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    found = importlib.machinery.PathFinder.find_spec("pynvml", paths)
    spec = (
        importlib.util.spec_from_file_location("_pynvml_real", found.origin)
        if found and found.origin
        else None
    )
    if spec is None or spec.loader is None:
        raise ImportError(
            "the stand-in pynvml needs the real nvidia-ml-py installed (pip install nvidia-ml-py)"
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules["_pynvml_real"] = module
    spec.loader.exec_module(module)
    return module


_real = _load_real()
NVMLError = _real.NVMLError
NVMLError_GpuIsLost = _real.NVMLError_GpuIsLost
NVMLError_NotSupported = _real.NVMLError_NotSupported
NVMLError_Timeout = _real.NVMLError_Timeout
nvmlEventTypeXidCriticalError = _real.nvmlEventTypeXidCriticalError


def __getattr__(name: str) -> Any:
    """Constants and classes from the real module; its other functions as NotSupported."""
    value = getattr(_real, name)
    if name.startswith("nvml") and callable(value) and not isinstance(value, type):

        def not_supported(*args: Any, **kwargs: Any) -> Any:
            raise NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)

        return not_supported
    return value


def _path(template: str) -> str:
    return template.replace("{host}", socket.gethostname())


def node() -> dict[str, Any] | None:
    """This host's description, or None (no driver here)."""
    template = os.environ.get("GPUCLUSTER_STANDIN_NVML")
    if not template or not os.path.exists(_path(template)):
        return None
    with open(_path(template), encoding="utf-8") as handle:
        return json.load(handle)


def _node() -> dict[str, Any]:
    found = node()
    if found is None:
        raise NVMLError(_real.NVML_ERROR_UNINITIALIZED)
    return found


def _gpu(handle: int) -> dict[str, Any]:
    described = _node()
    gpus = described["gpus"]
    if not isinstance(handle, int) or not 0 <= handle < len(gpus):
        raise NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
    if gpus[handle]["bus_id"].lower() in {b.lower() for b in described.get("lost", ())}:
        raise NVMLError(_real.NVML_ERROR_GPU_IS_LOST)
    return gpus[handle]


# --------------------------------------------------------------------------------- system


def nvmlInit() -> None:
    if node() is None:
        raise NVMLError(_real.NVML_ERROR_DRIVER_NOT_LOADED)


def nvmlInitWithFlags(flags: int) -> None:
    nvmlInit()


def nvmlShutdown() -> None:
    pass


def nvmlSystemGetDriverVersion() -> str:
    return str(_node().get("driver", "580.159.04"))


def nvmlSystemGetCudaDriverVersion() -> int:
    return int(_node().get("cuda_driver", 13000))


def nvmlSystemGetProcessName(pid: int) -> str:
    raise NVMLError(_real.NVML_ERROR_NOT_FOUND)


# --------------------------------------------------------------------------------- devices


def nvmlDeviceGetCount() -> int:
    return len(_node()["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    _gpu(int(index))
    return int(index)


def nvmlDeviceGetHandleByPciBusId(bus_id: str | bytes) -> int:
    text = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
    for index, gpu in enumerate(_node()["gpus"]):
        if gpu["bus_id"].lower() == text.lower():
            return nvmlDeviceGetHandleByIndex(index)
    raise NVMLError(_real.NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> int:
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    for index, gpu in enumerate(_node()["gpus"]):
        if gpu["uuid"] == text:
            return nvmlDeviceGetHandleByIndex(index)
    raise NVMLError(_real.NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetName(handle: int) -> str:
    return str(_gpu(handle)["name"])


def nvmlDeviceGetUUID(handle: int) -> str:
    return str(_gpu(handle)["uuid"])


def nvmlDeviceGetPciInfo(handle: int) -> Any:
    return SimpleNamespace(busId=str(_gpu(handle)["bus_id"]).encode())


def nvmlDeviceGetMemoryInfo(handle: int) -> Any:
    total = int(_gpu(handle)["memory_bytes"])
    return SimpleNamespace(total=total, free=total, used=0)


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[Any]:
    _gpu(handle)
    return []


def nvmlDeviceGetTotalEccErrors(handle: int, error_type: int, counter_type: int) -> int:
    _gpu(handle)
    return 0


def nvmlDeviceGetRetiredPages(handle: int, cause: int) -> list[int]:
    _gpu(handle)
    return []


def nvmlDeviceGetRemappedRows(handle: int) -> tuple[int, int, int, int]:
    _gpu(handle)
    return (0, 0, 0, 0)


def nvmlDeviceGetEccMode(handle: int) -> tuple[int, int]:
    _gpu(handle)
    return (1, 1)  # NVML_FEATURE_ENABLED, current and pending


def nvmlDeviceGetFieldValues(handle: int, field_ids: list[Any]) -> Any:
    """The real ``nvmlFieldValue_t`` array, as the driver fills it: a value per field, each with its
    own status; only ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` is answered (``gpus[i].recovery_action``)."""
    gpu = _gpu(handle)
    values = (_real.c_nvmlFieldValue_t * len(field_ids))()
    for value, field in zip(values, field_ids, strict=True):
        value.fieldId, value.scopeId = field if isinstance(field, tuple) else (field, 0)
        value.timestamp = int(time.time() * 1e6)
        code = gpu.get("recovery_action")
        if value.fieldId == _real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and code is not None:
            value.valueType, value.nvmlReturn = _real.NVML_VALUE_TYPE_UNSIGNED_INT, _real.NVML_SUCCESS
            value.value.uiVal = int(code)
        else:
            value.nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
    return values


if hasattr(_real, "nvmlDeviceGetGpuRecoveryAction"):  # only where the real binding has it

    def nvmlDeviceGetGpuRecoveryAction(handle: int) -> int:
        code = _gpu(handle).get("recovery_action")
        if code is None:
            raise NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return int(code)


# --------------------------------------------------------------------------------- XID events


class _Event:
    def __init__(self, device: int, xid: int) -> None:
        self.device, self.eventData = device, xid
        self.eventType = nvmlEventTypeXidCriticalError


def nvmlEventSetCreate() -> object:
    _node()
    return object()


def nvmlDeviceRegisterEvents(handle: int, types: int, event_set: object) -> None:
    _gpu(handle)
    if types != nvmlEventTypeXidCriticalError:
        raise NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)


def nvmlEventSetFree(event_set: object) -> None:
    pass


def nvmlEventSetWait(event_set: object, timeout_ms: int) -> _Event:
    queue = _node().get("xid_queue")
    if queue and os.path.exists(_path(queue)):
        with open(_path(queue), encoding="utf-8") as handle:
            lines = [line for line in handle.read().splitlines() if line.strip()]
        if lines[1:]:
            with open(_path(queue), "w", encoding="utf-8") as handle:
                handle.write("".join(line + "\n" for line in lines[1:]))
        else:
            os.remove(_path(queue))
        if lines:
            event = json.loads(lines[0])
            return _Event(int(event.get("device", 0)), int(event["xid"]))
    time.sleep(min(timeout_ms, 500) / 1000 / 10)
    raise NVMLError(_real.NVML_ERROR_TIMEOUT)


nvmlEventSetWait_v2 = nvmlEventSetWait
