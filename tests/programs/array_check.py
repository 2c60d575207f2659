"""CUDA arrays and texture/surface objects through cuda-python's driver bindings (run under the shim, or
natively on a GPU): `python array_check.py`.

Checks and sections as tests/programs/checks.py says; XPUREMOTE guards what only xpuremote refuses
(mipmapped arrays).
"""

from __future__ import annotations

import ctypes

from checks import XPUREMOTE, check, fails, finish, ok, section
from cuda.bindings import driver as cu

R = cu.CUresult
FLOAT = cu.CUarray_format.CU_AD_FORMAT_FLOAT
U8 = cu.CUarray_format.CU_AD_FORMAT_UNSIGNED_INT8
HOST = cu.CUmemorytype.CU_MEMORYTYPE_HOST
DEVICE = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
ARRAY = cu.CUmemorytype.CU_MEMORYTYPE_ARRAY


def address(buf: ctypes.Array) -> int:
    return ctypes.addressof(buf)


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(n))


def array_2d(width: int, height: int, fmt=FLOAT, channels: int = 1) -> object:
    desc = cu.CUDA_ARRAY_DESCRIPTOR()
    desc.Width, desc.Height, desc.Format, desc.NumChannels = width, height, fmt, channels
    return ok(cu.cuArrayCreate(desc), f"cuArrayCreate {width}x{height}")


def array_3d(width: int, height: int, depth: int, fmt=FLOAT, channels: int = 1, flags: int = 0) -> object:
    desc = cu.CUDA_ARRAY3D_DESCRIPTOR()
    desc.Width, desc.Height, desc.Depth = width, height, depth
    desc.Format, desc.NumChannels, desc.Flags = fmt, channels, flags
    return ok(cu.cuArray3DCreate(desc), f"cuArray3DCreate {width}x{height}x{depth}")


FIELDS = {"x": "XInBytes", "y": "Y", "z": "Z", "pitch": "Pitch", "height": "Height"}


def set_sides(p: object, src: dict, dst: dict, fields: tuple[str, ...]) -> object:
    """Both sides of a CUDA_MEMCPY2D/3D: the memory kind, where (host, device or array) and `fields` (0 if absent)."""
    for prefix, side in (("src", src), ("dst", dst)):
        setattr(p, f"{prefix}MemoryType", side["kind"])
        where = "Host" if side["kind"] == HOST else "Device" if side["kind"] == DEVICE else "Array"
        setattr(p, f"{prefix}{where}", side["where"])
        for field in fields:
            setattr(p, f"{prefix}{FIELDS[field]}", side.get(field, 0))
    return p


def copy_2d(src: dict, dst: dict, width: int, height: int, stream: object = None) -> object:
    """A CUDA_MEMCPY2D from two sides given as {kind, where, x, y, pitch}."""
    p = set_sides(cu.CUDA_MEMCPY2D(), src, dst, ("x", "y", "pitch"))
    p.WidthInBytes, p.Height = width, height
    return cu.cuMemcpy2D(p) if stream is None else cu.cuMemcpy2DAsync(p, stream)


def copy_3d(src: dict, dst: dict, width: int, height: int, depth: int, stream: object = None,
            peer: bool = False) -> object:
    """A CUDA_MEMCPY3D, or with `peer` a CUDA_MEMCPY3D_PEER whose sides name the current context."""
    p = set_sides(cu.CUDA_MEMCPY3D_PEER() if peer else cu.CUDA_MEMCPY3D(), src, dst, ("x", "y", "z", "pitch", "height"))
    p.WidthInBytes, p.Height, p.Depth = width, height, depth
    if peer:
        p.srcContext = p.dstContext = ctx
        return cu.cuMemcpy3DPeer(p) if stream is None else cu.cuMemcpy3DPeerAsync(p, stream)
    return cu.cuMemcpy3D(p) if stream is None else cu.cuMemcpy3DAsync(p, stream)


