"""The replacement math libraries called directly (ctypes), as a C program would, on the session's
server: what they write into the application's memory."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys

import pytest

PROGRAM = r"""
import ctypes
from xpuremote.protocol.cudnn_api import ENUMS as E

cuda, dnn = ctypes.CDLL("libcuda.so.1"), ctypes.CDLL("libcudnn.so.9")
i64 = ctypes.c_int64


def ok(status, what):
    assert status == 0, f"{what}: status {status}"


context, handle, tensor = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
ok(cuda.cuInit(0), "cuInit")
ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0), "cuDevicePrimaryCtxRetain")
ok(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
ok(dnn.cudnnCreate(ctypes.byref(handle)), "cudnnCreate")
ok(dnn.cudnnBackendCreateDescriptor(E["CUDNN_BACKEND_TENSOR_DESCRIPTOR"], ctypes.byref(tensor)), "create")


def set_(name, kind, values, ctype=i64):
    array = (ctype * len(values))(*values)
    ok(dnn.cudnnBackendSetAttribute(tensor, E[name], E[kind], i64(len(values)), array), name)


set_("CUDNN_ATTR_TENSOR_DATA_TYPE", "CUDNN_TYPE_DATA_TYPE", [E["CUDNN_DATA_FLOAT"]], ctypes.c_int)
set_("CUDNN_ATTR_TENSOR_DIMENSIONS", "CUDNN_TYPE_INT64", [2, 3, 4, 5])
set_("CUDNN_ATTR_TENSOR_STRIDES", "CUDNN_TYPE_INT64", [60, 20, 5, 1])
set_("CUDNN_ATTR_TENSOR_UNIQUE_ID", "CUDNN_TYPE_INT64", [7])
set_("CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT", "CUDNN_TYPE_INT64", [4])
ok(dnn.cudnnBackendFinalize(tensor), "finalize")

# room for 8 dimensions, 4 held: cuDNN writes 4 and the count, and nothing past them
dims, count = (i64 * 9)(*[-7] * 9), i64(-1)
ok(dnn.cudnnBackendGetAttribute(tensor, E["CUDNN_ATTR_TENSOR_DIMENSIONS"], E["CUDNN_TYPE_INT64"], i64(8),
                                ctypes.byref(count), dims), "get dimensions")
print(count.value, list(dims))
# the count may be left out; then only the elements come back
one = (i64 * 2)(-7, -7)
ok(dnn.cudnnBackendGetAttribute(tensor, E["CUDNN_ATTR_TENSOR_UNIQUE_ID"], E["CUDNN_TYPE_INT64"], i64(1), None, one),
   "get the unique id without its count")
print(list(one))

# a variant pack is kept by the client until it executes; asked about, it is made on the server first
pack, address = ctypes.c_void_p(), ctypes.c_uint64()
ok(cuda.cuMemAlloc_v2(ctypes.byref(address), 256), "cuMemAlloc")
ok(dnn.cudnnBackendCreateDescriptor(E["CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR"], ctypes.byref(pack)), "create pack")
tensor = pack
set_("CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS", "CUDNN_TYPE_VOID_PTR", [address.value], ctypes.c_uint64)
set_("CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS", "CUDNN_TYPE_INT64", [9])
ok(dnn.cudnnBackendFinalize(pack), "finalize pack")
ids, count = (i64 * 2)(-7, -7), i64(-1)
ok(dnn.cudnnBackendGetAttribute(pack, E["CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS"], E["CUDNN_TYPE_INT64"], i64(2),
                                ctypes.byref(count), ids), "get the pack's unique ids")
print(count.value, list(ids))
ok(dnn.cudnnBackendDestroyDescriptor(pack), "destroy pack")

# a pack named as a tensor descriptor: taken over from C, and the setter queued; the server refuses it, which the
# next call that waits says
ok(dnn.cudnnBackendCreateDescriptor(E["CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR"], ctypes.byref(pack)), "create pack")
ok(dnn.cudnnSetTensor4dDescriptor(pack, 0, E["CUDNN_DATA_FLOAT"], 1, 1, 1, 1), "a setter, queued")
assert dnn.cudnnBackendGetAttribute(pack, E["CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS"], E["CUDNN_TYPE_INT64"], i64(2),
                                    ctypes.byref(count), ids) != 0
"""


@pytest.mark.parametrize("where", ["server", pytest.param("cuda backend", marks=pytest.mark.sim_only(
    reason="the cuda backend on stand-in libraries chained to a sim server"))])
def test_get_attribute_writes_only_the_elements_the_descriptor_holds(run_on, request, where: str) -> None:
    """A GPU check found the stock PyTorch sizing an array by a first call's count, then asking
    again with a larger request: every element requested was written back, past its end (the
    cuda backend's buffer is the request's size; the sim's answer was the held elements only). A variant pack
    kept in C and asked about, or named as a tensor descriptor, is taken over by the client first."""
    address = request.getfixturevalue("chained")[0].address if where == "cuda backend" else None
    result = run_on([sys.executable, "-c", PROGRAM], timeout=60, address=address)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["4 [2, 3, 4, 5, -7, -7, -7, -7, -7]", "[7, -7]", "1 [9, -7]"], \
        result.stdout


def test_the_version_is_a_number_even_with_no_server(run_on) -> None:
    """cudnnGetVersion returns the version, not a status: with no server to ask, the headers'."""
    from conftest import free_port

    from xpuremote.protocol.cudnn_api import VERSION

    program = ("import ctypes; dnn = ctypes.CDLL('libcudnn.so.9'); dnn.cudnnGetVersion.restype = ctypes.c_size_t; "
               "print(dnn.cudnnGetVersion())")
    result = run_on([sys.executable, "-c", program], timeout=60, address=f"tcp://127.0.0.1:{free_port()}")
    major, minor, patch = VERSION
    assert result.stdout.split() == [str(major * 10000 + minor * 100 + patch)], result.stderr[-3000:]


def test_a_variant_packs_scalars_and_pointers_are_checked(server) -> None:
    """What a client that does not use the client library may send as xpuCudnnSetDataPointers: arrays that
    disagree with the count are refused, a data pointer outside the client's memory is refused, and a
    by-value entry's pointer is not an address at all (its bytes travel and the server holds them)."""
    from pyclient import CTX, PyClient

    from xpuremote.protocol.calls import CALLS
    from xpuremote.protocol.cudnn_api import ENUMS as E

    client, pack = PyClient(server.address), 0x7C00_0000_5000
    try:
        client.post("cudnnBackendCreateDescriptor", E["CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR"], pack)
        mine, scale = client.alloc(256), struct.pack("<f", 0.125).ljust(8, b"\0")
        cases = {  # pointers, by-value flags, scalars -> what the next call reports
            "sizes": ([mine, 0xDEAD], b"\1", scale * 2, "byValue: 1 bytes, expected 2"),
            "stranger": ([mine, 0xDEAD_0000], b"\0\0", bytes(16), "not inside one of this client's allocations"),
            "scalar": ([mine, 0xDEAD_0000], b"\0\1", bytes(8) + scale, None),
        }
        for name, (pointers, flags, scalars, refusal) in cases.items():
            data = struct.pack(f"<{len(pointers)}Q", *pointers)
            client.post("xpuCudnnSetDataPointers", pack, len(pointers), data, flags, scalars)
            _, _, deferred = client.conn.call(CALLS["cuCtxSynchronize"], [], CTX)
            details = [d[2] for d in deferred]
            assert (refusal is None and not details) or (len(details) == 1 and refusal in details[0]), (name, details)
    finally:
        client.close()
    assert "variant pack: by-value scalars 0000003e00000000" in server.log(), server.log()[-2000:]


def test_a_kept_variant_packs_execution_is_checked(server) -> None:
    """What a client may send as xpuCudnnExecute (a variant pack the client library kept, sent with its
    execution): a data pointer or a workspace outside the client's memory, and a handle that is not a cuDNN
    handle, are refused, and the session goes on."""
    from pyclient import CTX, PyClient

    from xpuremote.protocol import mathlibs
    from xpuremote.protocol.calls import CALLS

    client, handle = PyClient(server.address), 0x7C00_0000_6000
    try:
        client.post("cudnnCreate", handle)
        mine = client.alloc(256)
        cases = {  # the handle, pointers, workspace -> what the next call reports
            "stranger": (handle, [mine, 0xDEAD_0000], 0, "not inside one of this client's allocations"),
            "workspace": (handle, [mine, mine], 0xDEAD_0000, "not inside one of this client's allocations"),
            "handle": (mine, [mine, mine], 0, "is not a live cudnnHandle_t"),
        }
        for name, (owner, pointers, workspace, refusal) in cases.items():
            data = struct.pack(f"<{len(pointers)}Q", *pointers)
            pack = mathlibs.execute_pack(data, struct.pack("<2q", 1, 2), bytes(16), bytes(2))
            client.post("xpuCudnnExecute", owner, handle, len(pointers), workspace, pack)
            _, _, deferred = client.conn.call(CALLS["cuCtxSynchronize"], [], CTX)
            details = [d[2] for d in deferred]
            assert len(details) == 1 and refusal in details[0], (name, details)
        client.write(mine, b"ok")  # the session goes on
    finally:
        client.close()


HEURISTIC_PROGRAM = r"""
import ctypes, sys
from xpuremote.interpose.build import LIBRARY_NAMES
from xpuremote.protocol.cublasLt_api import ENUMS as E

cuda, lt = ctypes.CDLL("libcuda.so.1"), ctypes.CDLL(LIBRARY_NAMES[1])
ptr = ctypes.c_void_p
context, handle, desc, pref = ptr(), ptr(), ptr(), ptr()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
assert cuda.cuCtxSetCurrent(context) == 0 and lt.cublasLtCreate(ctypes.byref(handle)) == 0
assert lt.cublasLtMatmulDescCreate(ctypes.byref(desc), E["CUBLAS_COMPUTE_32F"], E["CUDA_R_32F"]) == 0
layouts = [ptr() for _ in range(3)]
for layout in layouts:
    assert lt.cublasLtMatrixLayoutCreate(ctypes.byref(layout), E["CUDA_R_32F"], ctypes.c_uint64(16),
                                         ctypes.c_uint64(16), ctypes.c_int64(16)) == 0
workspace = ctypes.c_uint64(1 << 20)
assert lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)) == 0
assert lt.cublasLtMatmulPreferenceSetAttribute(pref, E["CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES"],
                                               ctypes.byref(workspace), ctypes.c_size_t(8)) == 0
a, b, c = layouts


def heuristic():
    results, count = (ctypes.c_char * (96 * 2))(), ctypes.c_int(-1)
    status = lt.cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, c, c, pref, 2, results, ctypes.byref(count))
    return status, count.value, bytes(results)


bias = E["CUBLASLT_MATMUL_DESC_BIAS_POINTER"]


def set_bias(address):
    value = ctypes.c_uint64(address)
    assert lt.cublasLtMatmulDescSetAttribute(desc, bias, ctypes.byref(value), ctypes.c_size_t(8)) == 0


memory = ctypes.c_uint64()
assert cuda.cuMemAlloc_v2(ctypes.byref(memory), ctypes.c_size_t(1 << 16)) == 0
asked = []
for i in range(int(sys.argv[1])):  # a bias of another address each time (autocast's), aligned as before
    set_bias(memory.value + 0x1000 * i)
    asked.append(heuristic())
assert all(answer == asked[0] for answer in asked) and asked[0][:2] == (0, 1), asked
if sys.argv[2] == "1":
    set_bias(memory.value + 4)  # another alignment: asked again
    assert heuristic() == asked[0]
row = ctypes.c_int(E["CUBLASLT_ORDER_ROW"])  # a new setting is a new question: the sim refuses row-major
assert lt.cublasLtMatrixLayoutSetAttribute(a, E["CUBLASLT_MATRIX_LAYOUT_ORDER"], ctypes.byref(row), 4) == 0
refused = heuristic()[0]
assert lt.cublasLtMatrixLayoutDestroy(b) == 0  # a destroyed descriptor is not answered from memory
gone = heuristic()[0]
print(refused, gone)
"""


@pytest.mark.sim_only(reason="the sim's heuristic answers (one algorithm, row-major refused); what is kept is the "
                       "client's, the same on any backend")
def test_cublaslt_heuristic_is_asked_once_per_problem(tmp_path) -> None:
    """PyTorch asks cublasLtMatmulAlgoGetHeuristic before every cuBLASLt GEMM, of descriptors made anew: a
    round trip each. The client answers a question it has asked before with the same settings from the first
    answer: five cost the server what one does, each with a bias at another address (autocast's); a bias of
    another alignment, a changed attribute or a destroyed descriptor is asked again. The descriptors are kept
    by the client and made on the server only for the questions it is asked. With the shim a question answered
    before is answered in C (interpose/kept.h): of the eight the second run asks, the core sees the first, the
    other alignment's, the refused setting's and the destroyed descriptor's."""
    from conftest import shim_env, start_server

    from xpuremote.client import call_cpu
    from xpuremote.interpose.build import ensure_shim

    srv = start_server(tmp_path)
    tables = [tmp_path / f"cpu-{i}.tsv" for i in range(3)]
    try:
        runs = [subprocess.run([sys.executable, "-c", HEURISTIC_PROGRAM, str(n), misaligned], capture_output=True,
                               text=True, timeout=60,
                               env=shim_env(ensure_shim(), srv.address, XPU_CALL_CPU=str(table)))
                for (n, misaligned), table in zip(((1, "1"), (5, "1"), (1, "0")), tables)]
    finally:
        srv.stop()
    asked = [call_cpu.read(table)["cublasLtMatmulAlgoGetHeuristic"][0] for table in tables]
    assert asked == [4, 4, 3], asked
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
        refused, gone = map(int, run.stdout.split())
        assert refused == 15 and gone != 0, run.stdout  # CUBLAS_STATUS_NOT_SUPPORTED; the handle's refusal
    served = [int(n) for n in re.findall(r"library calls: .*cublasLt=(\d+)", srv.log())]
    assert len(served) == 3 and served[1] == served[0], served  # the four more biases: neither set nor asked
    # a bias of another alignment: asked again, of the server's descriptor for that setting (made, its bias set)
    assert served[0] == served[2] + 3, served


SETTINGS_PROGRAM = r"""
import ctypes, sys
from xpuremote.interpose.build import LIBRARY_NAMES
cuda, blas, dnn = ctypes.CDLL("libcuda.so.1"), ctypes.CDLL(LIBRARY_NAMES[0]), ctypes.CDLL("libcudnn.so.9")
context, handle, stream, found = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
blas_handle, mode = ctypes.c_void_p(), ctypes.c_int(-1)
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
assert cuda.cuCtxSetCurrent(context) == 0 and dnn.cudnnCreate(ctypes.byref(handle)) == 0
assert blas.cublasCreate_v2(ctypes.byref(blas_handle)) == 0
assert cuda.cuStreamCreate(ctypes.byref(stream), 1) == 0
workspace = ctypes.c_uint64()
assert cuda.cuMemAlloc_v2(ctypes.byref(workspace), 1 << 16) == 0
for _ in range(int(sys.argv[1])):  # as PyTorch does before each call
    assert dnn.cudnnSetStream(handle, stream) == 0
    assert blas.cublasSetStream_v2(blas_handle, stream) == 0  # puts back cuBLAS's own workspace
    assert blas.cublasSetWorkspace_v2(blas_handle, ctypes.c_uint64(workspace.value), ctypes.c_size_t(1 << 16)) == 0
    assert blas.cublasSetMathMode(blas_handle, 3) == 0  # CUBLAS_TF32_TENSOR_OP_MATH
assert dnn.cudnnGetStream(handle, ctypes.byref(found)) == 0 and found.value == stream.value
assert blas.cublasGetMathMode(blas_handle, ctypes.byref(mode)) == 0 and mode.value == 3
assert blas.cublasGetStream_v2(blas_handle, ctypes.byref(found)) == 0 and found.value == stream.value
assert dnn.cudnnSetStream(handle, None) == 0  # another stream: sent
assert dnn.cudnnGetStream(handle, ctypes.byref(found)) == 0 and not found.value
assert blas.cublasSetStream_v2(blas_handle, None) == 0  # another stream, cuBLAS's own workspace: sent
assert blas.cublasGetStream_v2(blas_handle, ctypes.byref(found)) == 0 and not found.value
assert blas.cublasSetMathMode(blas_handle, 0) == 0  # before this call
assert dnn.cudnnDestroy(handle) == 0 and blas.cublasDestroy_v2(blas_handle) == 0
assert dnn.cudnnSetStream(handle, None) != 0  # the value it held, but the handle is gone: C does not answer
assert blas.cublasSetStream_v2(blas_handle, None) != 0
"""


def test_a_setting_is_sent_only_when_it_changes(tmp_path) -> None:
    """PyTorch sets a cuDNN handle's stream, and a cuBLAS handle's stream, workspace and math mode, before each
    call: five settings of the values a handle already has cost the server what one does, and the getters
    answer the value last set. A cuBLAS handle's stream and workspace are sent before the next call that names
    the handle, where they differ from the server's (cublasSetStream also puts back cuBLAS's own workspace).
    A stream or math mode set to the value it holds, or asked once set, is answered in C: the client core
    (XPU_CALL_CPU counts its calls) sees those setters as often for five rounds as for one, their getters never,
    and a setter after the handle is destroyed. C holds a cuBLAS handle's stream and workspace: their setters and
    cublasGetStream never reach the core, and the server gets the pair from there. A traced run (C's paths stay
    open under a trace) sends the server the same calls."""
    from conftest import shim_env, start_server

    from xpuremote.client import call_cpu
    from xpuremote.interpose.build import ensure_shim

    srv = start_server(tmp_path)
    try:
        runs = [subprocess.run([sys.executable, "-c", SETTINGS_PROGRAM, str(n)], capture_output=True, text=True,
                               timeout=60, env=shim_env(ensure_shim(), srv.address, **env))
                for n, env in ((1, {"XPU_CALL_CPU": str(tmp_path / "core-1.tsv")}),
                               (5, {"XPU_CALL_CPU": str(tmp_path / "core-5.tsv")}),
                               (5, {"XPU_TRACE": str(tmp_path / "traced")}))]
    finally:
        srv.stop()
    assert all(run.returncode == 0 for run in runs), [run.stderr[-3000:] for run in runs]
    in_core, setters = [], ("cudnnSetStream", "cublasSetMathMode", "cudnnGetStream", "cublasGetMathMode",
                            "cublasSetStream_v2", "cublasSetWorkspace_v2", "cublasGetStream_v2")
    for n in (1, 5):
        in_core.append({name: calls for name, (calls, _) in call_cpu.read(tmp_path / f"core-{n}.tsv").items()
                        if name in setters})
    assert in_core[0] == in_core[1] and in_core[0]["cudnnSetStream"] <= 3, in_core
    assert not {"cudnnGetStream", "cublasGetMathMode", "cublasSetWorkspace_v2", "cublasGetStream_v2"} & set(in_core[0])
    assert in_core[0].get("cublasSetStream_v2", 0) == 1, in_core  # after its handle was destroyed
    dnn = [int(n) for n in re.findall(r"library calls: .*cudnn=(\d+)", srv.log())]
    blas = [int(n) for n in re.findall(r"library calls: .*cublas=(\d+)", srv.log())]
    assert dnn == [4] * 3, dnn  # create, the stream set once, the other stream, destroy
    # created; the stream and workspace before the first math mode; the default stream before the last; destroyed
    assert blas == [7] * 3, blas


IN_C_PROGRAM = r"""
import ctypes
from xpuremote.protocol.cudnn_api import ENUMS as E

cuda, dnn = ctypes.CDLL("libcuda.so.1"), ctypes.CDLL("libcudnn.so.9")
ptr, ints = ctypes.c_void_p, ctypes.c_int * 8
FLOAT, IN_C = E["CUDNN_DATA_FLOAT"], range(0x7B00_0000_0000, 0x7C00_0000_0000)  # interpose/kept.h's handles


def ok(status, what):
    assert status == 0, f"{what}: status {status}"


context, handle, stream, graph = ptr(), ptr(), ptr(), ptr()
ok(cuda.cuInit(0), "cuInit")
ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0), "cuDevicePrimaryCtxRetain")
ok(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
ok(dnn.cudnnCreate(ctypes.byref(handle)), "cudnnCreate")
ok(cuda.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")


def create():
    t = ptr()
    ok(dnn.cudnnCreateTensorDescriptor(ctypes.byref(t)), "create")
    return t


def set_nd(t, dims, strides):
    ok(dnn.cudnnSetTensorNdDescriptor(t, FLOAT, len(dims), ints(*dims), ints(*strides)), "set")
    return t


def shape(t):
    kind, count, dims, strides = ctypes.c_int(), ctypes.c_int(), ints(), ints()
    ok(dnn.cudnnGetTensorNdDescriptor(t, 8, ctypes.byref(kind), ctypes.byref(count), dims, strides), "get")
    return kind.value, list(dims[:count.value]), list(strides[:count.value])


x = set_nd(create(), [2, 3, 4, 5], [60, 20, 5, 1])
assert x.value in IN_C, hex(x.value)
assert shape(x) == (FLOAT, [2, 3, 4, 5], [60, 20, 5, 1]), shape(x)
set_nd(x, [1, 2], [2, 1])  # set again: the new setting
assert shape(x) == (FLOAT, [1, 2], [2, 1]), shape(x)
four, four_ex = create(), create()
ok(dnn.cudnnSetTensor4dDescriptor(four, E["CUDNN_TENSOR_NCHW"], FLOAT, 1, 2, 3, 4), "set 4d")
ok(dnn.cudnnSetTensor4dDescriptorEx(four_ex, FLOAT, 1, 2, 3, 4, 100, 50, 10, 1), "set 4d ex")
assert shape(four) == (FLOAT, [1, 2, 3, 4], [24, 12, 4, 1]), shape(four)
assert shape(four_ex) == (FLOAT, [1, 2, 3, 4], [100, 50, 10, 1]), shape(four_ex)

# a handle is given out again after its destroy (the table's 4,096 slots, each used again): its own setting
for i in range(4100):
    t = set_nd(create(), [1, i % 5 + 1], [i % 5 + 1, 1])
    if i in (0, 4099):
        assert shape(t) == (FLOAT, [1, i % 5 + 1], [i % 5 + 1, 1]), (i, shape(t))
    ok(dnn.cudnnDestroyTensorDescriptor(t), "destroy")

# a descriptor set from another on the server (cudnnDeriveBNTensorDescriptor) becomes the server's own
x = set_nd(create(), [2, 3, 4, 5], [60, 20, 5, 1])
derived = create()
ok(dnn.cudnnDeriveBNTensorDescriptor(derived, x, E["CUDNN_BATCHNORM_SPATIAL"]), "derive")
assert shape(derived) == (FLOAT, [1, 3, 1, 1], [3, 1, 1, 1]), shape(derived)
assert shape(x) == (FLOAT, [2, 3, 4, 5], [60, 20, 5, 1]), shape(x)
ok(dnn.cudnnDestroyTensorDescriptor(derived), "destroy derived")

# while C does not answer (a capture under way closes the lane), the client takes over C's descriptors
made, unset = set_nd(create(), [1, 1, 2, 2], [4, 4, 2, 1]), create()
ok(cuda.cuStreamBeginCapture_v2(stream, 0), "begin capture")
set_nd(unset, [3, 1, 1, 1], [1, 1, 1, 1])
ok(dnn.cudnnDestroyTensorDescriptor(made), "destroy in a capture")
mine = set_nd(create(), [5, 1], [1, 1])
ok(cuda.cuStreamEndCapture(stream, ctypes.byref(graph)), "end capture")
assert mine.value not in IN_C, hex(mine.value)
assert shape(unset) == (FLOAT, [3, 1, 1, 1], [1, 1, 1, 1]), shape(unset)
assert shape(mine) == (FLOAT, [5, 1], [1, 1]), shape(mine)
assert create().value in IN_C

# a full table: the client keeps the rest
held = [set_nd(create(), [1, 7], [7, 1]) for _ in range(4100)]
assert held[0].value in IN_C and held[-1].value not in IN_C, (hex(held[0].value), hex(held[-1].value))
assert shape(held[0]) == shape(held[-1]) == (FLOAT, [1, 7], [7, 1])
for t in held:
    ok(dnn.cudnnDestroyTensorDescriptor(t), "destroy held")

# cuBLASLt's descriptors: kept in C with up to 12 attributes of up to 16 bytes; a 13th, a longer one, or an
# attribute set in a capture, and the client takes the descriptor over; each getter answers what was set
from xpuremote.interpose.build import LIBRARY_NAMES
from xpuremote.protocol.cublasLt_api import ENUMS as LT

lt = ctypes.CDLL(LIBRARY_NAMES[1])
u64 = ctypes.c_uint64


def lt_made():
    desc, layout, pref = ptr(), ptr(), ptr()
    ok(lt.cublasLtMatmulDescCreate(ctypes.byref(desc), LT["CUBLAS_COMPUTE_32F"], LT["CUDA_R_32F"]), "desc")
    ok(lt.cublasLtMatrixLayoutCreate(ctypes.byref(layout), LT["CUDA_R_32F"], u64(16), u64(8), ctypes.c_int64(16)),
       "layout")
    ok(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
    return desc, layout, pref


def lt_set(set_, desc, name, value):
    ok(set_(desc, name, value, ctypes.c_size_t(len(value))), f"set {name}")


def lt_get(get, desc, name, size):
    value, written = ctypes.create_string_buffer(size), ctypes.c_size_t()
    ok(get(desc, name, value, ctypes.c_size_t(size), ctypes.byref(written)), f"get {name}")
    return value.raw[:written.value]


desc, layout, pref = lt_made()
assert all(h.value in IN_C for h in (desc, layout, pref)), (desc, layout, pref)
rows = lt_get(lt.cublasLtMatrixLayoutGetAttribute, layout, LT["CUBLASLT_MATRIX_LAYOUT_ROWS"], 8)
assert rows == (16).to_bytes(8, "little"), rows
values = {100 + i: bytes([i]) * (i % 16 + 1) for i in range(12)}
for name, value in values.items():
    lt_set(lt.cublasLtMatmulDescSetAttribute, desc, name, value)
lt_set(lt.cublasLtMatmulDescSetAttribute, desc, 100, b"again")
values[100] = b"again"
assert all(lt_get(lt.cublasLtMatmulDescGetAttribute, desc, n, 16) == v for n, v in values.items())
lt_set(lt.cublasLtMatmulDescSetAttribute, desc, 112, b"13th")  # taken over
lt_set(lt.cublasLtMatmulPreferenceSetAttribute, pref, 1, b"x" * 24)  # taken over
assert lt_get(lt.cublasLtMatmulDescGetAttribute, desc, 112, 16) == b"13th"
assert lt_get(lt.cublasLtMatmulDescGetAttribute, desc, 101, 16) == values[101]
assert lt_get(lt.cublasLtMatmulPreferenceGetAttribute, pref, 1, 32) == b"x" * 24
in_capture = lt_made()[1]
ok(cuda.cuStreamBeginCapture_v2(stream, 0), "begin capture")
lt_set(lt.cublasLtMatrixLayoutSetAttribute, in_capture, LT["CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT"], b"\3\0\0\0")
ok(cuda.cuStreamEndCapture(stream, ctypes.byref(graph)), "end capture")
batches = lt_get(lt.cublasLtMatrixLayoutGetAttribute, in_capture, LT["CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT"], 4)
assert batches == b"\3\0\0\0", batches
for h, destroy in ((desc, lt.cublasLtMatmulDescDestroy), (layout, lt.cublasLtMatrixLayoutDestroy),
                   (pref, lt.cublasLtMatmulPreferenceDestroy), (in_capture, lt.cublasLtMatrixLayoutDestroy)):
    ok(destroy(h), "destroy")

# threads making, setting, naming and destroying descriptors at once, as autograd's do: each sees its own
import threading
seen = []


def churn(k):
    for i in range(300):
        t = set_nd(create(), [1, k + 1, i % 3 + 1], [(k + 1) * (i % 3 + 1), i % 3 + 1, 1])
        if i % 50 == 0:
            seen.append(shape(t) == (FLOAT, [1, k + 1, i % 3 + 1], [(k + 1) * (i % 3 + 1), i % 3 + 1, 1]))
        ok(dnn.cudnnDestroyTensorDescriptor(t), "destroy")


threads = [threading.Thread(target=churn, args=(k,)) for k in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert len(seen) == 48 and all(seen), seen
print("ok")
"""


def test_descriptors_are_kept_in_c(tmp_path) -> None:
    """PyTorch makes, sets and destroys a cuDNN tensor descriptor for each tensor of a batch norm, and five
    cuBLASLt descriptors for each GEMM: the shim answers those calls in C, and a call that names a descriptor
    names the server's descriptor of its setting, whichever setter made it. A handle given out again is its new
    setting; a descriptor set from another on the server, or while C does not answer (a capture), or past the
    table's size, or with an attribute C does not hold, is the client's; eight threads at once each see their
    own; the server runs no call for the 10,600 tensor descriptors made, set and destroyed in C."""
    from conftest import shim_env, start_server

    from xpuremote.interpose.build import ensure_shim

    srv = start_server(tmp_path)
    try:
        run = subprocess.run([sys.executable, "-c", IN_C_PROGRAM], capture_output=True, text=True, timeout=120,
                             env=shim_env(ensure_shim(), srv.address))
    finally:
        srv.stop()
    assert run.returncode == 0 and run.stdout.split() == ["ok"], run.stderr[-3000:]
    served = [int(n) for n in re.findall(r"library calls: .*cudnn=(\d+)", srv.log())]
    # the 60 questions asked and the server's descriptors for the settings named (made, set): not the 10,600
    assert len(served) == 1 and served[0] < 200, served


# The GEMM programs' device matrices of floats: made from a list, read back rounded (N x N).
MATRICES = r"""
def matrix(values):
    address = ctypes.c_uint64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(address), 4 * len(values)) == 0
    data = struct.pack(f"<{len(values)}f", *values)
    assert cuda.cuMemcpyHtoD_v2(address, data, len(data)) == 0
    return address.value


def read(address):
    host = ctypes.create_string_buffer(4 * N * N)
    assert cuda.cuMemcpyDtoH_v2(host, ctypes.c_uint64(address), 4 * N * N) == 0
    return [round(v, 3) for v in struct.unpack(f"<{N * N}f", host.raw)]
"""

GEMM_PROGRAM = r"""
import ctypes, struct, sys
from xpuremote.interpose.build import LIBRARY_NAMES
from xpuremote.protocol.cublas_api import ENUMS as E

cuda, blas = ctypes.CDLL("libcuda.so.1"), ctypes.CDLL(LIBRARY_NAMES[0])
ptr, N = ctypes.c_void_p, 4
context, handle, streams = ptr(), ptr(), [ptr(), ptr()]
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
assert cuda.cuCtxSetCurrent(context) == 0 and blas.cublasCreate_v2(ctypes.byref(handle)) == 0
for s in streams:
    assert cuda.cuStreamCreate(ctypes.byref(s), 1) == 0

""" + MATRICES + r"""

a, b, c = matrix(range(N * N)), matrix([0.5] * (N * N)), matrix([1.0] * (N * N))
workspace = matrix([0.0] * (N * N))
one, half, device_one = ctypes.c_float(1.0), ctypes.c_float(0.5), matrix([1.0] * (N * N))
f32, compute = E["CUDA_R_32F"], E["CUBLAS_COMPUTE_32F"]
for i in range(6):  # PyTorch sets the stream and a workspace before each GEMM; a new stream every other one
    assert blas.cublasSetStream_v2(handle, streams[i // 2 % 2]) == 0
    if i % 3:
        assert blas.cublasSetWorkspace_v2(handle, ctypes.c_uint64(workspace), ctypes.c_size_t(4 * N * N)) == 0
    alpha = ctypes.c_float(1.0 + i)
    if i % 2:
        status = blas.cublasGemmEx(handle, 0, 0, N, N, N, ctypes.byref(alpha), ctypes.c_uint64(a), f32, N,
                                   ctypes.c_uint64(b), f32, N, ctypes.byref(half), ctypes.c_uint64(c), f32, N, compute,
                                   E["CUBLAS_GEMM_DEFAULT"])
    else:
        status = blas.cublasSgemm_v2(handle, 0, 0, N, N, N, ctypes.byref(alpha), ctypes.c_uint64(a), N,
                                     ctypes.c_uint64(b), N, ctypes.byref(half), ctypes.c_uint64(c), N)
    assert status == 0, (i, status)
assert cuda.cuCtxSynchronize() == 0
print("host scalars", read(c))
assert blas.cublasSetPointerMode_v2(handle, 1) == 0  # the scalars' addresses travel: the client's way
assert blas.cublasSgemm_v2(handle, 0, 0, N, N, N, ctypes.c_uint64(device_one), ctypes.c_uint64(a), N,
                           ctypes.c_uint64(b), N, ctypes.c_uint64(device_one), ctypes.c_uint64(c), N) == 0
assert cuda.cuCtxSynchronize() == 0
print("device scalars", read(c))
assert blas.cublasSetPointerMode_v2(handle, 0) == 0
print("a NULL alpha", blas.cublasSgemm_v2(handle, 0, 0, N, N, N, None, ctypes.c_uint64(a), N, ctypes.c_uint64(b), N,
                                          ctypes.byref(one), ctypes.c_uint64(c), N))
"""


@pytest.mark.sim_only(reason="counts the sim's library calls per session; the client's side is the same on any "
                      "backend")
def test_cublas_gemms_are_queued_in_c(tmp_path) -> None:
    """A cuBLAS call of integers, device pointers and host scalars (cublasSgemm, cublasGemmEx, ...) is queued in
    the fast lane by C (interpose/kept.h) with its scalars' bytes, after the stream and workspace its handle lacks
    on the server: with the lane and without, the same results and the same calls reach the server; with it the
    core sees none of the GEMMs in host pointer mode, and the one in device pointer mode and the one with a NULL
    alpha go its way."""
    from conftest import start_server, with_and_without_lane

    from xpuremote.interpose.build import ensure_shim

    srv = start_server(tmp_path)
    try:
        runs = with_and_without_lane(GEMM_PROGRAM, srv.address, tmp_path, ensure_shim())
    finally:
        srv.stop()
    lines = runs["1"][0].splitlines()
    # c = alpha * a @ b + 0.5 c, six times, alpha 1..6; column-major: a's row i is i, 4 + i, ..., b is all 0.5
    row = [0.5 * sum(4 * j + i for j in range(4)) for i in range(4)]
    c = [1.0] * 4
    for alpha in range(1, 7):
        c = [alpha * r + 0.5 * v for r, v in zip(row, c)]
    assert lines[0] == f"host scalars {[round(v, 3) for _ in range(4) for v in c]}", lines
    assert lines[2].startswith("a NULL alpha "), lines  # the core's answer, in both runs
    in_c, by_core = runs["1"][1], runs["0"][1]
    assert by_core["cublasSgemm_v2"][0] == 5 and by_core["cublasGemmEx"][0] == 3, by_core
    assert in_c["cublasSgemm_v2"][0] == 2 and "cublasGemmEx" not in in_c, in_c  # device mode, NULL alpha
    served = re.findall(r"library calls: .*?cublas=(\d+)", srv.log())
    assert len(served) == 2 and served[0] == served[1], served


LT_MATMUL_PROGRAM = r"""
import ctypes, struct
from xpuremote.interpose.build import LIBRARY_NAMES
from xpuremote.protocol.cublasLt_api import ENUMS as E

cuda, lt = ctypes.CDLL("libcuda.so.1"), ctypes.CDLL(LIBRARY_NAMES[1])
ptr, N = ctypes.c_void_p, 4
context, handle = ptr(), ptr()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
assert cuda.cuCtxSetCurrent(context) == 0 and lt.cublasLtCreate(ctypes.byref(handle)) == 0

""" + MATRICES + r"""

a, b, c, d = matrix(range(N * N)), matrix([0.5] * (N * N)), matrix([1.0] * (N * N)), matrix([0.0] * (N * N))
bias, workspace = matrix([10.0 * i for i in range(N)]), matrix([0.0] * 1024)
other_bias = matrix([100.0 * i for i in range(N)])  # elsewhere, aligned alike: autocast casts the bias anew


def gemm(alpha, with_bias=0):
    # as PyTorch's addmm: the descriptors made anew, the heuristic asked, the GEMM, the descriptors destroyed
    desc, pref, layouts = ptr(), ptr(), [ptr() for _ in range(3)]
    assert lt.cublasLtMatmulDescCreate(ctypes.byref(desc), E["CUBLAS_COMPUTE_32F"], E["CUDA_R_32F"]) == 0
    if with_bias:
        epilogue, address = ctypes.c_int(E["CUBLASLT_EPILOGUE_BIAS"]), ctypes.c_uint64(with_bias)
        assert lt.cublasLtMatmulDescSetAttribute(desc, E["CUBLASLT_MATMUL_DESC_EPILOGUE"], ctypes.byref(epilogue),
                                                 ctypes.c_size_t(4)) == 0
        assert lt.cublasLtMatmulDescSetAttribute(desc, E["CUBLASLT_MATMUL_DESC_BIAS_POINTER"], ctypes.byref(address),
                                                 ctypes.c_size_t(8)) == 0
    for layout in layouts:
        assert lt.cublasLtMatrixLayoutCreate(ctypes.byref(layout), E["CUDA_R_32F"], ctypes.c_uint64(N),
                                             ctypes.c_uint64(N), ctypes.c_int64(N)) == 0
    size = ctypes.c_uint64(4096)
    assert lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)) == 0
    assert lt.cublasLtMatmulPreferenceSetAttribute(pref, E["CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES"],
                                                   ctypes.byref(size), ctypes.c_size_t(8)) == 0
    results, count = (ctypes.c_char * 96)(), ctypes.c_int()
    la, lb, lc = layouts
    assert lt.cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, lc, pref, 1, results, ctypes.byref(count)) == 0
    alpha_, beta = ctypes.c_float(alpha), ctypes.c_float(0.5)
    status = lt.cublasLtMatmul(handle, desc, ctypes.byref(alpha_), ctypes.c_uint64(a), la, ctypes.c_uint64(b), lb,
                               ctypes.byref(beta), ctypes.c_uint64(c), lc, ctypes.c_uint64(d), lc, results,
                               ctypes.c_uint64(workspace), ctypes.c_size_t(4096), None)
    assert status == 0, status
    for layout in layouts:
        assert lt.cublasLtMatrixLayoutDestroy(layout) == 0
    assert lt.cublasLtMatmulPreferenceDestroy(pref) == 0 and lt.cublasLtMatmulDescDestroy(desc) == 0
    assert cuda.cuCtxSynchronize() == 0
    return read(d)


print([gemm(alpha) for alpha in range(1, 5)])
print([gemm(2.0, with_bias=address) for address in (bias, bias, other_bias, bias)])
"""


@pytest.mark.sim_only(reason="the sim's cuBLASLt answers and library call counts; the client's side is the same on "
                      "any backend")
def test_cublaslt_matmuls_with_seen_descriptors_are_one_record(tmp_path) -> None:
    """PyTorch makes a cuBLASLt GEMM's descriptors anew for each GEMM. Kept in C, their heuristic answered in C,
    the GEMM itself is queued in the lane by C once the core has made the server's descriptors for those settings
    (kept.h's xpu_kept_lt_call), as it does when it answers the first heuristic question of a setting. A bias
    elsewhere, aligned alike, is the same setting: C moves the server's descriptor to it ahead of the GEMM. With
    the lane and without, the same results; with it the core sees no GEMM, and the server two calls fewer (without
    the lane the core sends the bias before each GEMM of a bias: under the shim it cannot know whether C moved
    the server's descriptor since)."""
    from conftest import start_server, with_and_without_lane

    from xpuremote.interpose.build import ensure_shim

    srv = start_server(tmp_path)
    try:
        runs = with_and_without_lane(LT_MATMUL_PROGRAM, srv.address, tmp_path, ensure_shim())
    finally:
        srv.stop()
    plain, with_bias = runs["1"][0].splitlines()
    row = [0.5 * sum(4 * j + i for j in range(4)) for i in range(4)]  # column-major a, b all 0.5, c all 1
    assert plain == str([[round(alpha * r + 0.5, 3) for _ in range(4) for r in row] for alpha in range(1, 5)])
    assert with_bias == str([[round(2 * r + 0.5 + scale * i, 3) for _ in range(4) for i, r in enumerate(row)]
                             for scale in (10, 10, 100, 10)])
    in_c, by_core = runs["1"][1], runs["0"][1]
    assert by_core["cublasLtMatmul"][0] == 8 and "cublasLtMatmul" not in in_c, (in_c, by_core)
    served = [int(n) for n in re.findall(r"library calls: .*?cublasLt=(\d+)", srv.log())]
    assert len(served) == 2 and served[0] == served[1] - 2, served


VERSION_PROGRAM = r"""
import ctypes
from xpuremote.interpose.build import LIBRARY_NAMES
cuda, lt, dnn = ctypes.CDLL("libcuda.so.1"), ctypes.CDLL(LIBRARY_NAMES[1]), ctypes.CDLL("libcudnn.so.9")
lt.cublasLtGetVersion.restype = dnn.cudnnGetVersion.restype = ctypes.c_size_t
assert cuda.cuInit(0) == 0
print([[dnn.cudnnGetVersion() for _ in range(5)], [lt.cublasLtGetVersion() for _ in range(5)]])
"""


def test_a_librarys_version_is_answered_in_c_after_the_first(tmp_path, server) -> None:
    """PyTorch asks cudnnGetVersion before each cuDNN operation (four times a gpt2_step_bf16 step): the version
    of the server's library, the session's for good. After the core's first answer C gives it (kept.h's
    XPU_KEPT_CONSTANT): the same answers with the lane and without, the core asked once."""
    from conftest import with_and_without_lane

    from xpuremote.interpose.build import ensure_shim

    runs = with_and_without_lane(VERSION_PROGRAM, server.address, tmp_path, ensure_shim())
    versions = json.loads(runs["1"][0])
    assert all(len(set(v)) == 1 and v[0] > 0 for v in versions), versions
    asked = {name: runs["1"][1][name][0] for name in ("cudnnGetVersion", "cublasLtGetVersion")}
    assert asked == {"cudnnGetVersion": 1, "cublasLtGetVersion": 1}, asked
    assert runs["0"][1]["cudnnGetVersion"][0] == 5, runs["0"][1]
