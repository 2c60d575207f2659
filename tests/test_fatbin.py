"""protocol.fatbin against what nvcc really produces: fatbins (plain, zstd, LZ4), cubins and PTX."""

from __future__ import annotations

import ctypes
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from toolchain import nvcc_path

from xpuremote.protocol.fatbin import (
    FATBIN_MAGIC,
    WRAPPER_MAGIC,
    Entry,
    Kernel,
    KernelParam,
    entries,
    globals_,
    image_from_pointer,
    kernels,
    ptx_kernels,
    select,
)

NVCC = nvcc_path()
if NVCC is None:
    pytest.skip("nvcc not found ($NVCC, the nvidia-cuda-nvcc wheel or $PATH)", allow_module_level=True)

SOURCE = r"""
struct S12 { int a, b, c; };
struct alignas(16) A16 { float v[3]; };
struct Big { char x[20000]; };  // over 4 KiB: ptxas describes it with EIATTR_KPARAM_INFO_V2

__device__ __noinline__ float helper(float x) { return x * 2; }  // a function, not a kernel
extern "C" __global__ void mixed(float *p, int n, S12 s, double d, char c) { p[n] = helper(s.b + d + c); }
__global__ void reordered(char c, double d, float *p) { p[0] = c + d; }
__global__ void aligned(char c, A16 a, short s, long long q) { }
__global__ void noparams() { }
extern "C" __global__ void big(Big b, int *out) { out[0] = b.x[19999]; }
"""

GLOBALS_SOURCE = r"""
__device__ float table[4] = {1, 2, 3, 4};
__device__ int counter;
__constant__ double coeff[2] = {0.5, 2.0};
namespace ns { __device__ short inner = 7; }
static __device__ int hidden = 3;
__device__ char big[1 << 16];  // no initializer: in .nv.global, which -rdc gives no SHT_NOBITS type
__shared__ float scratch[8];  // not a device variable, though -rdc cubins list it
__global__ void use(float *p) {
    scratch[threadIdx.x] = p[1];
    p[0] = table[counter++] + coeff[1] + ns::inner + hidden + big[threadIdx.x] + scratch[3];
}
"""
EXPECTED_GLOBALS = {
    "table": (16, struct.pack("<4f", 1, 2, 3, 4)),
    "counter": (4, None),
    "coeff": (16, struct.pack("<2d", 0.5, 2.0)),
    "_ZN2ns5innerE": (2, struct.pack("<h", 7)),
    "hidden": (4, struct.pack("<i", 3)),
    "big": (1 << 16, None),
}


def _struct(*fields: type) -> type[ctypes.Structure]:
    return type("S", (ctypes.Structure,), {"_fields_": [(f"f{i}", t) for i, t in enumerate(fields)]})


# (size, alignment) of each parameter type, from the host's C ABI, which CUDA's parameter layout follows.
C_TYPES = (ctypes.c_void_p, ctypes.c_int, ctypes.c_double, ctypes.c_char, ctypes.c_short, ctypes.c_longlong)
PTR, INT, DOUBLE, CHAR, SHORT, LONGLONG = ((ctypes.sizeof(t), ctypes.alignment(t)) for t in C_TYPES)
S12 = (ctypes.sizeof(_struct(ctypes.c_int, ctypes.c_int, ctypes.c_int)), 4)
A16 = (16, 16)  # alignas(16): ctypes cannot express it before Python 3.13
BIG = (20000, 1)


def c_layout(*params: tuple[int, int]) -> Kernel:
    """Each parameter at the next offset its alignment allows; the total is the end of the last one."""
    laid, end = [], 0
    for size, align in params:
        offset = (end + align - 1) // align * align
        laid.append(KernelParam(offset, size))
        end = offset + size
    return Kernel("", tuple(laid), end)


EXPECTED = {
    "mixed": c_layout(PTR, INT, S12, DOUBLE, CHAR),
    "_Z9reorderedcdPf": c_layout(CHAR, DOUBLE, PTR),
    "_Z7alignedc3A16sx": c_layout(CHAR, A16, SHORT, LONGLONG),
    "_Z8noparamsv": c_layout(),
    "big": c_layout(BIG, PTR),
}
GENCODE = ("-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=[sm_90,compute_90]")


def assert_layouts(found: dict[str, Kernel]) -> None:
    assert {name: (k.params, k.param_bytes) for name, k in found.items()} == {
        name: (k.params, k.param_bytes) for name, k in EXPECTED.items()
    }
    assert all(k.name == name for name, k in found.items())


@pytest.fixture(scope="module")
def nvcc(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., bytes]:
    """nvcc(*flags, source="k.cu") -> the output file's bytes, compiled once per flag set."""
    workdir = tmp_path_factory.mktemp("fatbin")
    (workdir / "k.cu").write_text(SOURCE)
    (workdir / "globals.cu").write_text(GLOBALS_SOURCE)
    built: dict[tuple[str, ...], bytes] = {}

    def compile_(*flags: str, source: str = "k.cu") -> bytes:
        key = (source, *flags)
        if key not in built:
            out = workdir / f"out{len(built)}"
            subprocess.run([NVCC, *flags, "-o", str(out), source], cwd=workdir, check=True)
            built[key] = Path(out).read_bytes()
        return built[key]

    return compile_


