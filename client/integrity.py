"""Answer to the CUDA runtime's private integrity check.

The runtime (libcudart) fetches the driver's export table d4082055-bde6-704b-8d34-ba123c66e1f2 and calls
slot 1 to prove it is talking to a genuine driver.  The expected answer covers the calling process's own
addresses, pid and thread, so the client computes it locally instead of asking the remote server.

For the two "legacy" versions (``version % 10`` of 0 or 1) the answer is a fixed constant; otherwise it is
HMAC-MD2 over a little-endian record of the driver version, the caller's identity, the table and function
addresses, the current time and each device's UUID and PCI location.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DeviceId", "md2", "hmac_md2", "integrity_answer"]

# RFC 1319 S-table: a permutation of 0..255 derived from the digits of pi.
_S = bytes([
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19,
    98, 167, 5, 243, 192, 199, 115, 140, 152, 147, 43, 217, 188, 76, 130, 202,
    30, 155, 87, 60, 253, 212, 224, 22, 103, 66, 111, 24, 138, 23, 229, 18,
    190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47, 238, 122,
    169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33,
    128, 127, 93, 154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3,
    255, 25, 48, 179, 72, 165, 181, 209, 215, 94, 146, 42, 172, 86, 170, 198,
    79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4, 241,
    69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2,
    27, 96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15,
    85, 71, 163, 35, 221, 81, 175, 58, 195, 92, 249, 206, 186, 197, 234, 38,
    44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205, 244, 65, 129, 77, 82,
    106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57,
    242, 239, 183, 14, 102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10,
    49, 68, 80, 180, 143, 237, 31, 26, 219, 153, 141, 51, 159, 17, 131, 20,
])  # fmt: skip

_BLOCK = 16
_KEY = bytes.fromhex("146addae53a9a752aa0841360bf55a9f")
_LEGACY_ANSWER = (0x8ED383AA1F4CD1E83341181C03CB675C).to_bytes(16, "little")
_HEADER = struct.Struct("<IIIIQQQQ")
_DEVICE = struct.Struct("<16sIII")


@dataclass(frozen=True)
class DeviceId:
    """What the integrity answer records about one device."""

    uuid: bytes
    pci_domain: int
    pci_bus: int
    pci_device: int


def _pad(data: bytes) -> bytes:
    n = _BLOCK - len(data) % _BLOCK
    return data + bytes([n]) * n


def _checksum(data: bytes) -> bytes:
    c = bytearray(_BLOCK)
    last = 0
    for i in range(0, len(data), _BLOCK):
        for j in range(_BLOCK):
            c[j] ^= _S[data[i + j] ^ last]
            last = c[j]
    return bytes(c)


def _compress(x: bytearray, block: bytes) -> None:
    for j in range(_BLOCK):
        x[16 + j] = block[j]
        x[32 + j] = block[j] ^ x[j]
    t = 0
    for r in range(18):
        for k in range(48):
            x[k] ^= _S[t]
            t = x[k]
        t = (t + r) & 0xFF


def md2(data: bytes) -> bytes:
    """MD2 digest (RFC 1319) of ``data``; hashlib no longer offers it."""
    padded = _pad(bytes(data))
    padded += _checksum(padded)
    x = bytearray(48)
    for i in range(0, len(padded), _BLOCK):
        _compress(x, padded[i : i + _BLOCK])
    return bytes(x[:_BLOCK])


def hmac_md2(key: bytes, msg: bytes) -> bytes:
    """HMAC (RFC 2104) over MD2, block size 16."""
    if len(key) > _BLOCK:
        key = md2(key)
    key = key.ljust(_BLOCK, b"\0")
    inner = md2(bytes(b ^ 0x36 for b in key) + msg)
    return md2(bytes(b ^ 0x5C for b in key) + inner)


def _message(version: int, unix_seconds: int, *, driver_version: int, pid: int, thread: int,
             cudart_table: int, integrity_table: int, function: int, devices: Sequence[DeviceId]) -> bytes:
    head = _HEADER.pack(driver_version & 0xFFFFFFFF, version & 0xFFFFFFFF, pid & 0xFFFFFFFF,
                        thread & 0xFFFFFFFF, cudart_table, integrity_table, function, unix_seconds)
    body = b"".join(_DEVICE.pack(d.uuid, d.pci_domain, d.pci_bus, d.pci_device) for d in devices)
    return head + body


def integrity_answer(version: int, unix_seconds: int, *, driver_version: int, pid: int, thread: int,
                     cudart_table: int, integrity_table: int, function: int,
                     devices: Sequence[DeviceId]) -> bytes:
    """The 16 bytes slot 1 of the integrity table writes back to the runtime.

    ``thread`` is the caller's ``pthread_self()`` (truncated to 32 bits), not its kernel tid;
    ``cudart_table`` and ``integrity_table`` are the addresses of the CUDART_INTERFACE and integrity
    export tables handed to the runtime, and ``function`` is the address of slot 1 itself.
    """
    if version % 10 == 0:
        return _LEGACY_ANSWER
    if version % 10 == 1:
        return _LEGACY_ANSWER[:7] + b"\x18" + _LEGACY_ANSWER[8:]
    msg = _message(version, unix_seconds, driver_version=driver_version, pid=pid, thread=thread,
                   cudart_table=cudart_table, integrity_table=integrity_table, function=function,
                   devices=devices)
    return hmac_md2(_KEY, msg)
