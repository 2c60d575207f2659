"""What NVIDIA's libraries import from the libraries xpuremote replaces.

    python -m xpuremote.protocol.linked [DIR ...]

NVIDIA's libraries link each other: `libcusolver.so.12` needs `cublasSetEnvironmentMode@libcublas.so.13`,
NVIDIA's own `libcublas.so.13` (which PyTorch maps beside the replacement) needs cuBLASLt's internal
`cublasLt_for_cublas_*`. Once xpuremote's `libcublas.so.13` is loaded, every such import binds to it, so it
must export each one, or the importing library fails at `dlopen`. The generator (`protocol/generate.py`)
reads this list from the libraries in NVIDIA's wheels and exports every symbol of it that no header declares
as a refusal (`interpose/<lib>_entry_points.c`).

An import is attributed to a library by its symbol version (the `.gnu.version_r` entry names the file the
version comes from: `libcublas.so.13`), and an unversioned one by the DT_NEEDED library whose NVIDIA copy
defines it. Plain ELF64 reading: no binutils needed. Run as a module, it prints what each library imports
from each replaced one (DIR: folders of libraries; without them, those of the NVIDIA wheels the generator
reads headers from).
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SHT_DYNSYM, SHT_DYNAMIC = 11, 6
SHT_GNU_VERNEED, SHT_GNU_VERSYM = 0x6FFFFFFE, 0x6FFFFFFF
DT_NEEDED, DT_SONAME = 1, 14
SYMBOL_KINDS = {0: "NOTYPE", 1: "OBJECT", 2: "FUNC", 6: "TLS", 10: "IFUNC"}
STB_WEAK = 2


class ElfError(ValueError):
    pass


@dataclass(frozen=True)
class Import:
    name: str
    version: str | None  # the version node asked for (`libcublas.so.13`), None if unversioned
    source: str | None  # the file that version is needed from (.gnu.version_r), None if unversioned
    kind: str  # FUNC, OBJECT, ...
    weak: bool  # a weak reference: the library loads without it


@dataclass(frozen=True)
class SharedLibrary:
    path: Path
    soname: str | None
    needed: tuple[str, ...]
    imports: tuple[Import, ...]
    exports: frozenset[str]


@dataclass(frozen=True)
class Section:
    type: int
    offset: int
    size: int
    link: int
    entsize: int


def _sections(f) -> list[Section]:
    head = f.read(64)
    if head[:4] != b"\x7fELF":
        raise ElfError("not an ELF file")
    if head[4] != 2 or head[5] != 1:
        raise ElfError("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
    if not shoff or not shnum:
        raise ElfError("no section headers")
    f.seek(shoff)
    table = f.read(shentsize * shnum)
    out = []
    for i in range(shnum):
        _name, stype, _flags, _addr, offset, size, link, _info, _align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", table, i * shentsize)
        out.append(Section(stype, offset, size, link, entsize))
    return out


def _read(f, section: Section) -> bytes:
    f.seek(section.offset)
    return f.read(section.size)


def _string(table: bytes, at: int) -> str:
    return table[at:table.index(b"\0", at)].decode()


def _verneed(data: bytes, strings: bytes) -> dict[int, tuple[str, str]]:
    """Version index -> (version name, file it is needed from)."""
    out, at = {}, 0
    while True:
        _ver, count, file_at, aux, nxt = struct.unpack_from("<HHIII", data, at)
        file, aux_at = _string(strings, file_at), at + aux
        for _ in range(count):
            _hash, _flags, index, name_at, aux_next = struct.unpack_from("<IHHII", data, aux_at)
            out[index] = (_string(strings, name_at), file)
            aux_at += aux_next
        if not nxt:
            return out
        at += nxt


def read(path: Path) -> SharedLibrary:
    """A shared library's SONAME, DT_NEEDED, undefined dynamic symbols (with their versions) and exports."""
    with open(path, "rb") as f:
        sections = _sections(f)
        by_type = {s.type: s for s in sections}
        if SHT_DYNSYM not in by_type:
            raise ElfError("no dynamic symbol table")
        dynsym = by_type[SHT_DYNSYM]
        strings = _read(f, sections[dynsym.link])
        symbols = _read(f, dynsym)
        versym = _read(f, by_type[SHT_GNU_VERSYM]) if SHT_GNU_VERSYM in by_type else b""
        verneed = {}
        if SHT_GNU_VERNEED in by_type:
            section = by_type[SHT_GNU_VERNEED]
            verneed = _verneed(_read(f, section), _read(f, sections[section.link]))
        needed, soname = [], None
        if SHT_DYNAMIC in by_type:
            section = by_type[SHT_DYNAMIC]
            dynstr = _read(f, sections[section.link])
            for tag, value in struct.iter_unpack("<qQ", _read(f, section)):
                if tag == DT_NEEDED:
                    needed.append(_string(dynstr, value))
                elif tag == DT_SONAME:
                    soname = _string(dynstr, value)
    imports, exports = [], set()
    for i, (name_at, info, _other, shndx, _value, _size) in enumerate(struct.iter_unpack("<IBBHQQ", symbols)):
        name, bind = _string(strings, name_at), info >> 4
        if not name or bind not in (1, STB_WEAK):  # the null symbol, locals
            continue
        if shndx:
            exports.add(name)
            continue
        index = struct.unpack_from("<H", versym, 2 * i)[0] & 0x7FFF if versym else 0
        version, source = verneed.get(index, (None, None))
        imports.append(Import(name, version, source, SYMBOL_KINDS.get(info & 0xF, str(info & 0xF)), bind == STB_WEAK))
    return SharedLibrary(Path(path), soname, tuple(needed), tuple(imports), frozenset(exports))


