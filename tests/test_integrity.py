"""The client's answer to the CUDA runtime's private integrity check."""

from __future__ import annotations

import hmac

import pytest

from xpuremote.client.integrity import DeviceId, hmac_md2, integrity_answer, md2

LEGACY = 0x8ED383AA1F4CD1E83341181C03CB675C


class _Md2:
    """Just enough of a hashlib object for the stdlib ``hmac`` module to use our MD2."""

    digest_size = 16
    block_size = 16

    def __init__(self, data: bytes = b"") -> None:
        self._data = bytes(data)

    def update(self, data: bytes) -> None:
        self._data += bytes(data)

    def copy(self) -> _Md2:
        return _Md2(self._data)

    def digest(self) -> bytes:
        return md2(self._data)


@pytest.mark.parametrize(("data", "digest"), [
    (b"", "8350e5a3e24c153df2275c9f80692773"),
    (b"a", "32ec01ec4a6dac72c0ab96fb34c0b5d1"),
    (b"abc", "da853b0d3f88d99b30283a69e6ded6bb"),
    (b"message digest", "ab4f496bfb2a530b219ff33031fe06b0"),
    (b"abcdefghijklmnopqrstuvwxyz", "4e8ddff3650292ab5a4108c3aa47940b"),
    (b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", "da33def2a42df13975352846c30338cd"),
    (b"1234567890" * 8, "d5976f79d83d3a0dc9806c3c66f3efd8"),
])
def test_md2_rfc1319_vectors(data: bytes, digest: str) -> None:
    assert md2(data).hex() == digest


@pytest.mark.parametrize("key", [b"", b"k", bytes(range(16)), bytes(range(40))])
@pytest.mark.parametrize("msg", [b"", b"what do ya want for nothing?", bytes(range(100))])
def test_hmac_md2_matches_stdlib_hmac(key: bytes, msg: bytes) -> None:
    assert hmac_md2(key, msg) == hmac.new(key, msg, _Md2).digest()


def test_hmac_md2_by_hand() -> None:
    key = bytes(range(16))
    inner = md2(bytes(b ^ 0x36 for b in key) + b"msg")
    assert hmac_md2(key, b"msg") == md2(bytes(b ^ 0x5C for b in key) + inner)


def _answer(version: int, **overrides: object) -> bytes:
    args: dict = dict(
        driver_version=12020, pid=0x4D08, thread=0x2B78, cudart_table=0x7FF8C80717F0,
        integrity_table=0x7FF8C825E4B0, function=0x7FF8C7DD0AD0,
        devices=[DeviceId(bytes.fromhex("6722cbcfc661f29274d6ed232a32131c"), 0, 4, 0)],
    )
    args.update(overrides)
    return integrity_answer(version, 0x64A365EE, **args)


@pytest.mark.parametrize("version", [0, 10, 12340])
def test_version_ending_in_0_is_constant(version: int) -> None:
    assert _answer(version) == LEGACY.to_bytes(16, "little")
    assert _answer(version, pid=1, devices=[]) == LEGACY.to_bytes(16, "little")


@pytest.mark.parametrize("version", [1, 11, 12341])
def test_version_ending_in_1_is_constant_with_byte_7_patched(version: int) -> None:
    expected = bytearray(LEGACY.to_bytes(16, "little"))
    expected[7] = 0x18
    assert _answer(version) == bytes(expected)


def test_measured_vector() -> None:
    out = _answer(0x2B4A)
    assert len(out) == 16
    assert int.from_bytes(out, "little") == 0xEAF1313342BFCD84A7C34628F214707A


def test_answer_depends_on_caller() -> None:
    base = _answer(0x2B4A)
    assert _answer(0x2B4A, thread=0x2B79) != base
    assert _answer(0x2B4A, devices=[]) != base
