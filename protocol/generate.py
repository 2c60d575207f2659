"""Generate the driver API description from NVIDIA's own headers.

    python -m xpuremote.protocol.generate [--check] [INCLUDE_DIR ...]

Each INCLUDE_DIR holds a `cuda.h` and `cudaTypedefs.h` (the CUDA runtime wheels ship both;
without arguments the installed nvidia-cuda-runtime 13 and -cu12 wheels are used). List the
newest release first: where two releases declare the same symbol, the first wins. `--check`
writes nothing and fails if the committed files differ from what the headers give.
Writes two files, both committed and both marked as generated:

- `protocol/cuda_api.py`: every exported driver symbol with its C parameters, what each
  parameter type is (found by compiling a probe against the headers), the
  (name, version, per-thread) -> symbol variants that `cuGetProcAddress` answers, and the
  enumerators of `cuda.h`.
- `interpose/entry_points.c`: one exported C function per symbol. Each packs its arguments
  into 64-bit slots and enters the client through one dispatcher, so the shim builds with
  no CUDA header.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
API_OUT = ROOT / "protocol" / "cuda_api.py"
C_OUT = ROOT / "interpose" / "entry_points.c"

DECL_RE = re.compile(r"CUresult\s+(cu\w+)\s*\(([^;{}()]*)\)\s*;")
PFN_RE = re.compile(r"typedef\s+CUresult\s*\(\s*CUDAAPI\s*\*\s*PFN_(\w+?)_v(\d+)(_ptds|_ptsz)?\s*\)")
PROFILER_RE = re.compile(r"PFN_(\w+?)_v(\d+)\s*\)\s*\(([^;{}()]*)\)\s*;")
HANDLE_RE = re.compile(r"typedef\s+struct\s+\w+\s*\*\s*(\w+)\s*;")
ENUM_RE = re.compile(r"\b((?:CU|CUDA)_[A-Z0-9_]+)\s*=\s*([-0-9xXa-fA-FuUlL<>|()\s]+?)\s*[,}]")
VERSION_RE = re.compile(r"#define\s+CUDA_VERSION\s+(\d+)")
# cuda.h maps a few names to a different function, not to a suffixed variant of themselves.
ALIASES = {"cuGraphInstantiate": {12000: "cuGraphInstantiateWithFlags"}}


def preprocess(include: Path, *defines: str) -> str:
    cmd = ["gcc", "-E", "-P", "-D__attribute__(x)=", f"-I{include}", *[f"-D{d}" for d in defines], "-"]
    return subprocess.run(cmd, input="#include <cuda.h>\n", capture_output=True, text=True, check=True).stdout


C_KEYWORDS = {"int", "char", "short", "long", "float", "double", "void", "unsigned", "signed"}


def split_params(text: str) -> list[tuple[str, str]]:
    """'CUdeviceptr *dptr, size_t bytesize' -> [('CUdeviceptr *', 'dptr'), ('size_t', 'bytesize')]."""
    text = " ".join(text.split())
    if text in ("", "void"):
        return []
    params = []
    for i, part in enumerate(p.strip() for p in text.split(",")):
        m = re.match(r"^(.*?[\s*])(\w+)$", part)
        if m and m.group(2) not in C_KEYWORDS and m.group(1).strip() not in ("", "const"):
            ctype, name = m.group(1), m.group(2)
        else:  # unnamed parameter
            ctype, name = part, f"arg{i}"
        if ctype.strip() in ("unsigned", "signed"):
            ctype += " int"
        ctype = re.sub(r"\s*\*\s*", " *", ctype.strip()).replace("* *", "**").strip()
        params.append((ctype, name))
    return params


def declarations(include: Path) -> dict[str, list[tuple[str, str]]]:
    """Every function declared by cuda.h, legacy and per-thread variants included."""
    decls: dict[str, list[tuple[str, str]]] = {}
    for defines in ((), ("CUDA_API_PER_THREAD_DEFAULT_STREAM",), ("__CUDA_API_VERSION_INTERNAL",)):
        text = " ".join(preprocess(include, *defines).split())
        for name, params in DECL_RE.findall(text):
            decls.setdefault(name, split_params(params))
    # The profiler functions are declared in cudaProfiler.h, which the runtime wheels do not
    # ship; their typedefs (in a header they do ship) carry the same signatures.
    for name, _version, params in PROFILER_RE.findall((include / "cudaProfilerTypedefs.h").read_text()):
        decls.setdefault(name, split_params(params))
    return decls


def variants(include: Path, symbols: set[str]) -> list[tuple[str, int, int, str]]:
    """(name, version, per_thread, symbol) for each PFN typedef of cudaTypedefs.h.

    The n-th ABI version of a name is the n-th of `name`, `name_v2`, `name_v3`, ...
    that the library exports. A per-thread variant is the newest default-stream variant
    at or before its own version, with `_ptds`/`_ptsz` appended.
    """
    text = "".join((include / h).read_text() for h in ("cudaTypedefs.h", "cudaProfilerTypedefs.h"))
    by_name: dict[str, dict[str, set[int]]] = {}
    for name, version, suffix in PFN_RE.findall(text):
        by_name.setdefault(name, {}).setdefault(suffix, set()).add(int(version))
    out = []
    for name, by_suffix in by_name.items():
        candidates = [s for s in [name] + [f"{name}_v{i}" for i in range(2, 10)] if s in symbols]
        if not candidates:
            continue
        plain = sorted(by_suffix.get("", ()))
        default = {v: candidates[min(i, len(candidates) - 1)] for i, v in enumerate(plain)}
        out += [(name, v, 0, sym) for v, sym in default.items()]
        for suffix in ("_ptds", "_ptsz"):
            for v in sorted(by_suffix.get(suffix, ())):
                older = [default[p] for p in plain if p <= v] or [candidates[0]]
                if older[-1] + suffix in symbols:
                    out.append((name, v, 1, older[-1] + suffix))
    for name, by_version in ALIASES.items():
        out += [(name, v, 0, sym) for v, sym in by_version.items() if sym in symbols]
    return out


PROBE_HEAD = """#include <stdio.h>
#include <cuda.h>
typedef int CUoutput_mode; /* the one enum of cudaProfiler.h, a header the runtime wheels lack */
#define CLS(x) __builtin_classify_type(x)
int main(void) {
"""


def _run_probe(include: Path, body: list[str]) -> list[list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp, "probe.c"), Path(tmp, "probe")
        src.write_text(PROBE_HEAD + "\n".join(body) + "\nreturn 0; }\n")
        cmd = ["gcc", "-w", "-D__CUDA_API_VERSION_INTERNAL", f"-I{include}", str(src), "-o", str(exe)]
        subprocess.run(cmd, check=True)
        rows = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return [r.split("\t") for r in rows.splitlines()]


CLASS_NAMES = {"1": "int", "3": "int", "5": "ptr", "8": "float", "12": "struct", "0": "void", "h": "handle"}


def probe_types(include: Path, ctypes: set[str], handles: set[str]) -> dict[str, tuple]:
    """Ask the compiler what each parameter type is: (kind, size, signed, pointee class, pointee size)."""
    body = []
    for t in sorted(ctypes):
        q = json.dumps(t)
        base = t[:-1].replace("const ", "").strip() if t.endswith("*") else t
        if t in handles:
            body.append(f'printf("%s\\t5\\t8\\t-\\t0\\n", {q});')
        elif t.endswith("*") and (base in handles or base.endswith("*") or base == "void"):
            pcls = "h" if base in handles else "5" if base.endswith("*") else "0"
            body.append(f'printf("%s\\t5\\t8\\t{pcls}\\t8\\n", {q});')
        elif t.endswith("*"):
            body.append(f'printf("%s\\t5\\t8\\t%d\\t%zu\\n", {q}, CLS(*({t})0), sizeof(*({t})0));')
        else:
            body.append(f'{{ {t} v; printf("%s\\t%d\\t%zu\\t0\\t0\\n", {q}, CLS(v), sizeof(v)); }}')
    rows = _run_probe(include, body)
    ints = [t for t, cls, *_ in rows if cls in ("1", "3")]
    signed = {t for t, s in _run_probe(include, [
        f'printf("%s\\t%d\\n", {json.dumps(t)}, (int)(({t})-1 < ({t})0));' for t in ints]) if s == "1"}
    types = {}
    for t, cls, size, pcls, psize in rows:
        kind = "handle" if t in handles else CLASS_NAMES[cls]
        if kind == "ptr":
            types[t] = ("ptr", 8, 0, CLASS_NAMES.get(pcls, "opaque"), int(psize))
        else:
            types[t] = (kind, int(size), int(t in signed), "", 0)
    return types


def enums(include: Path) -> dict[str, int]:
    text = preprocess(include)
    out = {}
    for name, expr in ENUM_RE.findall(text):  # literals and shifts such as `1 << 3`
        expr = re.sub(r"(?<=[0-9a-fA-F])[uUlL]+\b", "", expr)
        out[name] = eval(expr, {"__builtins__": {}})  # noqa: S307 - digits and operators only
    return out


def error_docs(include: Path) -> dict[str, str]:
    """First sentence of the doc comment in front of each CUDA_ERROR_* enumerator."""
    text = (include / "cuda.h").read_text()
    out = {}
    for m in re.finditer(r"\*/\s*(CUDA_(?:SUCCESS|ERROR_\w+))\s*=", text):
        doc = text[text.rfind("/**", 0, m.start()) + 3 : m.start()]
        doc = " ".join(line.strip(" *") for line in doc.splitlines()).strip()
        out[m.group(1)] = re.split(r"(?<=[a-z0-9)])\.\s", doc)[0].rstrip(".")
    return out


def generate(includes: list[Path]) -> tuple[str, str]:
    functions: dict[str, list[tuple[str, str]]] = {}
    variant_rows: dict[tuple[str, int, int], str] = {}
    handles: set[str] = set()
    consts: dict[str, int] = {}
    docs: dict[str, str] = {}
    versions = []
    for inc in includes:
        versions.append(int(VERSION_RE.search((inc / "cuda.h").read_text()).group(1)))
        for name, params in declarations(inc).items():
            functions.setdefault(name, params)
        handles |= set(HANDLE_RE.findall(preprocess(inc)))
        for row in variants(inc, set(functions)):
            variant_rows.setdefault(row[:3], row[3])
        for k, v in enums(inc).items():
            consts.setdefault(k, v)
        for k, v in error_docs(inc).items():
            docs.setdefault(k, v)
    ctypes = {t for params in functions.values() for t, _ in params}
    types = probe_types(includes[0], ctypes, handles)
    missing = ctypes - set(types)
    if missing:  # a type only an older header declares: probe it there
        types.update(probe_types(includes[-1], missing, handles))
    api = _api_module(versions, functions, variant_rows, types, consts, docs)
    return api, _entry_points(functions, types, variant_rows)


def _api_module(versions, functions, variant_rows, types, consts, docs) -> str:
    out = [
        "# GENERATED by `python -m xpuremote.protocol.generate` from NVIDIA's cuda.h and",
        f"# cudaTypedefs.h of CUDA {', '.join(str(v) for v in versions)}. Do not edit; re-run the generator.",
        "# fmt: off",
        "",
        f"HEADER_VERSIONS = {tuple(versions)!r}",
        "",
        "# C type -> (kind, size, signed, pointee class, pointee size); kind is",
        "# int | float | handle | struct (by value) | ptr.",
        "TYPES = {",
        *[f"    {t!r}: {tuple(info)!r}," for t, info in sorted(types.items())],
        "}",
        "",
        "# exported symbol -> ((C type, parameter name), ...)",
        "FUNCTIONS = {",
    ]
    for name in sorted(functions):
        out.append(f"    {name!r}: {tuple(tuple(p) for p in functions[name])!r},")
    out += ["}", "", "# (name, cudaVersion, per_thread) -> symbol, as cuGetProcAddress resolves it", "VARIANTS = {"]
    for key in sorted(variant_rows):
        out.append(f"    {key!r}: {variant_rows[key]!r},")
    out += ["}", "", "ENUMS = {"]
    out += [f"    {k!r}: {v!r}," for k, v in sorted(consts.items())]
    out += ["}", "", "ERROR_DOCS = {"]
    out += [f"    {k!r}: {v!r}," for k, v in sorted(docs.items())]
    out += ["}", ""]
    return "\n".join(out)


C_INT = {(1, 0): "uint8_t", (1, 1): "int8_t", (2, 0): "uint16_t", (2, 1): "int16_t",
         (4, 0): "uint32_t", (4, 1): "int32_t", (8, 0): "uint64_t", (8, 1): "int64_t"}


def _c_param(ctype: str, info: list, i: int) -> tuple[str, str]:
    """(C declaration of parameter i, expression that packs it into a uint64_t slot)."""
    kind, size, signed = info[0], info[1], info[2]
    if kind in ("ptr", "handle"):
        return f"void *a{i}", f"(uint64_t)(uintptr_t)a{i}"
    if kind == "float":
        ct = "float" if size == 4 else "double"
        return f"{ct} a{i}", f"xpu_bits_{ct}(a{i})"
    if kind == "struct":  # by value: hand the client its address
        return f"xpu_struct{size} a{i}", f"(uint64_t)(uintptr_t)&a{i}"
    return f"{C_INT[(size, signed)]} a{i}", f"(uint64_t)({'int64_t' if signed else 'uint64_t'})a{i}"


# Implemented in C by the shim itself (interpose/shim.c): they must work before Python starts.
NATIVE = {"cuGetProcAddress", "cuGetProcAddress_v2", "cuGetExportTable"}


def _struct_body(size: int) -> str:
    """A stand-in with the calling convention of a by-value struct of `size` bytes: up to 16
    bytes of integers travel in registers, larger ones in memory."""
    return f"uint32_t w[{size // 4}];" if size <= 16 else f"unsigned char b[{size}];"


def _entry_points(functions, types, variant_rows) -> str:
    sizes = sorted({types[t][1] for ps in functions.values() for t, _ in ps if types[t][0] == "struct"})
    out = [
        "/* GENERATED by `python -m xpuremote.protocol.generate`. Do not edit; re-run the generator.",
        " * One exported function per driver symbol; each enters the client via xpu_enter(). */",
        "",
        *[f"typedef struct {{ {_struct_body(s)} }} xpu_struct{s};" for s in sizes],
        "",
    ]
    for op, name in enumerate(sorted(functions)):
        if name in NATIVE:
            continue
        params = functions[name]
        decls, packs = zip(*[_c_param(t, types[t], i) for i, (t, _) in enumerate(params)]) if params else ((), ())
        slots = f"uint64_t s[] = {{{', '.join(packs)}}};" if params else "uint64_t *s = NULL;"
        out.append(f"XPU_EXPORT int {name}({', '.join(decls) or 'void'}) "
                   f"{{ {slots} return xpu_enter({op}, s); }}")
    out += ["", "const char *const xpu_symbol_names[] = {"]
    out += [f'    "{name}",' for name in sorted(functions)]
    out += ["};", f"const int xpu_symbol_count = {len(functions)};", ""]
    out.append("void *const xpu_symbol_addrs[] = {")
    out += [f"    (void *){name}," for name in sorted(functions)]
    out += ["};", ""]
    ops = {name: op for op, name in enumerate(sorted(functions))}
    out.append("/* (name, cudaVersion, per-thread) -> symbol, sorted for bsearch */")
    out.append("const xpu_variant xpu_variants[] = {")
    out += [f'    {{"{n}", {v}, {p}, {ops[sym]}}},' for (n, v, p), sym in sorted(variant_rows.items())]
    out += ["};", f"const int xpu_variant_count = {len(variant_rows)};", ""]
    return "\n".join(out)


def default_includes() -> list[Path]:
    """The include folders of the installed CUDA 13 and 12 runtime wheels."""
    import nvidia  # namespace package of NVIDIA's wheels

    found = [Path(base) / sub / "include" for sub in ("cu13", "cuda_runtime") for base in nvidia.__path__]
    return [p for p in found if (p / "cudaTypedefs.h").is_file()]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    includes = [Path(a) for a in argv if a != "--check"] or default_includes()
    if not includes:
        print(__doc__, file=sys.stderr)
        return 2
    api, c = generate(includes)
    if check:
        stale = [str(p.relative_to(ROOT)) for p, text in ((API_OUT, api), (C_OUT, c)) if p.read_text() != text]
        if stale:
            print(f"out of date: {', '.join(stale)}; run python -m xpuremote.protocol.generate", file=sys.stderr)
            return 1
        print("generated files are up to date")
        return 0
    API_OUT.write_text(api)
    C_OUT.write_text(c)
    print(f"wrote {os.path.relpath(API_OUT)} and {os.path.relpath(C_OUT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
