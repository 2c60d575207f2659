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

and the same two for each math library of `protocol/mathlibs.py` (cuBLAS, cuBLASLt, cuDNN):
`protocol/<lib>_api.py` and `interpose/<lib>_entry_points.c`, from the headers of NVIDIA's
wheels that declare them (`--libraries DIR ...`: folders holding those headers; without it,
the `nvidia` folders of this Python and of the project's `.venv-torch`, where PyTorch's
dependencies bring them). The entry points also export, as refusals, what NVIDIA's libraries in
those wheels (the `lib` folders beside) import from the library and no header declares
(`protocol/linked.py`): cuSOLVER's `cublasSetEnvironmentMode`, cuBLAS's internal cuBLASLt calls.

and the record ABI that C and Python share, `protocol/abi.h` and `protocol/abi.py`, from
`protocol/records.py` and the op counts of the entry points above (`generate_abi.py`).

and the NVML forwarder's entry points, `interpose/nvml_entry_points.c`, from the table of
`protocol/nvml.py` (`generate_nvml.py`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from . import generate_abi, generate_nvml, linked
from .mathlibs import LIBRARIES, Library

ROOT = Path(__file__).resolve().parent.parent
API_OUT = ROOT / "protocol" / "cuda_api.py"
C_OUT = ROOT / "interpose" / "entry_points.c"

DECL_RE = re.compile(r"CUresult\s+(cu\w+)\s*\(([^;{}()]*)\)\s*;")
PFN_RE = re.compile(r"typedef\s+CUresult\s*\(\s*CUDAAPI\s*\*\s*PFN_(\w+?)_v(\d+)(_ptds|_ptsz)?\s*\)")
PROFILER_RE = re.compile(r"PFN_(\w+?)_v(\d+)\s*\)\s*\(([^;{}()]*)\)\s*;")
HANDLE_RE = re.compile(r"typedef\s+struct\s+\w+\s*\*\s*(\w+)\s*;")
INCOMPLETE_RE = re.compile(r"typedef\s+struct\s+\w+\s+(\w+)\s*;")
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
        part = re.sub(r"\s*(\w+)\s*\[[^\]]*\]$", r" *\1", part)  # `T name[]` is `T *name`
        m = re.match(r"^(.*?[\s*])(\w+)$", part)
        if m and m.group(2) not in C_KEYWORDS and m.group(1).strip() not in ("", "const"):
            ctype, name = m.group(1), m.group(2)
        else:  # unnamed parameter
            ctype, name = part, f"arg{i}"
        if ctype.strip() in ("unsigned", "signed"):
            ctype += " int"
        ctype = re.sub(r"\s*\*\s*", " *", ctype.strip()).replace("* *", "**").strip()
        if "*" not in ctype:  # `const T x`, `T const x`: a by-value parameter's const means nothing
            ctype = re.sub(r"^const |(?<=\w) const$", "", ctype)
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
#include <stdalign.h> /* cusparseLt.h's structs use C++'s alignas */
#include <{header}>
typedef int CUoutput_mode; /* the one enum of cudaProfiler.h, a header the runtime wheels lack */
#define CLS(x) __builtin_classify_type(x)
int main(void) {{
"""


def _run_probe(includes: list[Path], body: list[str], header: str = "cuda.h") -> list[list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp, "probe.c"), Path(tmp, "probe")
        src.write_text(PROBE_HEAD.format(header=header) + "\n".join(body) + "\nreturn 0; }\n")
        cmd = ["gcc", "-w", "-D__CUDA_API_VERSION_INTERNAL", *[f"-I{i}" for i in includes], str(src), "-o", str(exe)]
        subprocess.run(cmd, check=True)
        rows = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return [r.split("\t") for r in rows.splitlines()]


CLASS_NAMES = {"1": "int", "3": "int", "5": "ptr", "8": "float", "12": "struct", "0": "void", "h": "handle"}


def probe_types(include: Path | list[Path], ctypes: set[str], handles: set[str],
                header: str = "cuda.h", incomplete: frozenset[str] = frozenset()) -> dict[str, tuple]:
    """Ask the compiler what each parameter type is: (kind, size, signed, pointee class, pointee size).
    A pointer to an `incomplete` type points at something of unknown size, like `void *`."""
    includes = include if isinstance(include, list) else [include]
    body = []
    for t in sorted(ctypes):
        q = json.dumps(t)
        base = t[:-1].replace("const ", "").strip() if t.endswith("*") else t
        if t in handles:  # most are pointers; cuFFT's cufftHandle is an int
            body.append(f'printf("%s\\t5\\t%zu\\t-\\t0\\n", {q}, sizeof({t}));')
        elif t.endswith("*") and base in handles:
            body.append(f'printf("%s\\t5\\t8\\th\\t%zu\\n", {q}, sizeof({base}));')
        elif t.endswith("*") and (base.endswith("*") or base == "void" or base in incomplete):
            pcls = "5" if base.endswith("*") else "0"
            body.append(f'printf("%s\\t5\\t8\\t{pcls}\\t8\\n", {q});')
        elif t.endswith("*"):
            body.append(f'printf("%s\\t5\\t8\\t%d\\t%zu\\n", {q}, CLS(*({t})0), sizeof(*({t})0));')
        else:
            body.append(f'{{ {t} v; printf("%s\\t%d\\t%zu\\t0\\t0\\n", {q}, CLS(v), sizeof(v)); }}')
    rows = _run_probe(includes, body, header)
    ints = [t for t, cls, *_ in rows if cls in ("1", "3")]
    signed = {t for t, s in _run_probe(includes, [
        f'printf("%s\\t%d\\n", {json.dumps(t)}, (int)(({t})-1 < ({t})0));' for t in ints], header) if s == "1"}
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


def generate(includes: list[Path]) -> tuple[str, str, int]:
    """(protocol/cuda_api.py, interpose/entry_points.c, how many ops the entry points number)."""
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
    return api, _entry_points(functions, types, variant_rows), len(functions)


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
        "# exported symbol -> ((C type, parameter name), ...), in op order (the entry points' numbers)",
        "FUNCTIONS = {",
    ]
    for name in op_order(functions):
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
    if kind == "handle" and size < 8:  # an integer handle (cufftHandle): only its own bytes are the caller's
        return f"{C_INT[(size, 0)]} a{i}", f"(uint64_t)a{i}"
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


def op_order(functions: dict[str, list]) -> list[str]:
    """The symbols in the order of their op numbers: what an entry point passes, the index of its symbol in the
    generated FUNCTIONS (calls.SYMBOLS), counted in abi.h. Sorted, so a new release moves numbers only within
    one build: the op numbers never travel (the wire carries opcodes, CRC-32s of the names)."""
    return sorted(functions)


def _entry_points(functions, types, variant_rows) -> str:
    sizes = sorted({types[t][1] for ps in functions.values() for t, _ in ps if types[t][0] == "struct"})
    out = [
        "/* GENERATED by `python -m xpuremote.protocol.generate`. Do not edit; re-run the generator.",
        " * One exported function per driver symbol; each enters the client via xpu_enter(). */",
        "",
        *[f"typedef struct {{ {_struct_body(s)} }} xpu_struct{s};" for s in sizes],
        "",
    ]
    for op, name in enumerate(op_order(functions)):
        if name in NATIVE:
            continue
        params = functions[name]
        decls, packs = zip(*[_c_param(t, types[t], i) for i, (t, _) in enumerate(params)]) if params else ((), ())
        slots = f"uint64_t s[] = {{{', '.join(packs)}}};" if params else "uint64_t *s = NULL;"
        out.append(f"XPU_EXPORT int {name}({', '.join(decls) or 'void'}) "
                   f"{{ {slots} return xpu_enter({op}, s); }}")
    out += ["", "const char *const xpu_symbol_names[] = {"]
    out += [f'    "{name}",' for name in op_order(functions)]
    out += ["};", f"const int xpu_symbol_count = {len(functions)};",
            f'_Static_assert({len(functions)} == XPU_DRIVER_OPS, "entry_points.c and abi.h are of one generator run");',
            ""]
    out.append("void *const xpu_symbol_addrs[] = {")
    out += [f"    (void *){name}," for name in op_order(functions)]
    out += ["};", ""]
    ops = {name: op for op, name in enumerate(op_order(functions))}
    out.append("/* (name, cudaVersion, per-thread) -> symbol, sorted for bsearch */")
    out.append("const xpu_variant xpu_variants[] = {")
    out += [f'    {{"{n}", {v}, {p}, {ops[sym]}}},' for (n, v, p), sym in sorted(variant_rows.items())]
    out += ["};", f"const int xpu_variant_count = {len(variant_rows)};", ""]
    return "\n".join(out)


# ---- the math libraries ------------------------------------------------------------------------
LIB_DECL_RE = re.compile(r"(?:^|(?<=[;}]))\s*((?:const\s+)?\w+(?:\s*\*)?)\s*\b(cu\w+|nccl\w+)\s*\(([^;{}()]*)\)\s*;")
ENUM_TYPEDEF_RE = re.compile(r"typedef\s+enum\s*\w*\s*\{[^}]*\}\s*(\w+)\s*;")
LIB_ENUM_RE = re.compile(r"\b([A-Z][A-Z0-9_]+)\s*=\s*([^,}]+?)\s*[,}]")
MIXED_ENUM_RE = re.compile(r"\b([A-Za-z_]\w*)\s*=\s*([^,}]+?)\s*[,}]")  # NCCL's: ncclSum, ncclFloat32


def library_text(lib: Library, includes: list[Path], tail: str = "") -> str:
    cmd = ["gcc", "-E", "-P", "-D__attribute__(x)=", *[f"-I{i}" for i in includes], "-"]
    source = f"#include <{lib.header}>\n{tail}\n"
    return subprocess.run(cmd, input=source, capture_output=True, text=True, check=True).stdout


def library_enums(text: str, prefixes: tuple[str, ...], pattern: re.Pattern = LIB_ENUM_RE) -> dict[str, int]:
    """Enumerators with one of `prefixes`, values that may name earlier ones (`A = B | 128`)."""
    out: dict[str, int] = {}
    for name, expr in pattern.findall(text):
        if not name.startswith(prefixes):
            continue
        expr = re.sub(r"(?<=[0-9a-fA-F])[uUlL]+\b", "", expr)
        try:
            out.setdefault(name, eval(expr, {"__builtins__": {}}, dict(out)))  # noqa: S307 - header constants
        except (NameError, SyntaxError, TypeError):
            continue  # not an enumerator (a macro's use, a cast)
    return out


def status_enumerators(text: str, status_type: str, consts: dict[str, int]) -> dict[int, str]:
    """code -> name of the enumerators of the status type's own enum (the first of a code's names): not every
    enumerator with the status prefix (cuFFT's CUFFT_ prefixes its transform types and Xt enums too)."""
    body = re.search(r"typedef\s+enum\s*\w*\s*\{([^}]*)\}\s*" + re.escape(status_type) + r"\s*;", text)
    tag = re.search(r"typedef\s+enum\s+(\w+)\s+" + re.escape(status_type) + r"\s*;", text)
    # cuRAND's: `enum curandStatus {...};` and then `typedef enum curandStatus curandStatus_t;`
    if body is None and tag is not None:
        body = re.search(r"\benum\s+" + tag.group(1) + r"\s*\{([^}]*)\}", text)
    if body is None:
        raise SystemExit(f"no `typedef enum {{...}} {status_type};` in the headers")
    names = re.findall(r"\b([A-Za-z_]\w*)\s*=", body.group(1))
    return {v: k for k, v in reversed([(n, consts[n]) for n in names if n in consts])}


def library_api(lib: Library, includes: list[Path], imported: dict[str, linked.Imported]) -> tuple[str, str, int]:
    """(protocol/<lib>_api.py, interpose/<lib>_entry_points.c, its op count) from the library's headers, and
    what NVIDIA's libraries import from it (`imported`: its entry points export each one)."""
    text = " ".join(library_text(lib, includes).split())
    functions: dict[str, list[tuple[str, str]]] = {}
    returns: dict[str, str] = {}
    enum_types = set(ENUM_TYPEDEF_RE.findall(text)) - {lib.status_type}
    for ret, name, params in LIB_DECL_RE.findall(text):
        if not name.startswith(lib.prefix) or name.startswith(lib.exclude) or name in functions:
            continue
        functions[name] = split_params(params)
        ret = re.sub(r"\s*\*", " *", ret.strip())
        if ret in enum_types:  # cuSPARSE's cusparseGetMatType...: an enum is an int to the entry point
            ret = "int"
        if ret != lib.status_type:
            returns[name] = ret
    macros = " ".join(lib.version_macros)
    *version, cudart = library_text(lib, includes, f"xpu_version {macros} CUDART_VERSION").split()[-4:]
    handles = set(HANDLE_RE.findall(text)) | set(lib.handles)
    ctypes = {t for params in functions.values() for t, _ in params}
    types = probe_types(includes, ctypes, handles, lib.header, frozenset(INCOMPLETE_RE.findall(text)))
    status_prefix = lib.status["success"].removesuffix("SUCCESS")  # CUBLAS_STATUS_
    consts = library_enums(text, (lib.prefix.upper(), status_prefix, "CUDA_R_", "CUDA_C_", "CUBLAS_COMPUTE_"))
    if lib.enum_prefixes:
        consts.update(library_enums(text, lib.enum_prefixes, MIXED_ENUM_RE))
    statuses = status_enumerators(text, lib.status_type, consts)
    api = [
        f"# GENERATED by `python -m xpuremote.protocol.generate` from NVIDIA's {lib.header}",
        f"# of {lib.name} {'.'.join(version)}. Do not edit; re-run the generator.",
        "# fmt: off",
        "",
        f"LIBRARY = {lib.name!r}",
        f"VERSION = {tuple(int(v) for v in version)!r}",
        f"CUDART_VERSION = {int(cudart)}  # of the CUDA headers it was declared with",
        "",
        "# C type -> (kind, size, signed, pointee class, pointee size)",
        "TYPES = {", *[f"    {t!r}: {tuple(info)!r}," for t, info in sorted(types.items())], "}",
        "",
        "# exported symbol -> ((C type, parameter name), ...)",
        "# in op order: the index of each in interpose/<lib>_entry_points.c",
        "FUNCTIONS = {", *[f"    {n!r}: {tuple(tuple(p) for p in functions[n])!r}," for n in op_order(functions)], "}",
        "",
        f"# functions that return something else than {lib.status_type}",
        "RETURNS = {", *[f"    {n!r}: {r!r}," for n, r in sorted(returns.items())], "}",
        "",
        "ENUMS = {", *[f"    {k!r}: {v!r}," for k, v in sorted(consts.items())], "}",
        "",
        f"# {lib.status_type}: code -> the enumerator's name",
        "STATUSES = {", *[f"    {v!r}: {k!r}," for v, k in sorted(statuses.items())], "}",
        "",
    ]
    refused = refused_imports(lib, functions, imported)
    entry_points = _library_entry_points(lib, functions, returns, types, statuses, refused)
    return "\n".join(api), entry_points, len(functions)


def refused_imports(lib: Library, functions: dict, imported: dict[str, linked.Imported]) -> list[linked.Imported]:
    """What NVIDIA's libraries import from `lib` that its headers do not declare: exported as refusals. Each must
    be a function of the version node the replacement gives every symbol (the SONAME, build.py's script)."""
    refused = [sym for name, sym in sorted(imported.items()) if name not in functions]
    for sym in refused:
        if sym.kind != "FUNC" or sym.version not in (None, lib.soname):
            raise SystemExit(f"{', '.join(sym.importers)} import {sym.name} ({sym.kind}, version {sym.version}) "
                             f"from {lib.soname}: the replacement exports only functions of version {lib.soname}")
    return refused


def _library_entry_points(lib: Library, functions, returns, types, statuses: dict[int, str],
                          refused: list[linked.Imported]) -> str:
    sizes = sorted({types[t][1] for ps in functions.values() for t, _ in ps if types[t][0] == "struct"})
    out = [
        "/* GENERATED by `python -m xpuremote.protocol.generate`. Do not edit; re-run the generator.",
        f" * {lib.soname}: one exported function per {lib.name} symbol; each enters the client via",
        " * xpu_lib_call() (interpose/mathlib.c). */",
        "",
        f"#define XPU_LIBRARY_ID {LIBRARIES.index(lib)}",
        f'_Static_assert({len(functions)} <= XPU_LIBRARY_OPS_MAX, "{lib.name}_entry_points.c and abi.h are of one '
        'generator run");',
        *[f"typedef struct {{ {_struct_body(s)} }} xpu_struct{s};" for s in sizes],
        "",
        "static const xpu_status_name xpu_status_names[] = {",
        *[f'    {{{code}, "{name}"}},' for code, name in sorted(statuses.items())],
        "};",
        "",
    ]
    for op, name in enumerate(op_order(functions)):
        params = functions[name]
        decls, packs = zip(*[_c_param(t, types[t], i) for i, (t, _) in enumerate(params)]) if params else ((), ())
        signature = f"{name}({', '.join(decls) or 'void'})"
        ret = returns.get(name, "int")
        if ret == "const char *" and params and params[0][0] != lib.status_type:  # ncclGetLastError(comm)
            out.append(f'XPU_EXPORT const char *{signature} {{ (void)a0; return "{LAST_ERROR}"; }}')
            continue
        if ret == "const char *":  # the status texts: answered here, from the header's own names
            if len(params) != 1:
                raise SystemExit(f"{name} returns a string but is not a status lookup: annotate it")
            out.append(f"XPU_EXPORT const char *{signature} {{ return xpu_status_text((int)a0); }}")
            continue
        slots = f"uint64_t s[] = {{{', '.join(packs)}}};" if params else "uint64_t *s = NULL;"
        call = f"xpu_lib_call({op}, s)"
        body = f"{call};" if ret == "void" else f"return ({ret}){call};"
        out.append(f"XPU_EXPORT {ret} {signature} {{ {slots} {body} }}")
    if refused:
        not_supported = next(code for code, name in statuses.items() if name == lib.status["not_supported"])
        out += ["", f"/* What NVIDIA's libraries import from {lib.soname} beside the functions above (no header",
                " * this is generated from declares them; protocol/linked.py finds them): exported so that those",
                " * libraries load, and refused (interpose/mathlib.c). Each names the libraries that import it. */"]
        for sym in refused:
            importers = ", ".join(sym.importers)
            out.append(f"XPU_EXPORT int {sym.name}(void) {{ static int said; "
                       f'return xpu_refuse("{sym.name}", {not_supported}, &said); }}  /* {importers} */')
    return "\n".join(out) + "\n"


# What a library's last-error text says (ncclGetLastError): the client logs each failure on stderr as it happens.
LAST_ERROR = "xpuremote: the reason is logged on stderr (XPU_LOG=INFO says more)"


def library_includes(extra: list[Path]) -> list[Path]:
    """Folders with the math libraries' headers, then the CUDA ones they include (crt/ too)."""
    import nvidia

    bases = [Path(b) for b in nvidia.__path__] + sorted(ROOT.glob(".venv-torch/lib/python3*/site-packages/nvidia"))
    found = [b / sub / "include" for sub in ("cudnn", "nccl", "cusparselt", "cu13") for b in bases]
    headers = ("cublasLt.h", "cudnn.h", "nccl.h", "cusparseLt.h")
    with_libs = [p for p in found if any((p / h).is_file() for h in headers)]
    # cuRAND's wheel (the test extra's: the torch wheel does not bring it) puts curand.h beside this venv's CUDA
    # headers: after the torch venv's folders, whose CUDA headers the other libraries are declared with
    with_rand = [p for p in found if p not in with_libs and (p / "curand.h").is_file()]
    rest = [p for p in found if p not in with_libs + with_rand and (p / "crt" / "host_defines.h").is_file()]
    return list(dict.fromkeys([*extra, *with_libs, *with_rand, *rest]))


def importer_dirs(lib: Library, includes: list[Path]) -> list[Path]:
    """The folders `lib.importers` names, under each site-packages that holds one of the `nvidia` include folders."""
    sites = {i.parents[2] for i in includes if i.parent.parent.name == "nvidia"}
    return [d for site in sorted(sites) for pattern in lib.importers for d in sorted(site.glob(pattern)) if d.is_dir()]


def library_outputs(lib: Library) -> tuple[Path, Path]:
    return ROOT / "protocol" / f"{lib.name}_api.py", ROOT / "interpose" / f"{lib.name}_entry_points.c"


def default_includes() -> list[Path]:
    """The include folders of the installed CUDA 13 and 12 runtime wheels."""
    import nvidia  # namespace package of NVIDIA's wheels

    found = [Path(base) / sub / "include" for sub in ("cu13", "cuda_runtime") for base in nvidia.__path__]
    return [p for p in found if (p / "cudaTypedefs.h").is_file()]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    split = args.index("--libraries") if "--libraries" in args else len(args)
    includes = [Path(a) for a in args[:split]] or default_includes()
    lib_includes = library_includes([Path(a) for a in args[split + 1 :]])
    if not includes:
        print(__doc__, file=sys.stderr)
        return 2
    wheel_libraries = linked.shared_libraries(linked.wheel_library_dirs(lib_includes))
    imported = linked.imported_from(wheel_libraries, [lib.soname for lib in LIBRARIES])
    for lib in LIBRARIES:  # what other packages' libraries import from it too (PyTorch's, from NCCL)
        if lib.importers:
            others = linked.shared_libraries(importer_dirs(lib, lib_includes))
            imported[lib.soname] = linked.imported_from(wheel_libraries + others, [lib.soname])[lib.soname]
    *driver, driver_ops = generate(includes)
    outputs = dict(zip((API_OUT, C_OUT), driver))
    library_ops = {}
    for lib in LIBRARIES:
        if not any((i / lib.header).is_file() for i in lib_includes):
            print(f"no {lib.header} found (install the torch extra: `make torch`), or name its folder "
                  "after --libraries", file=sys.stderr)
            return 2
        if not any(w.soname == lib.soname for w in wheel_libraries):
            print(f"no NVIDIA {lib.soname} found beside its headers: the libraries that import from it are "
                  "read from the wheels' lib folders", file=sys.stderr)
            return 2
        *texts, library_ops[lib.name] = library_api(lib, lib_includes, imported[lib.soname])
        outputs.update(zip(library_outputs(lib), texts))
    outputs.update(generate_abi.outputs(ROOT, driver_ops, library_ops))
    outputs.update(generate_nvml.outputs(ROOT))
    if check:
        stale = [str(p.relative_to(ROOT)) for p, text in outputs.items() if not p.exists() or p.read_text() != text]
        if stale:
            print(f"out of date: {', '.join(stale)}; run python -m xpuremote.protocol.generate", file=sys.stderr)
            return 1
        print("generated files are up to date")
        return 0
    for path, text in outputs.items():
        path.write_text(text)
    print("wrote " + ", ".join(os.path.relpath(p) for p in outputs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
