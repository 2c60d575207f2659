"""The worker's `init` answer, checked before the client believes any of it.

The client copies these fields into the application's memory (a 16-byte CUuuid, a name, attributes, PCI ids,
memory sizes, the driver version) and NVML hands them out too: one of the wrong type or size, from a
compromised server, a man in the middle of a plain session or a server's bug, would be written as it came.
So each is checked for its type and range when the inventory arrives, and a bad one fails the session's
start (cuInit) saying which field is wrong.
"""

from __future__ import annotations

from typing import Any

from xpuremote.protocol import errors
from xpuremote.protocol.errors import CudaError

from .marshal import shape

UUID_BYTES = 16  # a CUuuid
NAME_BYTES = 256  # cudaDeviceProp.name, its NUL included
MAX_DEVICES = 1024
MAX_ATTRIBUTES = 4096  # CUdevice_attribute has about 150
INT32 = (-(1 << 31), 1 << 31)  # what cuDeviceGetAttribute and cuDriverGetVersion write
PCI = (("domain", 1 << 32), ("bus", 1 << 8), ("device", 1 << 8))


class BadField(ValueError):
    """A field of the inventory that is not what the client may copy."""


def check(inventory: Any, server: str) -> dict[str, Any]:
    """The inventory as it came, once every field the client uses is what it may be; else CudaError
    (CUDA_ERROR_UNKNOWN: nothing the application passed is wrong) naming the field."""
    try:
        if type(inventory) is not dict:
            raise BadField(f"the answer is {type(inventory).__name__}, not a map")
        _int(inventory.get("driver_version"), "driver_version", 0, INT32[1])
        devices = inventory.get("devices")
        if type(devices) is not list or len(devices) > MAX_DEVICES:
            raise BadField(f"devices is {shape(devices)}, not a list of at most {MAX_DEVICES}")
        for i, device in enumerate(devices):
            _device(device, f"devices[{i}]")
    except BadField as exc:
        raise CudaError(errors.UNKNOWN, f"the server at {server} sent a device inventory this client refuses: "
                        f"{exc}") from None
    return inventory


def _device(device: Any, where: str) -> None:
    if type(device) is not dict:
        raise BadField(f"{where} is {shape(device)}, not a map")
    name = device.get("name")
    if type(name) is not str or "\0" in name or len(name.encode("utf-8", "replace")) >= NAME_BYTES:
        raise BadField(f"{where}.name is {shape(name)}, not a text of fewer than {NAME_BYTES} bytes")
    uuid = device.get("uuid")
    if type(uuid) is not bytes or len(uuid) != UUID_BYTES:
        raise BadField(f"{where}.uuid is {shape(uuid)}, not {UUID_BYTES} bytes")
    _int(device.get("total_mem"), f"{where}.total_mem", 0, 1 << 64)
    _int(device.get("sm"), f"{where}.sm", 0, INT32[1])
    attributes = device.get("attributes")
    if type(attributes) is not dict or len(attributes) > MAX_ATTRIBUTES:
        raise BadField(f"{where}.attributes is {shape(attributes)}, not a map of at most {MAX_ATTRIBUTES}")
    for key, value in attributes.items():
        _int(key, f"{where}.attributes key", 0, INT32[1])
        _int(value, f"{where}.attributes[{key}]", *INT32)
    pci = device.get("pci")
    if type(pci) is not list or len(pci) != len(PCI):
        raise BadField(f"{where}.pci is {shape(pci)}, not [domain, bus, device]")
    for value, (part, end) in zip(pci, PCI):
        _int(value, f"{where}.pci {part}", 0, end)
    refused = device.get("refused", [])
    if type(refused) is not list or len(refused) > MAX_ATTRIBUTES:
        raise BadField(f"{where}.refused is {shape(refused)}, not a list of at most {MAX_ATTRIBUTES}")
    for value in refused:
        _int(value, f"{where}.refused", 0, INT32[1])


def _int(value: Any, where: str, low: int, end: int) -> None:
    if type(value) is not int or not low <= value < end:
        raise BadField(f"{where} is {shape(value)}, not an integer in [{low}, {end})")