def raw_entry_flags(image: bytes) -> list[tuple[int, int]]:
    """(kind, flags) of each entry, read straight from the documented header offsets."""
    found, at = [], 16
    while at < len(image):
        kind, header_size, size = struct.unpack_from("<H2xIQ", image, at)
        found.append((kind, struct.unpack_from("<Q", image, at + 40)[0] & 0xA000))
        at += header_size + size
    return found


@pytest.mark.parametrize(("arch", "flags"), [(80, ()), (90, ()), (90, ("-rdc=true",)), (120, ())])
def test_cubin(nvcc: Callable[..., bytes], arch: int, flags: tuple[str, ...]) -> None:
    cubin = nvcc(f"-arch=sm_{arch}", "--cubin", *flags)
    assert entries(cubin) == [Entry("elf", arch, cubin)]
    assert_layouts(kernels(cubin))  # helper() is in the symbol table (with -rdc, with its own .nv.info)


@pytest.mark.parametrize("flags", [(), ("-rdc=true",)])
@pytest.mark.parametrize("arch", [80, 90, 120])
def test_globals(nvcc: Callable[..., bytes], arch: int, flags: tuple[str, ...]) -> None:
    cubin = nvcc(f"-arch=sm_{arch}", "--cubin", *flags, source="globals.cu")
    found = globals_(cubin)
    (static,) = [name for name in found if name.endswith("hidden")]
    assert static == "hidden" or (flags and static.startswith("__nv_static_"))  # -rdc: made unique
    found["hidden"] = found.pop(static)
    assert found == EXPECTED_GLOBALS
    assert entries(cubin + b"\xa5" * (1 << 17))[0].data == cubin  # big takes no room in the file
    fatbin = nvcc(f"-arch=sm_{arch}", "--fatbin", *flags, source="globals.cu")
    assert select(fatbin, arch).data == cubin


def test_globals_of_huge_cubins(nvcc: Callable[..., bytes]) -> None:
    """From 0xff00 sections on (nvcc needs minutes to build one), st_shndx is SHN_XINDEX and the section
    index is in .symtab_shndx: move every index there, turning the SHT_NOTE section into .symtab_shndx."""
    cubin = nvcc("-arch=sm_90", "--cubin", source="globals.cu")
    patched = bytearray(cubin)
    shoff, shnum = struct.unpack_from("<Q", cubin, 0x28)[0], struct.unpack_from("<H", cubin, 0x3C)[0]
    types = [struct.unpack_from("<I", cubin, shoff + 64 * i + 4)[0] for i in range(shnum)]
    symtab, note = types.index(2), types.index(7)
    offset, size = struct.unpack_from("<QQ", cubin, shoff + 64 * symtab + 0x18)
    indices = b""
    for at in range(offset, offset + size, 24):
        indices += struct.pack("<I", struct.unpack_from("<H", cubin, at + 6)[0])
        struct.pack_into("<H", patched, at + 6, 0xFFFF)
    # sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link
    struct.pack_into("<IQQQQI", patched, shoff + 64 * note + 4, 18, 0, 0, len(patched), len(indices), symtab)
    assert globals_(bytes(patched) + indices) == globals_(cubin)


def test_ptx(nvcc: Callable[..., bytes]) -> None:
    ptx = nvcc("-arch=sm_90", "--ptx")
    assert entries(ptx) == [Entry("ptx", 90, ptx + b"\0")]
    assert_layouts(ptx_kernels(ptx.decode()))


ZSTD, LZ4 = 0x8000, 0x2000
ELF80, PTX90, ELF90 = (2, 80), (1, 90), (2, 90)


@pytest.mark.parametrize(("flags", "compressed"), [
    ((), {ELF80: 0, PTX90: ZSTD, ELF90: 0}),  # nvcc 13 compresses PTX only by default
    (("--no-compress",), {ELF80: 0, PTX90: 0, ELF90: 0}),
    (("-Xfatbin", "-compress-all"), {ELF80: ZSTD, PTX90: ZSTD, ELF90: ZSTD}),
    (("-Xfatbin", "-compress-all", "--compress-mode=speed"), {ELF80: LZ4, PTX90: LZ4, ELF90: LZ4}),
])
def test_fatbin(nvcc: Callable[..., bytes], flags: tuple[str, ...], compressed: dict) -> None:
    image = nvcc(*GENCODE, "--fatbin", *flags)
    found = entries(image)
    assert sorted((e.kind, e.sm) for e in found) == [("elf", 80), ("elf", 90), ("ptx", 90)]
    by_arch = {(2 if e.kind == "elf" else 1, e.sm): e for e in found}
    assert sorted(raw_entry_flags(image)) == sorted((kind_sm[0], c) for kind_sm, c in compressed.items())
    for arch in (80, 90):  # the decompressed SASS is byte for byte what --cubin writes
        assert by_arch[2, arch].data == nvcc(f"-arch=sm_{arch}", "--cubin")
        assert_layouts(kernels(by_arch[2, arch].data))
    ptx = by_arch[PTX90].data
    assert ptx.endswith(b"\0") and b"\0" not in ptx[:-1]
    assert_layouts(ptx_kernels(ptx.decode()))


