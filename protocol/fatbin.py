"""CUDA fat binaries, cubins and PTX: find an image in memory, list its entries, pick the one a GPU
would run, read each kernel's parameter layout (``cuLaunchKernel`` passes arguments without sizes) and
each device variable's size and initial contents.

Layouts below were checked against nvcc 13.0 output (see tests/test_fatbin.py).
"""

from __future__ import annotations

import ctypes
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import lz4.block
import zstandard

WRAPPER_MAGIC = 0x466243B1  # {u32 magic; u32 version; const void *data; void *ext}
FATBIN_MAGIC = 0xBA55ED50  # {u32 magic; u16 version; u16 header_size; u64 payload_size}
ELF_MAGIC = b"\x7fELF"

_KINDS = {1: "ptx", 2: "elf"}
_LZ4, _ZSTD = 0x2000, 0x8000  # fatbin entry flags

_SHT_SYMTAB, _SHT_SYMTAB_SHNDX, _SHN_XINDEX = 2, 18, 0xFFFF
# No contents in the file: SHT_NOBITS, and what relocatable (-rdc) cubins use instead for .nv.global,
# .nv.local.*, .nv.shared.* and reserved shared memory (SHT_CUDA_GLOBAL, _LOCAL, _SHARED, _SHARED_RESERVED).
_NOBITS = {8, 0x70000007, 0x70000009, 0x7000000A, 0x70000015}
_EM_CUDA = 190  # e_machine of cubins
_STT_OBJECT, _STT_FUNC, _STT_CUDA_OBJECT = 1, 2, 13  # -rdc cubins type variables STT_CUDA_OBJECT
_STO_CUDA_ENTRY = 0x10  # st_other bit on __global__ functions (not on __device__ helpers)
# Where variables live. Not .nv.shared.*, whose variables -rdc cubins list too, nor bank 0, the kernel
# parameters (sm_80 -rdc cubins have a _param symbol in .nv.constant0.<kernel>).
_VARIABLE_SECTION = re.compile(r"\.nv\.global(\.init)?|\.nv\.constant[1-9]\d*")
_EIFMT_SVAL = 4  # .nv.info record with a payload; other formats keep their value in the u16
_EIATTR_KPARAM_INFO, _EIATTR_CBANK_PARAM_SIZE, _EIATTR_KPARAM_INFO_V2 = 0x17, 0x19, 0x45

Reader = Callable[[int, int], bytes]  # (offset, length) -> bytes, over a buffer or process memory


@dataclass(frozen=True)
class Entry:
    """One image inside a fatbin."""

    kind: str  # "ptx" | "elf"
    sm: int  # e.g. 90 for sm_90
    data: bytes  # decompressed; PTX ends with exactly one NUL, ELF is cut to its own size


@dataclass(frozen=True)
class KernelParam:
    offset: int
    size: int


@dataclass(frozen=True)
class Kernel:
    name: str  # mangled
    params: tuple[KernelParam, ...]
    param_bytes: int  # end of the last parameter, unpadded (what the cubin records)


# ---------------------------------------------------------------------------------------------- images


def image_from_pointer(addr: int) -> bytes:
    """The whole image at ``addr``: a fatbin wrapper, a fatbin header, an ELF image or PTX text."""
    head = ctypes.string_at(addr, 4)
    magic = int.from_bytes(head, "little")
    if magic == WRAPPER_MAGIC:
        data = ctypes.c_void_p.from_address(addr + 8).value
        if not data:
            raise ValueError("fatbin wrapper with a null data pointer")
        return image_from_pointer(data)
    if magic == FATBIN_MAGIC:
        # Only this one fatbin: a .nv_fatbin section holds one per translation unit back to back, each
        # registered through its own wrapper, so following the next header would take in its neighbours.
        _, _, header_size, payload_size = struct.unpack("<IHHQ", ctypes.string_at(addr, 16))
        return ctypes.string_at(addr, header_size + payload_size)
    if head == ELF_MAGIC:
        return ctypes.string_at(addr, _elf_size(lambda off, n: ctypes.string_at(addr + off, n)))
    return ctypes.string_at(addr) + b"\0"


