"""The call table, the wire format, and the shim's cuGetProcAddress and cuGetExportTable."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from conftest import BACKEND, ROOT, shim_env

from xpuremote.protocol import calls, cuda_api, errors, wire
from xpuremote.protocol.calls import BY_OPCODE, CALLS, CLASSES, SPEC, SYMBOLS, TableError, family_of

# ---- the call table -------------------------------------------------------------------------------


def test_every_exported_symbol_has_a_call() -> None:
    assert len(SYMBOLS) > 500
    assert list(SYMBOLS) == sorted(set(SYMBOLS)), "SYMBOLS must be sorted and unique: index = shim op number"
    for symbol in SYMBOLS:
        call = CALLS[symbol]
        assert call.symbol == symbol and call.family == family_of(symbol)
        assert call.per_thread == symbol.endswith(("_ptds", "_ptsz"))
        assert call.cls in (*CLASSES, "unsupported"), (symbol, call.cls)
        assert len(call.params) == len(cuda_api.FUNCTIONS[symbol])
    libraries = {s for symbols in calls.LIBRARY_SYMBOLS.values() for s in symbols}
    internal = set(CALLS) - set(SYMBOLS) - libraries
    assert internal == set(calls.INTERNAL_FUNCTIONS), "only the client's own requests are not exported"
    assert all(name.startswith("xpu") for name in internal)


def test_every_math_library_symbol_has_a_call_of_its_library() -> None:
    from xpuremote.protocol import mathlibs

    for lib in mathlibs.LIBRARIES:
        symbols = calls.LIBRARY_SYMBOLS[lib.name]
        assert list(symbols) == sorted(mathlibs.api(lib).FUNCTIONS), "index = the replacement library's op number"
        for symbol in symbols:
            call = CALLS[symbol]
            assert call.library == lib.name and symbol.startswith(lib.prefix)
    # without an annotation a library's data pointer is a device address, never read by the client
    sgemm = {p.name: p for p in CALLS["cublasSgemm_v2"].params}
    assert all(sgemm[n].is_address for n in "ABC") and sgemm["alpha"].is_scalar and sgemm["lda"].kind != "ptr"
    bn = {p.name: p for p in CALLS["cudnnBatchNormalizationForwardTrainingEx"].params}
    assert bn["xData"].is_address and bn["alpha"].count == "scalar:xDesc" and bn["xDesc"].kind == "handle"
    gemm = CALLS["cublasGemmEx"]
    assert gemm.cls == "async" and [p.count for p in gemm.params if p.name in ("alpha", "A", "C")] == [
        "scalar:computeType", "device", "device"]


def test_every_variant_is_an_exported_symbol() -> None:
    for (name, version, per_thread), symbol in cuda_api.VARIANTS.items():
        assert symbol in CALLS, (name, version, symbol)
        assert CALLS[symbol].per_thread == bool(per_thread), (name, version, symbol)
        assert version >= 2000


def test_opcodes_are_unique_and_stable() -> None:
    assert len(BY_OPCODE) == len(CALLS)
    for symbol, call in CALLS.items():
        assert call.opcode == zlib.crc32(symbol.encode()) & 0x7FFFFFFF
        assert BY_OPCODE[call.opcode] is call


def test_every_spec_family_is_exported_with_its_class() -> None:
    rows = calls._parse_spec(SPEC)
    by_family: dict[str, set[str]] = {}
    for call in CALLS.values():
        by_family.setdefault(call.family, set()).add(call.cls)
    for family, (cls, _) in rows.items():
        assert by_family.get(family) == {cls}, (family, cls, by_family.get(family))
    assert {c.cls for c in CALLS.values() if c.family not in rows and c.symbol in SYMBOLS} == {"unsupported"}


def test_parameter_annotations_are_consistent() -> None:
    for call in CALLS.values():
        names = set(call.names)
        assert len(names) == len(call.params), f"{call.symbol}: duplicate parameter names"
        for p in call.params:
            assert p.direction in ("in", "out", "inout")
            if p.kind != "ptr":
                assert p.direction == "in" and p.count is None, (call.symbol, p)
            if p.count in (None, "str", "*", "device", "ref") or p.count.isdigit():
                continue
            for ref in re.split(r"\s*\*\s*", p.count.removeprefix("scalar").lstrip(":")):
                if not ref:  # a scalar sized by its own type
                    continue
                assert ref.isdigit() or ref == "each" or ref in names, (call.symbol, p.name, p.count)
        if call.cls == "async":
            outs = [p for p in call.outputs if p.pointee != "handle"]
            assert not outs or call.family in calls.ASYNC_WITH_OUTPUTS, (call.symbol, outs)
    # spot checks of what the table says
    htod = CALLS["cuMemcpyHtoD_v2"]
    assert htod.cls == "sync" and htod.params[1].direction == "in" and htod.params[1].count == "ByteCount"
    assert CALLS["cuMemcpyDtoH_v2"].outputs[0].count == "ByteCount"
    assert CALLS["cuMemcpyHtoDAsync_v2_ptsz"].per_thread and CALLS["cuMemcpyHtoDAsync_v2_ptsz"].cls == "async"
    assert CALLS["cuStreamCreate"].cls == "shadow" and CALLS["cuStreamCreate"].params[0].pointee == "handle"


def test_rebuilding_the_table_gives_the_same_calls() -> None:
    driver = calls._build(SPEC + calls._INTERNAL_SPEC)
    assert driver == {s: c for s, c in CALLS.items() if c.library == "cuda"}


@pytest.mark.parametrize(("spec", "message"), [
    ("cuMemAlloc bogus", r"line 1: class 'bogus' of cuMemAlloc is not one of"),
    ("cuMemAlloc", r"line 1: cuMemAlloc has no class"),
    ("# comment\n\ncuMemAlloc sync\ncuMemAlloc local", r"line 4: cuMemAlloc is listed twice"),
    ("cuMemcpyHtoD sync srcHost=sideways:ByteCount", r"line 1: 'srcHost=sideways:ByteCount': direction must"),
    ("cuMemcpyHtoD sync srcHost", r"line 1: 'srcHost': direction must be"),
])
def test_parse_spec_errors(spec: str, message: str) -> None:
    with pytest.raises(TableError, match=message):
        calls._parse_spec(spec)


def test_parse_spec_reads_annotations() -> None:
    rows = calls._parse_spec("cuFoo sync a=out:n*m b=str c=inout d=out?  # trailing comment\n  # only a comment\n")
    assert rows == {"cuFoo": ("sync", {"a": ("out", "n*m", False), "b": ("in", "str", False),
                                       "c": ("inout", None, False), "d": ("out", None, True)})}


@pytest.mark.parametrize(("spec", "message"), [
    ("cuNoSuchFunction sync", r"cuNoSuchFunction is not a driver function \(check its spelling\)"),
    ("cuMemalloc sync", r"cuMemalloc is not a driver function"),
    ("cuMemAlloc sync nosuch=in:8", r"cuMemAlloc has no parameter 'nosuch' \(has \['bytesize', 'dptr'\]\)"),
    ("cuMemcpyHtoD sync srcHost=in:Bogus", r"cuMemcpyHtoD\.srcHost counts by 'Bogus', not a parameter"),
    ("cuMemcpyDtoH async dstHost=out:ByteCount", r"cuMemcpyDtoH\w* is async but has outputs: make it sync"),
])
def test_build_errors(spec: str, message: str) -> None:
    with pytest.raises(TableError, match=message):
        calls._build(spec)


def test_internal_declaration_errors() -> None:
    with pytest.raises(TableError, match="INTERNAL: cannot read 'not a declaration'"):
        calls._internal_functions("not a declaration")
    declaration = "xpuThing(CUstream s, const void *data, size_t n) async data=in:n"
    functions, rows = calls._internal_functions(declaration)
    assert functions == {"xpuThing": (("CUstream", "s"), ("const void *", "data"), ("size_t", "n"))}
    assert rows == "xpuThing async data=in:n"


# ---- the wire format -----------------------------------------------------------------------------


def test_wire_round_trip() -> None:
    header = {"op": "calls", "seq": 7, "reply": True, "calls": [
        [CALLS["cuMemAlloc_v2"].opcode, [8, 2**64 - 1]],
        [1, [-(2**63), 0.5, None, True, "text", b"\x00\xff", [[]]]],
    ], "map": {1: "int key", "k": {"nested": [1, 2]}}}
    frames = wire.encode(header)
    assert len(frames) == 1
    decoded = wire.decode(frames)
    assert decoded == {"v": wire.PROTOCOL_VERSION, **header}


def test_wire_bulk_frames() -> None:
    small = bytearray(b"s" * wire.INLINE_MAX)  # at the limit: inline
    big = bytearray(range(256)) * 1024 + bytearray(b"tail")  # 256 KiB + 4: a frame of its own
    other = memoryview(b"o" * (wire.INLINE_MAX + 1))
    inline = bytes(wire.INLINE_MAX + 1)
    frames = wire.encode({"op": "calls", "a": [small, big], "b": {"x": other}, "c": inline})
    assert len(frames) == 3, "bytearray/memoryview over INLINE_MAX travel as frames; bytes stay inline"
    assert bytes(frames[1]) == bytes(big) and bytes(frames[2]) == bytes(other)
    assert len(frames[0]) < 3 * wire.INLINE_MAX
    decoded = wire.decode(frames)
    assert bytes(decoded["a"][0]) == bytes(small)
    assert isinstance(decoded["a"][1], memoryview) and bytes(decoded["a"][1]) == bytes(big)
    assert bytes(decoded["b"]["x"]) == bytes(other)
    assert decoded["c"] == inline
    # bytes marked with frame() go as frames too, in any mix with large bytearrays
    marked = bytes(range(256)) * 300
    frames = wire.encode({"op": "x", "m": wire.frame(marked), "b": [big], "s": wire.frame(b"tiny"),
                          "m2": wire.frame(marked[:-1])})
    assert len(frames) == 4
    decoded = wire.decode(frames)
    assert bytes(decoded["m"]) == marked and bytes(decoded["m2"]) == marked[:-1]
    assert bytes(decoded["b"][0]) == bytes(big) and decoded["s"] == b"tiny"


def test_wire_over_zeromq_without_copies() -> None:
    ctx = zmq.Context()
    try:
        a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        a.bind("inproc://wire-test")
        b.connect("inproc://wire-test")
        payload = bytearray(b"".join(b"%d," % i for i in range(20_000)))  # > 64 KiB
        a.send_multipart(wire.encode({"op": "calls", "data": payload, "n": len(payload)}), copy=False)
        assert b.poll(5000)
        frames = b.recv_multipart(copy=False)
        assert len(frames) == 2 and isinstance(frames[1], zmq.Frame)
        decoded = wire.decode(frames)
        assert decoded["n"] == len(payload) and bytes(decoded["data"]) == bytes(payload)
    finally:
        ctx.destroy(0)


def test_wire_refuses_what_it_cannot_carry() -> None:
    with pytest.raises(TypeError, match="cannot send object"):
        wire.encode({"op": "x", "thing": object()})
    with pytest.raises(TypeError):
        wire.encode({"op": "x", "thing": {1, 2}, "big": wire.frame(bytes(wire.INLINE_MAX + 1))})
    # the thread's packer is used again: what a refused message had packed, and its frames, are gone
    assert wire.decode(wire.encode({"op": "y", "n": 1})) == {"op": "y", "n": 1, "v": wire.PROTOCOL_VERSION}
    assert len(wire.encode({"op": "y"})) == 1


def test_sized_outputs_are_packed_as_the_generic_steps_pack_them() -> None:
    """The client packs a call whose pointers are all sized outputs (a copy to the host, a query) by a short
    path: for every such call of the table, it gives what the generic steps give, errors included."""
    from xpuremote.client import marshal

    values = [0, 0, 1, 2, 7, 4096, 1 << 40]
    checked = 0
    for call in CALLS.values():
        sized = marshal._sized_outputs(call)
        if sized is None:
            continue
        short = marshal._output_packer(call, sized)
        for n in range(12):
            args = [values[(n * 3 + 5 * i * (n + 1)) % len(values)] for i in range(len(call.params))]
            assert _packed(short, args, None, False) == _packed(_generic_pack, call, args), (call.symbol, args)
        checked += 1
    assert checked > 1000 and marshal._sized_outputs(CALLS["cuMemcpyDtoH_v2"]) is not None


def _generic_pack(call: calls.Call, args: list[Any]) -> tuple[list[Any], int]:
    from xpuremote.client import marshal

    named, out = dict(zip(call.names, args)), list(args)
    for i, p in enumerate(call.params):
        if p.kind == "ptr" and not p.is_address:
            out[i] = marshal._step(call, p)(args[i], named, None, False)[0]
    return out, 0


def _packed(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except errors.CudaError as exc:
        return exc.code, exc.detail


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _ext(data: bytes, code: int = wire.BULK) -> msgpack.ExtType:
    return msgpack.ExtType(code, data)


@pytest.mark.parametrize(("frames", "message"), [
    ([], "empty message"),
    ([b""], "undecodable header"),
    ([b"\xc1"], "undecodable header"),
    ([b"not msgpack at all, just text"], "undecodable header"),
    ([_pack({"v": 1, "op": "calls", "seq": 1})[:-2]], "undecodable header"),
    ([_pack({"v": 1, "op": "x"}) + b"\x00"], "undecodable header"),
    ([b"\xdd\xff\xff\xff\xff"], "undecodable header"),
    ([b"\x91" * 100_000 + b"\xc0"], "undecodable header"),
    ([_pack([1, 2])], "header is not a map"),
    ([_pack("hello")], "header is not a map"),
    ([_pack({"op": "x"})], r"protocol version None, this end speaks 1"),
    ([_pack({"v": 2, "op": "x"})], r"protocol version 2, this end speaks 1"),
    ([_pack({"v": "1", "op": "x"})], r"protocol version '1'"),
    ([_pack({"v": 1})], "header has no op"),
    ([_pack({"v": 1, "op": b"calls"})], "header has no op"),
    ([_pack({"v": 1, "op": "x", "d": _ext(b"\x00\x00\x00\x00")})], r"bulk frame 0 missing \(message has 0\)"),
    ([_pack({"v": 1, "op": "x", "d": _ext(b"\x01\x00\x00\x00")}), b"only one"], r"bulk frame 1 missing"),
    ([_pack({"v": 1, "op": "x", "d": _ext(b"\x00")}), b"frame"], "unknown ext type 1"),
    ([_pack({"v": 1, "op": "x", "d": _ext(b"\x00\x00\x00\x00", 5)}), b"frame"], "unknown ext type 5"),
])
def test_wire_decode_errors(frames: list[bytes], message: str) -> None:
    with pytest.raises(wire.WireError, match=message):
        wire.decode(frames)


def test_wire_decode_error_names_the_problem() -> None:
    with pytest.raises(wire.WireError) as info:
        wire.decode([b"\xc1"])
    assert len(str(info.value)) > len("undecodable header: "), "the reason is empty"


# ---- cuGetProcAddress and cuGetExportTable in the shim, through ctypes ----------------------------------

FACTS = ("cudart-13.0.96-getprocaddress.txt", "cudart-12.9.79-getprocaddress.txt")
INTEROP = re.compile(r"^cu(Graphics)?(GL|EGL|VDPAU)|Egl")  # graphics interop: not for a remote GPU
PROFILER = {"cuProfilerInitialize", "cuProfilerStart", "cuProfilerStop"}
NOT_FOUND = errors.NOT_FOUND

EXPORT_TABLES = {  # UUID bytes in memory order -> has a size in slot 0
    "6bd5fb6c5bf4e74a8987d93912fd9df9": True,  # CUDART_INTERFACE
    "a094798c2e742e7493f20800200c0a66": True,  # TOOLS_RUNTIME_CALLBACK_HOOKS
    "42d85a8123f6cb478298f6e78a3aecdc": True,  # TOOLS_TLS
    "c693336e1121df11a8c368f355d89593": False,  # CONTEXT_LOCAL_STORAGE: no size slot
    "263e88607cd2614392f6bbd5006dfa7e": True,  # CONTEXT_CHECKS
    "d4082055bde6704b8d34ba123c66e1f2": True,  # INTEGRITY_CHECK
    "21318c60971432488ca641ff7324c8f2": True,  # TOOLS_CONTEXT: libcudart >= 13.4 needs it to exist
}
UNKNOWN_TABLES = ("f8cff95121468b4eb9e2fb469e7c0dd9", "ab" * 16, "00" * 16)

# Runs with the shim preloaded; reads requests as JSON on stdin, prints answers as JSON.
PROBE = r"""
import ctypes, json, sys
from ctypes import POINTER, byref, c_char_p, c_int, c_uint64, c_void_p
from xpuremote.protocol.calls import SYMBOLS
lib = ctypes.CDLL("libcuda.so.1")
gpa2 = lib.cuGetProcAddress_v2
gpa2.argtypes = [c_char_p, POINTER(c_void_p), c_int, c_uint64, POINTER(c_int)]
gpa = lib.cuGetProcAddress
gpa.argtypes = [c_char_p, POINTER(c_void_p), c_int, c_uint64]
get_table = lib.cuGetExportTable
get_table.argtypes = [POINTER(c_void_p), c_char_p]