def shared_libraries(dirs: Iterable[Path]) -> list[SharedLibrary]:
    """Every ELF shared library (`*.so`, `*.so.*`) directly in `dirs`; each file once, in name order."""
    files = {p.resolve(): p for d in dirs for p in sorted(Path(d).glob("*.so*")) if p.is_file()}
    out = []
    for path in sorted(files.values(), key=lambda p: (p.name, str(p))):
        try:
            out.append(read(path))
        except ElfError:
            continue  # a linker script, an archive's neighbour: nothing a loader binds
    return out


@dataclass(frozen=True)
class Imported:
    """A symbol NVIDIA's libraries import from a replaced library, and which of them import it."""
    name: str
    version: str | None
    kind: str
    importers: tuple[str, ...]


def imported_from(libraries: list[SharedLibrary], sonames: Iterable[str]) -> dict[str, dict[str, Imported]]:
    """Replaced SONAME -> symbol -> what `libraries` import of it. A library's own copy among `libraries`
    (NVIDIA's libcublas.so.13 beside the replacement) is an importer like any other."""
    wanted = set(sonames)
    defines = {lib.soname: lib.exports for lib in libraries if lib.soname}
    found: dict[str, dict[tuple[str, str | None, str], list[str]]] = {s: {} for s in wanted}
    for lib in libraries:
        for imp in lib.imports:
            source = imp.source if imp.version else next(
                (s for s in lib.needed if s in wanted and imp.name in defines.get(s, ())), None)
            if source in wanted:
                found[source].setdefault((imp.name, imp.version, imp.kind), []).append(lib.path.name)
    out: dict[str, dict[str, Imported]] = {}
    for soname, rows in found.items():
        out[soname] = {}
        for (name, version, kind), importers in sorted(rows.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
            if name in out[soname]:
                raise ElfError(f"{name} is imported from {soname} under two versions or kinds; "
                               "the replacement gives each symbol one")
            out[soname][name] = Imported(name, version, kind, tuple(sorted(set(importers))))
    return out


def wheel_library_dirs(include_dirs: Iterable[Path] = ()) -> list[Path]:
    """The `lib` folders of NVIDIA's wheels: beside each include folder given, and every `nvidia/*/lib` of
    this Python and of the project's `.venv-torch` (where PyTorch's dependencies bring them)."""
    import nvidia  # namespace package of NVIDIA's wheels

    root = Path(__file__).resolve().parent.parent
    bases = [Path(b) for b in nvidia.__path__] + sorted(root.glob(".venv-torch/lib/python3*/site-packages/nvidia"))
    found = [Path(i).parent / "lib" for i in include_dirs] + [d for b in bases for d in sorted(b.glob("*/lib"))]
    return [d for d in dict.fromkeys(found) if d.is_dir()]


def main(argv: list[str]) -> int:
    from . import mathlibs
    from .calls import CALLS

    dirs = [Path(a) for a in argv] or wheel_library_dirs()
    sonames = {lib.soname: lib for lib in mathlibs.LIBRARIES}
    outcome = {"unsupported": "refused by the client", "local": "answered by the client"}
    for soname, symbols in imported_from(shared_libraries(dirs), sonames).items():
        by_importer: dict[str, list[Imported]] = {}
        for sym in symbols.values():
            for importer in sym.importers:
                by_importer.setdefault(importer, []).append(sym)
        for importer, syms in sorted(by_importer.items()):
            print(f"{importer} -> {soname}: {len(syms)} symbols")
            said: dict[str, list[str]] = {}
            returns = mathlibs.api(sonames[soname]).RETURNS
            for sym in syms:
                call = CALLS.get(sym.name)
                what = ("refused in C (no header declares it)" if call is None
                        else "answered in C (a status text)" if returns.get(sym.name) == "const char *"
                        else outcome.get(call.cls, "forwarded"))
                said.setdefault(what, []).append(sym.name)
            for what, names in sorted(said.items()):
                print(f"  {what}: {len(names)}: {' '.join(names)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