@pytest.mark.parametrize(("sm", "chosen"), [
    (80, ("elf", 80)), (86, ("elf", 80)), (89, ("elf", 80)), (90, ("elf", 90)),
    (100, ("ptx", 90)), (120, ("ptx", 90)), (75, None),
])
def test_select(nvcc: Callable[..., bytes], sm: int, chosen: tuple[str, int] | None) -> None:
    entry = select(nvcc(*GENCODE, "--fatbin"), sm)
    assert (entry and (entry.kind, entry.sm)) == chosen


def test_select_bare_images(nvcc: Callable[..., bytes]) -> None:
    cubin, ptx = nvcc("-arch=sm_80", "--cubin"), nvcc("-arch=sm_90", "--ptx")
    assert select(cubin, 86) == Entry("elf", 80, cubin)
    assert select(cubin, 90) is None  # SASS does not run across major versions
    assert select(ptx, 100) == Entry("ptx", 90, ptx + b"\0")
    assert select(ptx, 89) is None


def test_concatenated_fatbins(nvcc: Callable[..., bytes]) -> None:
    first, second = nvcc(*GENCODE, "--fatbin"), nvcc("-arch=sm_120", "--fatbin", "-Xfatbin", "-compress-all")
    assert entries(first + second) == entries(first) + entries(second)
    assert select(first + second, 120) == Entry("elf", 120, nvcc("-arch=sm_120", "--cubin"))


def test_old_elf_abi_keeps_sm_in_the_low_byte(nvcc: Callable[..., bytes]) -> None:
    cubin = bytearray(nvcc("-arch=sm_90", "--cubin"))
    cubin[8] = 7  # EI_ABIVERSION of CUDA 12 cubins; e_flags as nvcc 12 writes it for sm_90
    struct.pack_into("<I", cubin, 0x30, 0x5A055A)
    assert entries(bytes(cubin))[0].sm == 90


class FatbinWrapper(ctypes.Structure):
    _fields_ = [("magic", ctypes.c_uint32), ("version", ctypes.c_uint32),
                ("data", ctypes.c_void_p), ("ext", ctypes.c_void_p)]


def in_memory(image: bytes) -> ctypes.Array:
    """The image followed by junk, so that a size read from the wrong place shows."""
    return ctypes.create_string_buffer(image + b"\xa5" * 4096, len(image) + 4096)


def test_image_from_pointer(nvcc: Callable[..., bytes]) -> None:
    fatbin = nvcc(*GENCODE, "--fatbin")
    memory = in_memory(fatbin + fatbin)  # a neighbouring fatbin is not part of this one
    assert image_from_pointer(ctypes.addressof(memory)) == fatbin
    wrapper = FatbinWrapper(WRAPPER_MAGIC, 1, ctypes.addressof(memory), None)
    assert image_from_pointer(ctypes.addressof(wrapper)) == fatbin

    for cubin in (nvcc("-arch=sm_90", "--cubin"), nvcc("-arch=sm_90", "--cubin", "-rdc=true")):
        assert image_from_pointer(ctypes.addressof(memory := in_memory(cubin))) == cubin

    ptx = nvcc("-arch=sm_90", "--ptx")
    memory = ctypes.create_string_buffer(ptx + b"\0junk")
    assert image_from_pointer(ctypes.addressof(memory)) == ptx + b"\0"


def test_ptx_syntax_nvcc_does_not_write() -> None:
    ptx = """
    .target sm_80  // comments, .ptr annotations, multi-dimensional arrays, no parameter list
    .visible .entry k(
        .param .u64 .ptr .global .align 16 k_param_0,  /* .align after .ptr is the pointee's */
        .param .u8 k_param_1,
        .param .align 8 .b8 k_param_2[2][3],
        .param .f16 k_param_3
    ) .maxntid 256, 1, 1
    { ret; }
    .entry bare { ret; }
    """
    assert ptx_kernels(ptx) == {
        "k": Kernel("k", (KernelParam(0, 8), KernelParam(8, 1), KernelParam(16, 6), KernelParam(22, 2)), 24),
        "bare": Kernel("bare", (), 0),
    }
    assert entries(ptx.encode()) == [Entry("ptx", 80, ptx.encode() + b"\0")]


@pytest.mark.parametrize("sizes", [(0, 0), (16, 16), (16, 1 << 40)],
                         ids=["empty header", "empty entry", "past the end"])
def test_malformed_fatbin_headers_end_the_walk(sizes: tuple[int, int]) -> None:
    """A header or entry whose sizes do not move the walk on once made it loop forever."""
    header_size, payload_size = sizes
    image = struct.pack("<IHHQ", FATBIN_MAGIC, 1, header_size, payload_size) + bytes(32)
    assert entries(image) == []