def entries(image: bytes) -> list[Entry]:
    """The images in a fatbin (or in several concatenated ones), or a bare ELF / PTX image as one entry."""
    if image[:4] == ELF_MAGIC:
        return [Entry("elf", elf_sm(image), image[: _elf_size(_bytes_reader(image))])]
    if _u32(image, 0) == FATBIN_MAGIC:
        return list(_fatbin_entries(image))
    ptx = _ptx_bytes(image)
    return [Entry("ptx", _ptx_sm(ptx), ptx)]


def select(image: bytes, sm: int) -> Entry | None:
    """The entry a GPU of compute capability ``sm`` runs: SASS of its major version built for an sm no
    newer than it (the newest such), else the newest PTX it can JIT; None when nothing fits."""
    found = entries(image)
    elfs = [e for e in found if e.kind == "elf" and e.sm // 10 == sm // 10 and e.sm <= sm]
    ptxs = [e for e in found if e.kind == "ptx" and e.sm <= sm]
    return max(elfs or ptxs, key=lambda e: e.sm, default=None)


class NoBinaryForGpu(ValueError):
    """A well-formed module image without code that a GPU of the given compute capability runs."""


def check_module_image(image: bytes, sm: int) -> str:
    """What a server takes as a module image: what the client library sends, the entry of a fatbin that a
    GPU of compute capability ``sm`` runs (a cubin, or PTX text). Its kind, "elf" or "ptx"; ValueError for
    anything else (the driver's CUDA_ERROR_INVALID_IMAGE), NoBinaryForGpu for code built for another GPU
    (CUDA_ERROR_NO_BINARY_FOR_GPU)."""
    if image[:4] == ELF_MAGIC:
        if len(image) < 64 or struct.unpack_from("<H", image, 0x12)[0] != _EM_CUDA:
            raise ValueError("an ELF image, but not a CUDA cubin")
        if _elf_size(_bytes_reader(image)) > len(image):
            raise ValueError("a cubin cut short: its tables point past its end")
        kind, built = "elf", elf_sm(image)
        runs = built // 10 == sm // 10 and built <= sm
    else:
        try:
            image.decode()
        except UnicodeDecodeError:
            raise ValueError("neither a cubin nor PTX text") from None
        if not _PTX_VERSION.search(image):
            raise ValueError("not PTX: no .version line")
        kind, built = "ptx", _ptx_sm(image)
        runs = built <= sm  # the driver compiles PTX for the GPU, not for an older one
    if not runs:
        raise NoBinaryForGpu(f"{'a cubin' if kind == 'elf' else 'PTX'} for sm_{built}, but the GPU is sm_{sm}")
    return kind


def elf_sm(elf: bytes) -> int:
    """The sm a cubin was built for. ELF ABI version 7 (CUDA <= 12) keeps it in the low byte of e_flags;
    version 8 (CUDA 13, also Blackwell cubins of CUDA 12.8+) in bits 8..15."""
    flags = _u32(elf, 0x30)
    return flags & 0xFF if elf[8] <= 7 else (flags >> 8) & 0xFF


def _fatbin_entries(image: bytes) -> Iterator[Entry]:
    pos = 0
    while pos + 16 <= len(image) and _u32(image, pos) == FATBIN_MAGIC:
        _, _, header_size, payload_size = struct.unpack_from("<IHHQ", image, pos)
        end = min(pos + header_size + payload_size, len(image))
        at = pos + header_size
        while at + 16 <= end:
            kind, entry_header_size, size = struct.unpack_from("<H2xIQ", image, at)
            if entry_header_size < 16:  # malformed: an entry that does not move on would loop forever
                return
            payload = image[at + entry_header_size : at + entry_header_size + size]
            if kind in _KINDS:
                yield _entry(_KINDS[kind], image, at, payload)
            at += entry_header_size + size
        if end <= pos:  # a header that does not move on
            return
        pos = end


def _entry(kind: str, image: bytes, at: int, payload: bytes) -> Entry:
    # Entry header: @16 u32 compressed size, @28 u32 sm, @40 u64 flags, @56 u64 uncompressed size.
    compressed_size, sm = _u32(image, at + 16), _u32(image, at + 28)
    flags, uncompressed_size = _u64(image, at + 40), _u64(image, at + 56)
    if flags & _ZSTD:
        data = zstandard.ZstdDecompressor().decompress(payload[:compressed_size], uncompressed_size)
    elif flags & _LZ4:
        data = lz4.block.decompress(payload[:compressed_size], uncompressed_size=uncompressed_size)
    else:
        data = payload  # padded to 8 bytes: trimmed below
    if kind == "ptx":
        return Entry(kind, sm, _ptx_bytes(data))
    return Entry(kind, sm, data[: _elf_size(_bytes_reader(data))])


def _ptx_bytes(data: bytes) -> bytes:
    # The driver wants NUL-terminated PTX; the fatbin pads it with more NULs, which would change its hash.
    end = data.find(b"\0")
    return data + b"\0" if end < 0 else data[: end + 1]


_PTX_VERSION = re.compile(rb"^[^\S\n]*\.version\s+\d+\.\d+", re.MULTILINE)


def _ptx_sm(ptx: bytes) -> int:
    # Not ^\s*: that crosses lines, and retried at each of many blank lines it is quadratic.
    match = re.search(rb"^[^\S\n]*\.target\s+sm_(\d+)", ptx, re.MULTILINE)
    if not match:
        raise ValueError("neither a fatbin, an ELF image nor PTX with a .target sm_XX line")
    return int(match.group(1))


# ------------------------------------------------------------------------------------------------- ELF


class _Section(NamedTuple):
    name: int  # offset in the section-name string table
    type: int
    offset: int
    size: int
    link: int


class _Symbol(NamedTuple):
    name: str
    type: int  # STT_*
    other: int
    section: int
    value: int
    size: int


def _elf_size(read: Reader) -> int:
    """End of the last thing an ELF image holds: header tables or section/segment contents."""
    header = read(0, 64)
    if header[4] != 2:
        raise ValueError("only 64-bit ELF images are supported")
    phoff, shoff = struct.unpack_from("<QQ", header, 0x20)
    phentsize, phnum, shentsize = struct.unpack_from("<HHH", header, 0x36)
    sections = _sections(read, header)
    ends = [64, phoff + phentsize * phnum, shoff + shentsize * len(sections)]
    ends += [s.offset + s.size for s in sections if s.type not in _NOBITS]
    segments = read(phoff, phentsize * phnum)
    for i in range(phnum):  # relocatable cubins (-rdc) have none
        p_offset, _, _, p_filesz = struct.unpack_from("<4Q", segments, i * phentsize + 8)
        ends.append(p_offset + p_filesz)
    return max(ends)


def _sections(read: Reader, header: bytes) -> list[_Section]:
    shoff = _u64(header, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", header, 0x3A)
    if shoff and not shnum:  # 0xff00 sections or more (huge cubins): section 0's sh_size has the count
        shnum = _u64(read(shoff + 0x20, 8), 0)
    table = read(shoff, shentsize * shnum) if shoff else b""
    return [_Section(*struct.unpack_from("<II16xQQI", table, at)) for at in range(0, len(table), shentsize)]


def kernels(elf: bytes) -> dict[str, Kernel]:
    """Every kernel of a cubin, by mangled name, with its parameter layout from ``.nv.info.<name>``."""
    sections, names = _section_table(elf)
    by_name = dict(zip(names, sections))
    found: dict[str, Kernel] = {}
    for symbol in _symbols(elf, sections):
        # Not ".nv.info.<name> exists": __device__ functions of -rdc code have one as well.
        if symbol.type == _STT_FUNC and symbol.other & _STO_CUDA_ENTRY:
            info = by_name.get(".nv.info." + symbol.name, _Section(0, 0, 0, 0, 0))
            found[symbol.name] = _kernel(symbol.name, elf[info.offset : info.offset + info.size])
    return found


def globals_(elf: bytes) -> dict[str, tuple[int, bytes | None]]:
    """Every ``__device__``, ``__constant__`` and ``__managed__`` variable a cubin defines, by symbol name
    (mangled unless at global scope or extern "C"; with -rdc, statics are renamed ``__nv_static_...``),
    mapped to (size, initial contents), the contents None for a variable in .nv.global (no initializer)."""
    sections, names = _section_table(elf)
    found = {}
    for symbol in _symbols(elf, sections):
        where = names[symbol.section] if symbol.section < len(names) else ""  # not SHN_ABS and the like
        if symbol.type in (_STT_OBJECT, _STT_CUDA_OBJECT) and _VARIABLE_SECTION.fullmatch(where):
            section = sections[symbol.section]
            start = section.offset + symbol.value
            contents = None if section.type in _NOBITS else elf[start : start + symbol.size]
            found[symbol.name] = (symbol.size, contents)
    return found


def variable_bytes(elf: bytes) -> int:
    """Device memory a cubin's variables take when loaded: the sizes of the sections that hold them
    (.nv.global takes no room in the file, so a small image can ask for gigabytes)."""
    sections, names = _section_table(elf)
    return sum(s.size for s, name in zip(sections, names) if _VARIABLE_SECTION.fullmatch(name))


def _section_table(elf: bytes) -> tuple[list[_Section], list[str]]:
    sections = _sections(_bytes_reader(elf), elf[:64])
    shstrndx = struct.unpack_from("<H", elf, 0x3E)[0]
    if shstrndx == 0xFFFF:  # SHN_XINDEX: the real index is in section 0's sh_link
        shstrndx = sections[0].link
    return sections, [_cstr(elf, sections[shstrndx].offset + s.name) for s in sections]


def _symbols(elf: bytes, sections: list[_Section]) -> Iterator[_Symbol]:
    for index, symtab in enumerate(sections):
        if symtab.type != _SHT_SYMTAB:
            continue
        strings = sections[symtab.link].offset
        # Huge cubins: section indices of 0xff00 and over are in .symtab_shndx, a u32 for each symbol.
        xindex = next((s.offset for s in sections if s.type == _SHT_SYMTAB_SHNDX and s.link == index), 0)
        for i, at in enumerate(range(symtab.offset, symtab.offset + symtab.size, 24)):
            name, info, other, section, value, size = struct.unpack_from("<IBBHQQ", elf, at)
            if section == _SHN_XINDEX:
                section = _u32(elf, xindex + 4 * i)
            yield _Symbol(_cstr(elf, strings + name), info & 0xF, other, section, value, size)


def _kernel(name: str, nv_info: bytes) -> Kernel:
    params: dict[int, KernelParam] = {}  # by ordinal: ptxas lists them last to first
    total = None
    for attribute, value, payload in _nv_info_records(nv_info):
        if attribute == _EIATTR_KPARAM_INFO:  # u32 index; u16 ordinal; u16 offset; u32 flags (size in 18..31)
            _, ordinal, offset, flags = struct.unpack("<IHHI", payload)
            params[ordinal] = KernelParam(offset, (flags >> 18) & 0x3FFF)
        elif attribute == _EIATTR_KPARAM_INFO_V2:  # kernels with large parameters: the size is a plain u16
            _, ordinal, offset, size = struct.unpack("<IHHH2x", payload)
            params[ordinal] = KernelParam(offset, size)
        elif attribute == _EIATTR_CBANK_PARAM_SIZE:
            total = value
    ordered = tuple(params[i] for i in sorted(params))
    if total is None:
        total = max((p.offset + p.size for p in ordered), default=0)
    return Kernel(name, ordered, total)


def _nv_info_records(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(attribute, u16 value or payload length, payload): records are {u8 format; u8 attribute; u16}
    and only EIFMT_SVAL is followed by a payload."""
    at = 0
    while at + 4 <= len(data):
        fmt, attribute, value = struct.unpack_from("<BBH", data, at)
        at += 4
        payload = data[at : at + value] if fmt == _EIFMT_SVAL else b""
        at += len(payload)
        yield attribute, value, payload


# ------------------------------------------------------------------------------------------------- PTX

# Linear time whatever the input: a client sends this text, the server parses it. One pass over comments and
# strings: an unclosed "/*" ends it (a search for "*/" that fails once fails from every later "/*" too, which a
# plain substitution would try, each time to the end: quadratic). The patterns below cannot fail after their
# first character, or cannot cross a line.
_LEXEME = re.compile(r'//[^\n]*|/\*.*?\*/|"[^"\n]*"?|/\*', re.DOTALL)  # strings (.file, .pragma): one line
_ENTRY_HEAD = re.compile(r"\.entry\s+([\w$%]+)\s*")
_PARAM_TYPE = re.compile(r"\.(?:[usbf]|bf)(\d+)$")
_DIMENSION = re.compile(r"\[(\d+)\]")
# The driver takes at most 32764 bytes of parameters; a bound far above it keeps the size arithmetic small.
_MAX_PARAM_BYTES = 1 << 20


def ptx_kernels(ptx: str) -> dict[str, Kernel]:
    """Every ``.entry`` of PTX text with its parameter layout, laid out the way the driver does."""
    code = _ptx_code(ptx)
    found, at = {}, 0
    while match := _ENTRY_HEAD.search(code, at):
        name, at, declarations = match.group(1), match.end(), ""
        if code.startswith("(", at):
            close = code.find(")", at)
            if close < 0:
                raise ValueError(f"PTX .entry {name}: its parameter list is not closed")
            declarations, at = code[at + 1 : close], close + 1
        params, end = [], 0
        for decl in filter(str.strip, declarations.split(",")):
            size, align = _ptx_param(decl.split())
            offset = -(-end // align) * align
            params.append(KernelParam(offset, size))
            end = offset + size
        found[name] = Kernel(name, tuple(params), end)
    return found


def _ptx_code(ptx: str) -> str:
    """PTX without its comments, and with every string literal emptied (``""``)."""
    return _LEXEME.sub(_blank, ptx)


def _blank(lexeme: re.Match[str]) -> str:
    text = lexeme.group()
    if text == "/*":
        raise ValueError("PTX has a /* comment that is not closed")
    return '""' if text[0] == '"' else " " if text[1] == "*" else ""  # a comment still separates tokens


def _ptx_param(tokens: list[str]) -> tuple[int, int]:
    """(size, alignment) of ``.param [.align N] .type [.ptr [.space] [.align N]] name[dims]``."""
    elem = next((int(m.group(1)) // 8 for t in tokens if (m := _PARAM_TYPE.match(t))), None)
    if not elem:
        raise ValueError(f"PTX parameter {' '.join(tokens)[:100]!r} has no type")
    size = elem
    for dim in _DIMENSION.findall(tokens[-1]):
        size *= int(dim)
        if size > _MAX_PARAM_BYTES:  # checked as it grows: a product of many large numbers is slow
            raise ValueError(f"PTX parameter {tokens[-1][:100]!r} is larger than any kernel parameter can be")
    # After .ptr, .align describes the memory pointed to, not the parameter itself.
    head = tokens[: tokens.index(".ptr")] if ".ptr" in tokens else tokens
    align = int(head[head.index(".align") + 1]) if ".align" in head else elem
    return size, align


# ------------------------------------------------------------------------------------------------ bytes


def _bytes_reader(data: bytes) -> Reader:
    return lambda offset, length: data[offset : offset + length]


def _u64(data: bytes, offset: int) -> int:
    return struct.unpack_from("<Q", data, offset)[0]


def _u32(data: bytes, offset: int) -> int:
    return struct.unpack_from("<I", data, offset)[0] if len(data) >= offset + 4 else 0


def _cstr(data: bytes, offset: int) -> str:
    return data[offset : data.index(b"\0", offset)].decode()