ok(cu.cuInit(0), "cuInit")
dev = ok(cu.cuDeviceGet(0), "cuDeviceGet")
ctx = ok(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
stream = ok(cu.cuStreamCreate(0), "cuStreamCreate")


@section
def descriptors() -> None:
    widest = ok(cu.cuDeviceGetTexture1DLinearMaxWidth(FLOAT, 1, dev), "cuDeviceGetTexture1DLinearMaxWidth")
    check(widest >= 1 << 20, "a 1D linear texture may be wide", f"{widest}")
    arr = array_2d(64, 8, FLOAT, 2)
    desc = ok(cu.cuArrayGetDescriptor(arr), "cuArrayGetDescriptor")
    check((desc.Width, desc.Height, desc.Format, desc.NumChannels) == (64, 8, FLOAT, 2), "2D descriptor back",
          f"{desc.Width}x{desc.Height} {desc.Format} {desc.NumChannels}")
    desc3 = ok(cu.cuArray3DGetDescriptor(arr), "cuArray3DGetDescriptor of a 2D array")
    check((desc3.Width, desc3.Height, desc3.Depth, desc3.Flags) == (64, 8, 0, 0), "2D array's 3D descriptor",
          f"{desc3.Width}x{desc3.Height}x{desc3.Depth} flags {desc3.Flags}")
    ok(cu.cuArrayDestroy(arr), "cuArrayDestroy 2D")
    surface = int(cu.CUDA_ARRAY3D_SURFACE_LDST)
    arr3 = array_3d(16, 4, 3, U8, 4, surface)
    desc3 = ok(cu.cuArray3DGetDescriptor(arr3), "cuArray3DGetDescriptor")
    check((desc3.Width, desc3.Height, desc3.Depth, desc3.Format, desc3.NumChannels, desc3.Flags)
          == (16, 4, 3, U8, 4, surface), "3D descriptor back")
    ok(cu.cuArrayDestroy(arr3), "cuArrayDestroy 3D")


@section
def bad_input() -> None:
    fails(cu.cuArrayCreate(cu.CUDA_ARRAY_DESCRIPTOR()), (R.CUDA_ERROR_INVALID_VALUE, R.CUDA_ERROR_INVALID_CONTEXT),
          "cuArrayCreate of a zeroed descriptor")
    fails(cu.cuArray3DCreate(cu.CUDA_ARRAY3D_DESCRIPTOR()), (R.CUDA_ERROR_INVALID_VALUE,),
          "cuArray3DCreate of a zeroed descriptor")
    desc = cu.CUDA_ARRAY_DESCRIPTOR()
    desc.Width, desc.Height, desc.Format, desc.NumChannels = 8, 8, FLOAT, 3
    fails(cu.cuArrayCreate(desc), (R.CUDA_ERROR_INVALID_VALUE,), "cuArrayCreate of 3 channels")
    arr = array_2d(16, 4)  # rows of 64 bytes
    host = ctypes.create_string_buffer(1024)
    fails(copy_2d({"kind": HOST, "where": address(host), "pitch": 64}, {"kind": ARRAY, "where": arr, "x": 8},
                  64, 1), (R.CUDA_ERROR_INVALID_VALUE,), "a 2D copy past an array's row")
    fails(copy_2d({"kind": ARRAY, "where": arr, "y": 2}, {"kind": HOST, "where": address(host), "pitch": 64},
                  64, 3), (R.CUDA_ERROR_INVALID_VALUE,), "a 2D copy past an array's last row")
    fails(copy_3d({"kind": HOST, "where": address(host), "pitch": 64, "height": 4},
                  {"kind": ARRAY, "where": arr, "z": 1}, 64, 4, 1), (R.CUDA_ERROR_INVALID_VALUE,),
          "a 3D copy past a 2D array's one slice")
    ok(cu.cuArrayDestroy(arr), "cuArrayDestroy")
    line = array_2d(32, 0)  # 1D: 128 bytes
    fails(cu.cuMemcpyHtoA(line, 64, host, 128), (R.CUDA_ERROR_INVALID_VALUE,), "cuMemcpyHtoA past the end")
    ok(cu.cuArrayDestroy(line), "cuArrayDestroy 1D")


@section
def copies_2d() -> None:
    width, height = 24, 6  # float elements: rows of 96 bytes
    row = width * 4
    arr = array_2d(width, height)
    zeros = ctypes.create_string_buffer(row * height)
    ok(copy_2d({"kind": ARRAY, "where": arr}, {"kind": HOST, "where": address(zeros), "pitch": row}, row, height),
       "array to host (new array)")
    check(zeros.raw == bytes(row * height), "a new array reads as zeros")
    # host (pitch 128, from x=8, y=1) -> array
    hpitch = 128
    src = ctypes.create_string_buffer(pattern(hpitch * (height + 1), 3), hpitch * (height + 1))
    ok(copy_2d({"kind": HOST, "where": address(src), "x": 8, "y": 1, "pitch": hpitch}, {"kind": ARRAY, "where": arr},
               row, height), "host to array (pitch, offsets)")
    want = b"".join(src.raw[(1 + r) * hpitch + 8 : (1 + r) * hpitch + 8 + row] for r in range(height))
    back = ctypes.create_string_buffer(row * height)
    ok(copy_2d({"kind": ARRAY, "where": arr}, {"kind": HOST, "where": address(back), "pitch": row}, row, height),
       "array to host")
    check(back.raw == want, "host -> array -> host values")
    # a sub-rectangle of the array (x=16 bytes, y=2) into pitched device memory at (x=4, y=1)
    dpitch, sub_w, sub_h = 256, 48, 3
    dptr = ok(cu.cuMemAlloc(dpitch * 8), "cuMemAlloc")
    ok(cu.cuMemsetD8(dptr, 0, dpitch * 8), "cuMemsetD8")
    ok(copy_2d({"kind": ARRAY, "where": arr, "x": 16, "y": 2}, {"kind": DEVICE, "where": dptr, "x": 4, "y": 1,
                                                                "pitch": dpitch}, sub_w, sub_h, stream),
       "array to device (async, offsets)")
    ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    dev_bytes = ctypes.create_string_buffer(dpitch * 8)
    ok(cu.cuMemcpyDtoH(dev_bytes, dptr, dpitch * 8), "cuMemcpyDtoH")
    got = [dev_bytes.raw[(1 + r) * dpitch + 4 : (1 + r) * dpitch + 4 + sub_w] for r in range(sub_h)]
    check(got == [want[(2 + r) * row + 16 : (2 + r) * row + 16 + sub_w] for r in range(sub_h)],
          "array -> device values")
    check(dev_bytes.raw[:dpitch] == bytes(dpitch), "device rows outside the rectangle untouched")
    # device -> another array, and array -> array
    other = array_2d(width, height)
    ok(copy_2d({"kind": DEVICE, "where": dptr, "x": 4, "y": 1, "pitch": dpitch}, {"kind": ARRAY, "where": other,
                                                                                 "x": 0, "y": 3}, sub_w, sub_h),
       "device to array")
    third = array_2d(width, height)
    ok(copy_2d({"kind": ARRAY, "where": other, "y": 3}, {"kind": ARRAY, "where": third, "x": 40, "y": 1},
               sub_w, sub_h), "array to array")
    ok(copy_2d({"kind": ARRAY, "where": third}, {"kind": HOST, "where": address(back), "pitch": row}, row, height),
       "array to host")
    rows = [back.raw[r * row : (r + 1) * row] for r in range(height)]
    check([rows[1 + r][40 : 40 + sub_w] for r in range(sub_h)] == got, "device -> array -> array values")
    check(rows[0] == bytes(row) and rows[1][:40] == bytes(40), "array bytes outside the rectangle stay zero")
    for a in (arr, other, third):
        ok(cu.cuArrayDestroy(a), "cuArrayDestroy")
    ok(cu.cuMemFree(dptr), "cuMemFree")


@section
def copies_3d() -> None:
    width, height, depth = 8, 4, 3  # uint8 x 4 channels: rows of 32 bytes
    row = width * 4
    arr = array_3d(width, height, depth, U8, 4)
    hpitch, hheight = 40, 5  # host slices of 5 rows of 40 bytes
    src = ctypes.create_string_buffer(pattern(hpitch * hheight * depth, 11), hpitch * hheight * depth)
    ok(copy_3d({"kind": HOST, "where": address(src), "pitch": hpitch, "height": hheight},
               {"kind": ARRAY, "where": arr}, row, height, depth), "host to 3D array")
    back = ctypes.create_string_buffer(row * height * depth)
    ok(copy_3d({"kind": ARRAY, "where": arr}, {"kind": HOST, "where": address(back), "pitch": row, "height": height},
               row, height, depth, stream), "3D array to host (async)")
    ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    want = b"".join(src.raw[z * hpitch * hheight + y * hpitch : z * hpitch * hheight + y * hpitch + row]
                    for z in range(depth) for y in range(height))
    check(back.raw == want, "host -> 3D array -> host values")
    # slices 1..2, rows 1..2, bytes 8..23 into device memory (pitch 64, 4 rows a slice)
    dptr = ok(cu.cuMemAlloc(64 * 4 * 2), "cuMemAlloc")
    ok(copy_3d({"kind": ARRAY, "where": arr, "x": 8, "y": 1, "z": 1},
               {"kind": DEVICE, "where": dptr, "pitch": 64, "height": 4}, 16, 2, 2), "3D array to device")
    dev_bytes = ctypes.create_string_buffer(64 * 4 * 2)
    ok(cu.cuMemcpyDtoH(dev_bytes, dptr, len(dev_bytes)), "cuMemcpyDtoH")
    got = [dev_bytes.raw[z * 256 + y * 64 : z * 256 + y * 64 + 16] for z in range(2) for y in range(2)]
    check(got == [want[((1 + z) * height + 1 + y) * row + 8 : ((1 + z) * height + 1 + y) * row + 24]
                  for z in range(2) for y in range(2)], "3D array -> device values")
    # the peer forms: device -> device (rows of 16 bytes at pitch 32, 2 a slice), then device -> host, async
    packed = ok(cu.cuMemAlloc(32 * 2 * 2), "cuMemAlloc")
    ok(copy_3d({"kind": DEVICE, "where": dptr, "pitch": 64, "height": 4},
               {"kind": DEVICE, "where": packed, "pitch": 32, "height": 2}, 16, 2, 2, peer=True), "cuMemcpy3DPeer")
    peer_back = ctypes.create_string_buffer(16 * 4)
    ok(copy_3d({"kind": DEVICE, "where": packed, "pitch": 32, "height": 2},
               {"kind": HOST, "where": address(peer_back), "pitch": 16, "height": 2}, 16, 2, 2, stream, peer=True),
       "cuMemcpy3DPeerAsync")
    ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    check(peer_back.raw == b"".join(got), "3D peer copies' values")
    ok(cu.cuMemFree(packed), "cuMemFree")
    ok(cu.cuMemFree(dptr), "cuMemFree")
    ok(cu.cuArrayDestroy(arr), "cuArrayDestroy")


@section
def copies_1d() -> None:
    a = array_2d(64, 0)  # 1D, 256 bytes
    b = array_2d(64, 0)
    data = pattern(256, 5)
    ok(cu.cuMemcpyHtoA(a, 0, data, 256), "cuMemcpyHtoA")
    dptr = ok(cu.cuMemAlloc(256), "cuMemAlloc")
    ok(cu.cuMemsetD8(dptr, 0, 256), "cuMemsetD8")
    ok(cu.cuMemcpyAtoD(dptr, a, 16, 128), "cuMemcpyAtoD")
    ok(cu.cuMemcpyDtoA(b, 64, dptr, 128), "cuMemcpyDtoA")
    ok(cu.cuMemcpyAtoA(b, 0, a, 200, 56), "cuMemcpyAtoA")
    out = ctypes.create_string_buffer(256)
    ok(cu.cuMemcpyAtoH(out, b, 0, 256), "cuMemcpyAtoH")
    want = data[200:256] + bytes(8) + data[16:144] + bytes(64)
    check(out.raw == want, "1D copies' values")
    pinned = ok(cu.cuMemAllocHost(256), "cuMemAllocHost")
    ok(cu.cuMemcpyHtoAAsync(a, 0, out, 256, stream), "cuMemcpyHtoAAsync")
    ok(cu.cuMemcpyAtoHAsync(pinned, a, 0, 256, stream), "cuMemcpyAtoHAsync")
    ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    check(ctypes.string_at(pinned, 256) == want, "async 1D copies' values")
    ok(cu.cuMemFreeHost(pinned), "cuMemFreeHost")
    ok(cu.cuMemFree(dptr), "cuMemFree")
    ok(cu.cuArrayDestroy(a), "cuArrayDestroy")
    ok(cu.cuArrayDestroy(b), "cuArrayDestroy")


def texture_desc() -> object:
    tex = cu.CUDA_TEXTURE_DESC()
    clamp = cu.CUaddress_mode.CU_TR_ADDRESS_MODE_CLAMP
    tex.addressMode = [clamp, clamp, clamp]
    tex.filterMode = cu.CUfilter_mode.CU_TR_FILTER_MODE_POINT
    tex.flags = int(cu.CU_TRSF_READ_AS_INTEGER)
    return tex


@section
def texture_objects() -> None:
    arr = array_2d(16, 16)
    res = cu.CUDA_RESOURCE_DESC()
    res.resType = cu.CUresourcetype.CU_RESOURCE_TYPE_ARRAY
    res.res.array.hArray = arr
    tex = ok(cu.cuTexObjectCreate(res, texture_desc(), None), "cuTexObjectCreate over an array")
    check(int(tex) != 0, "a texture object is not 0")
    back = ok(cu.cuTexObjectGetResourceDesc(tex), "cuTexObjectGetResourceDesc")
    check(back.resType == cu.CUresourcetype.CU_RESOURCE_TYPE_ARRAY and int(back.res.array.hArray) == int(arr),
          "the array resource back", f"{back.resType} {int(back.res.array.hArray):#x} vs {int(arr):#x}")
    desc = ok(cu.cuTexObjectGetTextureDesc(tex), "cuTexObjectGetTextureDesc")
    check(desc.filterMode == cu.CUfilter_mode.CU_TR_FILTER_MODE_POINT
          and list(desc.addressMode)[0] == cu.CUaddress_mode.CU_TR_ADDRESS_MODE_CLAMP, "the texture descriptor back")
    ok(cu.cuTexObjectDestroy(tex), "cuTexObjectDestroy")

    dptr = ok(cu.cuMemAlloc(4096), "cuMemAlloc")
    linear = cu.CUDA_RESOURCE_DESC()
    linear.resType = cu.CUresourcetype.CU_RESOURCE_TYPE_LINEAR
    linear.res.linear.devPtr = dptr
    linear.res.linear.format = FLOAT
    linear.res.linear.numChannels = 1
    linear.res.linear.sizeInBytes = 4096
    tex = ok(cu.cuTexObjectCreate(linear, texture_desc(), None), "cuTexObjectCreate over linear memory")
    back = ok(cu.cuTexObjectGetResourceDesc(tex), "cuTexObjectGetResourceDesc (linear)")
    check(back.resType == cu.CUresourcetype.CU_RESOURCE_TYPE_LINEAR and int(back.res.linear.devPtr) == int(dptr)
          and back.res.linear.sizeInBytes == 4096, "the linear resource back")
    ok(cu.cuTexObjectDestroy(tex), "cuTexObjectDestroy (linear)")

    pitch2d = cu.CUDA_RESOURCE_DESC()
    pitch2d.resType = cu.CUresourcetype.CU_RESOURCE_TYPE_PITCH2D
    pitch2d.res.pitch2D.devPtr = dptr
    pitch2d.res.pitch2D.format = FLOAT
    pitch2d.res.pitch2D.numChannels = 1
    pitch2d.res.pitch2D.width, pitch2d.res.pitch2D.height, pitch2d.res.pitch2D.pitchInBytes = 16, 8, 512
    tex = ok(cu.cuTexObjectCreate(pitch2d, texture_desc(), None), "cuTexObjectCreate over pitch2D memory")
    ok(cu.cuTexObjectDestroy(tex), "cuTexObjectDestroy (pitch2D)")

    too_far = cu.CUDA_RESOURCE_DESC()
    too_far.resType = cu.CUresourcetype.CU_RESOURCE_TYPE_LINEAR
    too_far.res.linear.devPtr = int(dptr) + 2048
    too_far.res.linear.format = FLOAT
    too_far.res.linear.numChannels = 1
    too_far.res.linear.sizeInBytes = 4096
    if XPUREMOTE:  # the driver may accept a range past the allocation (it faults later, if ever read)
        fails(cu.cuTexObjectCreate(too_far, texture_desc(), None), (R.CUDA_ERROR_INVALID_VALUE,),
              "cuTexObjectCreate over memory past an allocation")
        mip = cu.CUDA_RESOURCE_DESC()
        mip.resType = cu.CUresourcetype.CU_RESOURCE_TYPE_MIPMAPPED_ARRAY
        fails(cu.cuTexObjectCreate(mip, texture_desc(), None), (R.CUDA_ERROR_NOT_SUPPORTED,),
              "cuTexObjectCreate over a mipmapped array")
    ok(cu.cuMemFree(dptr), "cuMemFree")
    ok(cu.cuArrayDestroy(arr), "cuArrayDestroy")


@section
def surface_objects() -> None:
    arr = array_3d(32, 8, 0, FLOAT, 1, int(cu.CUDA_ARRAY3D_SURFACE_LDST))
    res = cu.CUDA_RESOURCE_DESC()
    res.resType = cu.CUresourcetype.CU_RESOURCE_TYPE_ARRAY
    res.res.array.hArray = arr
    surf = ok(cu.cuSurfObjectCreate(res), "cuSurfObjectCreate")
    check(int(surf) != 0, "a surface object is not 0")
    back = ok(cu.cuSurfObjectGetResourceDesc(surf), "cuSurfObjectGetResourceDesc")
    check(int(back.res.array.hArray) == int(arr), "the surface's array back")
    ok(cu.cuSurfObjectDestroy(surf), "cuSurfObjectDestroy")
    ok(cu.cuArrayDestroy(arr), "cuArrayDestroy")
    plain = array_2d(32, 8)
    res.res.array.hArray = plain
    # the driver takes an array made without SURFACE_LDST (580.159 on an H200), though cuda.h asks for the flag
    surf = ok(cu.cuSurfObjectCreate(res), "cuSurfObjectCreate without SURFACE_LDST")
    ok(cu.cuSurfObjectDestroy(surf), "cuSurfObjectDestroy")
    ok(cu.cuArrayDestroy(plain), "cuArrayDestroy")


@section
def runtime_arrays() -> None:
    """NVIDIA's runtime over the same calls: cudaMallocArray, 2D copies to and from it, a texture object."""
    from cuda.bindings import runtime as rt

    def rt_ok(result: tuple, what: str) -> object:
        err, *values = result
        check(err == rt.cudaError_t.cudaSuccess, what, f"returned {err!r}")
        return None if not values else values[0] if len(values) == 1 else tuple(values)

    channel = rt_ok(rt.cudaCreateChannelDesc(32, 0, 0, 0, rt.cudaChannelFormatKind.cudaChannelFormatKindFloat),
                    "cudaCreateChannelDesc")
    arr = rt_ok(rt.cudaMallocArray(channel, 16, 4, 0), "cudaMallocArray")
    src = ctypes.create_string_buffer(pattern(256, 9), 256)
    rt_ok(rt.cudaMemcpy2DToArray(arr, 0, 0, address(src), 64, 64, 4, rt.cudaMemcpyKind.cudaMemcpyHostToDevice),
          "cudaMemcpy2DToArray")
    dst = ctypes.create_string_buffer(256)
    rt_ok(rt.cudaMemcpy2DFromArray(address(dst), 64, arr, 0, 0, 64, 4, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost),
          "cudaMemcpy2DFromArray")
    check(dst.raw == src.raw, "runtime host -> array -> host values")
    got = rt_ok(rt.cudaGetChannelDesc(arr), "cudaGetChannelDesc")
    check(got.x == 32 and got.f == rt.cudaChannelFormatKind.cudaChannelFormatKindFloat, "the array's channel back")
    res = rt.cudaResourceDesc()
    res.resType = rt.cudaResourceType.cudaResourceTypeArray
    res.res.array.array = arr
    tex = rt_ok(rt.cudaCreateTextureObject(res, rt.cudaTextureDesc(), None), "cudaCreateTextureObject")
    rt_ok(rt.cudaDestroyTextureObject(tex), "cudaDestroyTextureObject")
    rt_ok(rt.cudaFreeArray(arr), "cudaFreeArray")


ok(cu.cuStreamDestroy(stream), "cuStreamDestroy")
ok(cu.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")
finish()