def dlsym(name):
    try:
        return ctypes.cast(getattr(lib, name), c_void_p).value
    except AttributeError:
        return None

def resolve(name, version, flags):
    pfn, status = c_void_p(12345), c_int(-1)
    rc = gpa2(None if name is None else name.encode(), byref(pfn), version, flags, byref(status))
    pfn1 = c_void_p(12345)
    rc1 = gpa(None if name is None else name.encode(), byref(pfn1), version, flags)
    return [rc, status.value, pfn.value, rc1, pfn1.value]

def table(uuid_hex, null_table=False):
    out = c_void_p(12345)
    rc = get_table(None if null_table else byref(out), None if uuid_hex is None else bytes.fromhex(uuid_hex))
    slots = list(ctypes.cast(out, POINTER(c_uint64))[:4]) if rc == 0 and out.value else None
    return [rc, out.value, slots]

req = json.load(sys.stdin)
status = c_int(-1)
answer = {
    "requests": [resolve(*r) for r in req["requests"]],
    "dlsym": {s: dlsym(s) for s in list(SYMBOLS) + req["extra_symbols"]},
    "null_pfn": gpa2(b"cuInit", None, 2000, 0, byref(status)),
    "tables": {u: table(u) for u in req["tables"]},
    "null_table": table(req["tables"][0], null_table=True)[0],
    "null_uuid": table(None)[0],
    "asked_again": table(req["tables"][-1]),
}
print(json.dumps(answer))
"""


def facts_dir() -> Path | None:
    for base in (ROOT.parent / "shared" / "data", ROOT / "shared" / "data"):
        if (base / FACTS[0]).exists():
            return base
    return None


def read_facts(path: Path) -> list[tuple[str, int, int]]:
    rows = []
    for line in path.read_text().splitlines():
        m = re.match(r"^(\S*) ?ver=(\d+) flags=(\d+)", line)
        assert m, f"{path.name}: cannot read {line!r}"
        rows.append((m.group(1), int(m.group(2)), int(m.group(3))))
    return rows


def expected_symbol(name: str, version: int, flags: int) -> str | None:
    """What cuGetProcAddress must answer: the newest variant at or before `version`, per-thread
    first when flags ask for the per-thread default stream."""
    def newest(per_thread: int) -> str | None:
        found = [(v, s) for (n, v, p), s in cuda_api.VARIANTS.items()
                 if n == name and p == per_thread and v <= version]
        return max(found)[1] if found else None

    return (newest(1) if flags & 2 else None) or newest(0)


@pytest.fixture(scope="module")
def probe(shim: Path) -> Any:
    """Ask the shim, in one subprocess: requests -> (rc, status, pfn, rc of cuGetProcAddress, its pfn)."""
    data = facts_dir()
    facts = {name: read_facts(data / name) for name in FACTS} if data else {}
    first_version = {}
    for (name, version, _), _symbol in cuda_api.VARIANTS.items():
        first_version[name] = min(version, first_version.get(name, version))
    special = [
        ("cuCtxGetDevice", 2000, 0), ("cuCtxGetDevice", 12090, 0), ("cuCtxGetDevice", 13000, 0),
        ("cuCtxGetDevice", 99999, 0), ("cuMemcpyHtoDAsync", 7000, 2), ("cuMemcpyHtoDAsync", 7000, 0),
        ("cuMemcpyHtoDAsync", 7000, 1), ("cuMemcpyHtoDAsync", 3020, 2), ("cuInit", 2000, 2),
        ("", 0, 0), ("", 13000, 0), (None, 13000, 0), ("cuNoSuchFunction", 13000, 0), ("cuinit", 2000, 0),
    ]
    too_old = [("cuMemAllocAsync", first_version["cuMemAllocAsync"] - 10, 0), ("cuInit", 1999, 0),
               ("cuInit", 0, 0), ("cuCtxGetDevice", 1000, 2)]
    special += too_old
    variants = [(name, version, 2 if per_thread else 0) for (name, version, per_thread) in cuda_api.VARIANTS]
    requests = special + variants + [row for rows in facts.values() for row in rows]
    extra = ["cuMemcpyHtoDAsync_v2_ptsz", "cuGetProcAddress", "cuGetProcAddress_v2", "cuGetExportTable"]
    stdin = json.dumps({"requests": requests, "extra_symbols": extra,
                        "tables": list(EXPORT_TABLES) + list(UNKNOWN_TABLES)})
    env = shim_env(shim, "tcp://127.0.0.1:9", XPU_LOG="INFO")  # no server: none of this may need one
    result = subprocess.run([sys.executable, "-c", PROBE], input=stdin, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    answer["by_request"] = {tuple(r): a for r, a in zip(requests, answer["requests"])}
    answer["facts"] = facts
    answer["variant_requests"] = variants
    answer["too_old"] = too_old
    answer["stderr"] = result.stderr
    return answer


def test_every_symbol_is_exported(probe: Any) -> None:
    missing = [s for s, address in probe["dlsym"].items() if not address]
    assert not missing, f"not exported by the shim: {missing[:20]}"
    addresses = [a for s, a in probe["dlsym"].items() if s in CALLS]
    assert len(set(addresses)) == len(addresses), "two symbols share an entry point"


@pytest.mark.skipif(not shutil.which("nm"), reason="nm (binutils) is not installed")
def test_the_shim_exports_exactly_the_table(shim: Path) -> None:
    nm = subprocess.run(["nm", "-D", "--defined-only", str(shim)], capture_output=True, text=True, check=True)
    exported = {line.split()[-1] for line in nm.stdout.splitlines() if line.split()[-1].startswith("cu")}
    symbols = set(SYMBOLS)
    assert exported == symbols, (sorted(exported - symbols)[:20], sorted(symbols - exported)[:20])


def test_every_variant_resolves_to_its_symbol(probe: Any) -> None:
    wrong = []
    for request in probe["variant_requests"]:
        name, version, flags = request
        rc, status, pfn, rc1, pfn1 = probe["by_request"][request]
        symbol = cuda_api.VARIANTS[(name, version, 1 if flags else 0)]
        if (rc, status, pfn) != (0, 0, probe["dlsym"][symbol]) or (rc1, pfn1) != (0, pfn):
            wrong.append((request, symbol, rc, status))
    assert not wrong, wrong[:20]


@pytest.mark.parametrize("facts", FACTS)
def test_what_cudart_asks_for_resolves(probe: Any, facts: str) -> None:
    if not probe["facts"]:
        pytest.skip("the cuGetProcAddress facts (../shared/data) are not beside this checkout")
    unresolved, wrong = [], []
    for request in probe["facts"][facts]:
        name, version, flags = request
        rc, status, pfn, rc1, pfn1 = probe["by_request"][request]
        if not name or INTEROP.search(name):
            continue
        want = expected_symbol(name, version, flags)
        if rc or status or not pfn or want is None:
            unresolved.append((name, version, flags, rc, status))
        elif pfn != probe["dlsym"][want] or (rc1, pfn1) != (0, pfn):
            wrong.append((name, version, flags, want))
    assert not unresolved, f"cudart asks for these and gets nothing: {unresolved}"
    assert not wrong, f"resolved to the wrong variant: {wrong}"
    interop = [r for r in probe["facts"][facts] if r[0] and INTEROP.search(r[0])]
    assert interop and all(probe["by_request"][r][:3] == [NOT_FOUND, 1, None] for r in interop)


def test_profiler_names_resolve(probe: Any) -> None:
    if not probe["facts"]:
        pytest.skip("the cuGetProcAddress facts (../shared/data) are not beside this checkout")
    asked = {r for rows in probe["facts"].values() for r in rows if r[0] in PROFILER}
    assert asked and all(probe["by_request"][r][:2] == [0, 0] for r in asked)


def test_versioned_variants(probe: Any) -> None:
    by, dlsym = probe["by_request"], probe["dlsym"]
    old, v12, new, future = (by[("cuCtxGetDevice", v, 0)] for v in (2000, 12090, 13000, 99999))
    assert old[:2] == [0, 0] and new[:2] == [0, 0]
    assert old[2] == dlsym["cuCtxGetDevice"] and new[2] == dlsym["cuCtxGetDevice_v2"] and old[2] != new[2]
    assert v12[2] == old[2], "a 12.x runtime must get the 1-argument cuCtxGetDevice"
    assert future[2] == new[2], "a newer runtime gets the newest variant"
    assert by[("cuMemcpyHtoDAsync", 7000, 2)][:3] == [0, 0, dlsym["cuMemcpyHtoDAsync_v2_ptsz"]]
    assert by[("cuMemcpyHtoDAsync", 7000, 0)][2] == dlsym["cuMemcpyHtoDAsync_v2"]
    legacy, early = by[("cuMemcpyHtoDAsync", 7000, 1)], by[("cuMemcpyHtoDAsync", 3020, 2)]
    assert legacy[2] == dlsym["cuMemcpyHtoDAsync_v2"], "flags=1 (legacy stream) is the default"
    assert early[2] == dlsym["cuMemcpyHtoDAsync_v2"], "no per-thread variant before 7000"
    assert by[("cuInit", 2000, 2)][:3] == [0, 0, dlsym["cuInit"]], "per-thread flags on a stream-less call"


def test_lookup_failures(probe: Any) -> None:
    by = probe["by_request"]
    for request in [("", 0, 0), ("", 13000, 0), (None, 13000, 0)]:
        assert by[request] == [NOT_FOUND, 1, None, NOT_FOUND, None], request
    for request in [("cuNoSuchFunction", 13000, 0), ("cuinit", 2000, 0)]:
        assert by[request] == [NOT_FOUND, 1, None, NOT_FOUND, None], request
    for request in probe["too_old"]:
        assert by[request] == [NOT_FOUND, 2, None, NOT_FOUND, None], (request, by[request])
    assert probe["null_pfn"] == errors.INVALID_VALUE


def test_export_tables(probe: Any) -> None:
    tables = probe["tables"]
    for uuid, sized in EXPORT_TABLES.items():
        rc, address, slots = tables[uuid]
        assert rc == 0 and address, uuid
        if sized:
            assert slots[0] % 8 == 0 and 16 <= slots[0] <= 1024, (uuid, slots[0])
            assert all(slots[1 : min(4, slots[0] // 8)]), (uuid, slots)
        else:
            assert all(slots[:3]) and slots[3] == 0, (uuid, slots)
    assert len({tables[u][1] for u in EXPORT_TABLES}) == len(EXPORT_TABLES)
    for uuid in UNKNOWN_TABLES:
        rc, address, _ = tables[uuid]
        assert rc == errors.INVALID_VALUE and not address, (uuid, tables[uuid])
    assert probe["null_table"] == errors.INVALID_VALUE
    assert probe["null_uuid"] == errors.INVALID_VALUE


def test_a_refused_table_is_said_once_naming_the_library(probe: Any) -> None:
    """WARNING, except for the optional driver-log table that every runtime asks for and goes without."""
    said = re.findall(r"xpuremote: (\w+) (\S+) asked for private table ([0-9a-f-]{36})", probe["stderr"])
    asked = {uuid.replace("-", ""): (level, library) for level, library, uuid in said}
    assert len(said) == len(asked) == len(UNKNOWN_TABLES), probe["stderr"]  # once each, though asked twice
    for uuid in UNKNOWN_TABLES:
        level, library = asked[uuid]
        assert level == ("INFO" if uuid.startswith("f8cff951") else "WARNING"), (uuid, level)
        assert library.endswith(".so") or ".so." in library, library  # ctypes' libffi made the call


# Added in CUDA 13.1 to 13.5: a client built against those headers looks them up.
NEWER_THAN_13_0 = ("cuStreamGetDevResource", "cuGraphGetId", "cuGraphExecGetId", "cuGraphNodeGetLocalId",
                   "cuGraphNodeGetToolsId", "cuGraphNodeGetContainingGraph", "cuDevSmResourceSplit")


def test_the_call_table_covers_the_newest_headers_and_the_sim_reports_their_version(shim: Path, run_on) -> None:
    """The table comes from the pinned newest 12.x and 13.x runtime headers; the sim says it is that driver."""
    from xpuremote.server.backends.sim import SIM_DRIVER_VERSION

    assert cuda_api.HEADER_VERSIONS[0] >= 13050 and cuda_api.HEADER_VERSIONS[0] == SIM_DRIVER_VERSION
    exported = subprocess.run(["nm", "-D", "--defined-only", str(shim)], capture_output=True, text=True,
                              check=True).stdout.split()
    assert [name for name in NEWER_THAN_13_0 if name not in exported] == []
    program = ("import ctypes; cuda = ctypes.CDLL('libcuda.so.1'); v = ctypes.c_int(); "
               "print(cuda.cuInit(0), cuda.cuDriverGetVersion(ctypes.byref(v)), v.value)")
    result = run_on([sys.executable, "-c", program], timeout=60)
    if BACKEND == "sim":
        assert result.stdout.split() == ["0", "0", str(SIM_DRIVER_VERSION)], result.stderr[-2000:]
