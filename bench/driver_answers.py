"""What the real CUDA driver answers, next to what xpuremote's shim answers, differences listed.

    python bench/driver_answers.py --out FILE.json [--server tcp://host:port] [--backend auto|cuda|sim]
                                   [--tables-log LOG ...]

Runs one probe twice, each in a fresh process that loads libcuda.so.1 through ctypes:

  real  without the shim: the machine's own driver. Recorded as absent, with the reason, where
        none loads or its cuInit fails (a machine without a GPU);
  shim  under `xpu-run` (against --server, else the local server xpu-run starts, on --backend).

The probe asks: cuDriverGetVersion, cuInit, cuDeviceGetCount; per device its name, total memory,
UUID, PCI ids and every CUdevice_attribute of cuda.h (status and value); cuGetErrorName and
cuGetErrorString of every CUresult; cuGetExportTable of every private table the shim knows,
of the ones NVIDIA's runtimes and math libraries ask for and the shim does not, and of those
--tables-log names (status; slot 0, the table's size, where the table has a size slot, and
which slots are filled); and a few documented edge answers (NULL names, no context yet, a bad
ordinal).

--tables-log: logs of other runs under xpu-run (e.g. PyTorch's stderr). The tables and slots
they say a library asked for and the shim does not implement go into the record, and both
sides probe those tables too.

Writes FILE.json (both sides' answers, the differences) and FILE.md (a summary count, then the
differences). Without a real side the record holds the shim's answers only and says why; that
is a success (exit 0). Exit 1 when the shim side itself fails. A few seconds.

    python bench/driver_answers.py --probe OUT.json [--table UUID ...]   # the probe, in this process
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint64, c_void_p
from pathlib import Path
from typing import Any

import xpuremote.interpose as interpose
from xpuremote.interpose.build import ensure_shim
from xpuremote.protocol import errors
from xpuremote.protocol.cuda_api import ENUMS

ATTRIBUTE_PREFIX = "CU_DEVICE_ATTRIBUTE_"
# what NVIDIA's runtimes and math libraries ask for besides the tables the shim has
# (cuda-driver-facts: the runtime's optional driver-log table, cuFFT's tools module)
EXTRA_TABLES = {
    "f8cff951-2146-8b4e-b9e2-fb469e7c0dd9": "runtime driver log",
    "6e163fbe-b958-444d-835c-e182aff1991e": "tools module",
}
NO_SIZE_SLOT = {"c693336e-1121-df11-a8c3-68f355d89593"}  # CONTEXT_LOCAL_STORAGE: slot 0 is put()
MAX_SLOTS = 128  # a size beyond this many slots is not a size (the tools context is said to have 95)
UUID_TEXT = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# what client code logs (interpose/entry.py): unknown_table and unknown_slot
LOGGED_TABLE = re.compile(rf"asked for private table ({UUID_TEXT})")
LOGGED_SLOT = re.compile(r"called slot (\d+) of private table (\w+)")
TIMEOUT_S = 120


def uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def shim_tables() -> dict[str, str]:
    """UUID -> C name of every table in the shim's `export_tables`, read from its source."""
    source = (Path(interpose.__file__).parent / "shim.c").read_text()
    block = source[source.index("export_tables[] = {"):]
    block = block[:block.index("};")]
    entries = re.findall(r"\{\{([0-9a-fx, \n]+)\},\s*(\w+)\}", block)
    return {uuid_text(bytes(int(b, 16) for b in raw.replace("\n", "").split(","))): name for raw, name in entries}


def attribute_ids() -> dict[int, str]:
    """Every CUdevice_attribute value of cuda.h, with its names (aliases joined by '/')."""
    names: dict[int, list[str]] = {}
    for name, value in sorted(ENUMS.items()):
        if name.startswith(ATTRIBUTE_PREFIX):
            names.setdefault(value, []).append(name[len(ATTRIBUTE_PREFIX):])
    return {value: "/".join(names[value]) for value in sorted(names)}


# ---- the probe: runs in the child, on either side -------------------------------------------------
def answer(status: int, value: Any = None) -> dict[str, Any]:
    return {"status": status, "value": value}


def c_text(pointer: c_char_p) -> str | None:
    return None if pointer.value is None else pointer.value.decode(errors="replace")


class Probe:
    """The driver's answers, gathered into {section: {key: {status, value}}}."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.answers: dict[str, dict[str, Any]] = {}
        self.missing: set[str] = set()  # entry points the library does not export: status -1

    def fn(self, name: str, *argtypes: Any) -> Any:
        try:
            f = getattr(self.lib, name)
        except AttributeError:
            self.missing.add(name)
            return lambda *args: -1
        f.argtypes, f.restype = list(argtypes), c_int
        return f

    def put(self, section: str, key: str, value: dict[str, Any]) -> None:
        self.answers.setdefault(section, {})[key] = value

    def int_out(self, name: str, *args: Any, ctype: Any = c_int) -> dict[str, Any]:
        out = ctype(0)
        status = self.fn(name, POINTER(ctype), *(type(a) for a in args))(byref(out), *args)
        return answer(status, out.value if status == 0 else None)

    def devices(self) -> None:
        count = self.int_out("cuDeviceGetCount")
        self.put("driver", "cuDeviceGetCount", count)
        for dev in range(count["value"] or 0):
            self.device(dev)

    def device(self, dev: int) -> None:
        name = ctypes.create_string_buffer(256)
        status = self.fn("cuDeviceGetName", c_char_p, c_int, c_int)(name, 256, dev)
        self.put("device", f"dev{dev} name", answer(status, name.value.decode(errors="replace")))
        self.put("device", f"dev{dev} total memory",
                 self.int_out("cuDeviceTotalMem_v2", c_int(dev), ctype=c_size_t))
        uuid = ctypes.create_string_buffer(16)
        status = self.fn("cuDeviceGetUuid_v2", c_char_p, c_int)(uuid, dev)
        self.put("device", f"dev{dev} uuid", answer(status, uuid.raw.hex()))
        bus_id = ctypes.create_string_buffer(64)
        status = self.fn("cuDeviceGetPCIBusId", c_char_p, c_int, c_int)(bus_id, 64, dev)
        self.put("device", f"dev{dev} pci bus id", answer(status, bus_id.value.decode(errors="replace")))
        for attr, names in attribute_ids().items():
            self.put("attribute", f"dev{dev} {attr} {names}", self.int_out("cuDeviceGetAttribute", c_int(attr),
                                                                           c_int(dev)))

    def error_texts(self) -> None:
        for code, name in sorted(errors.NAMES.items()):
            for fn in ("cuGetErrorName", "cuGetErrorString"):
                text = c_char_p()
                status = self.fn(fn, c_int, POINTER(c_char_p))(code, byref(text))
                self.put(fn, f"{code} {name}", answer(status, c_text(text)))

    def table(self, uuid: str) -> dict[str, Any]:
        out = c_void_p()
        uuid_bytes = bytes.fromhex(uuid.replace("-", ""))
        status = self.fn("cuGetExportTable", POINTER(c_void_p), c_char_p)(byref(out), uuid_bytes)
        if status != 0 or not out.value:
            return answer(status, None if not out.value else "a table despite the error")
        if uuid in NO_SIZE_SLOT:
            return answer(status, {"size": None})
        size = ctypes.cast(out, POINTER(c_uint64))[0]
        if size % 8 or not 0 < size <= 8 * MAX_SLOTS:
            return answer(status, {"size": None, "slot0": "not a size"})  # likely a function's address
        slots = ctypes.cast(out, POINTER(c_uint64))[1:size // 8]
        return answer(status, {"size": size, "filled": "".join("1" if s else "0" for s in slots)})

    def edges(self, attributes: dict[int, str]) -> None:
        put = self.put
        ctx = c_void_p(1)
        status = self.fn("cuCtxGetCurrent", POINTER(c_void_p))(byref(ctx))
        put("edge", "cuCtxGetCurrent before any context", answer(status, "a context" if ctx.value else "NULL"))
        put("edge", "cuDeviceGet(-1)", self.int_out("cuDeviceGet", c_int(-1)))
        put("edge", "cuDeviceGetCount(NULL)", answer(self.fn("cuDeviceGetCount", c_void_p)(None)))
        for attr in (0, max(attributes) + 1):
            put("edge", f"cuDeviceGetAttribute({attr})", self.int_out("cuDeviceGetAttribute", c_int(attr), c_int(0)))
        for fn in ("cuKernelGetName", "cuFuncGetName"):
            name = c_char_p()
            put("edge", f"{fn}(&name, NULL)", answer(self.fn(fn, POINTER(c_char_p), c_void_p)(byref(name), None),
                                                     c_text(name)))
            put("edge", f"{fn}(NULL, NULL)", answer(self.fn(fn, c_void_p, c_void_p)(None, None)))
        text = c_char_p(b"unset")
        status = self.fn("cuGetErrorName", c_int, POINTER(c_char_p))(999999, byref(text))
        put("edge", "cuGetErrorName(999999)", answer(status, c_text(text)))


def loaded_from() -> str | None:
    """The file libcuda.so.1 was mapped from (the real driver's is libcuda.so.<driver version>)."""
    with open("/proc/self/maps") as maps:
        paths = (line.split()[-1] for line in maps if "/" in line)
        return next((p for p in paths if os.path.basename(p).startswith("libcuda.so")), None)


def probe(tables: list[str], save: Callable[[dict[str, Any]], None]) -> None:
    """Saves the driver's answers after each step (a crash keeps what came before), or
    {"present": False, "reason": ...} where there is no usable driver."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return save({"present": False, "reason": f"libcuda.so.1 does not load: {exc}"})
    p = Probe(lib)
    record: dict[str, Any] = {"present": True, "library": loaded_from(), "complete": False,
                              "is_shim": hasattr(lib, "xpu_lib_enter"),  # the math libraries' way in
                              "missing": [], "answers": p.answers}
    p.put("driver", "cuDriverGetVersion", p.int_out("cuDriverGetVersion"))
    status = p.fn("cuInit", c_int)(0)
    p.put("driver", "cuInit", answer(status))
    if status != 0:
        return save({**record, "present": False, "reason": f"cuInit returned {status} ({errors.name(status)})"})
    steps = [lambda: p.edges(attribute_ids()),  # first: cuCtxGetCurrent before anything makes a context
             p.devices, p.error_texts, *(lambda uuid=uuid: p.put("cuGetExportTable", uuid, p.table(uuid))
                                         for uuid in tables)]
    for step in steps:
        step()
        save({**record, "missing": sorted(p.missing)})
    save({**record, "missing": sorted(p.missing), "complete": True})


# ---- the parent: both sides, the comparison, the files -------------------------------------------
def run_side(cmd: list[str], env: dict[str, str], tables: list[str]) -> dict[str, Any]:
    """Runs the probe in `cmd` + this script; returns what it found, or why there is nothing."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "probe.json"
        full = [*cmd, sys.executable, str(Path(__file__).resolve()), "--probe", str(out),
                *(a for uuid in tables for a in ("--table", uuid))]
        # a session of its own: on a timeout, xpu-run's local server goes too
        proc = subprocess.Popen(full, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=TIMEOUT_S)
            ended = f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, stderr = proc.communicate()
            ended = f"no end in {TIMEOUT_S} s"
        if not out.exists():
            return {"present": False, "reason": f"the probe failed ({ended}): {stderr[-2000:]}"}
        result = json.loads(out.read_text())
        if result.get("present") and not result.get("complete"):
            result["reason"] = f"the probe stopped ({ended}) after the answers here"
        if stderr.strip():
            result["stderr"] = stderr[-4000:]
        return result


def real_env(shim_dir: Path) -> dict[str, str]:
    """This environment without the shim in the way of the machine's driver (as when run under xpu-run)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "XPU_SERVER")}
    paths = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p and Path(p) != shim_dir]
    env["LD_LIBRARY_PATH"] = ":".join(paths)
    return env


def xpu_run(server: str | None, backend: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "xpuremote.interpose.run"]
    cmd += ["--server", server] if server else []
    cmd += ["--backend", backend] if backend and not server else []
    return [*cmd, "--"]


def tables_from_logs(paths: list[str]) -> dict[str, Any]:
    """The private tables, and the slots of known ones, that the logs say a library asked for in vain."""
    tables: dict[str, list[str]] = {}
    slots: dict[str, list[str]] = {}
    for path in paths:
        text = Path(path).read_text(errors="replace")
        for uuid in dict.fromkeys(LOGGED_TABLE.findall(text)):
            tables.setdefault(uuid, []).append(path)
        for slot, table in dict.fromkeys(LOGGED_SLOT.findall(text)):
            slots.setdefault(f"{table}[{slot}]", []).append(path)
    return {"tables": tables, "slots": slots}


def notes() -> dict[tuple[str, str], str]:
    """Differences known and meant: (section, key prefix) -> why."""
    from xpuremote.client.devices import NOT_FORWARDED

    out = {("attribute", f"{attr} "): "by design: a feature xpuremote does not forward answers 0"
           for attr in NOT_FORWARDED}
    out[("cuGetErrorString", "")] = "a driver's text not recorded yet: the shim answers cuda.h's doc comment"
    return out


def note_for(section: str, key: str, known: dict[tuple[str, str], str]) -> str | None:
    rest = key.split(" ", 1)[1] + " " if section == "attribute" else key
    return next((why for (s, prefix), why in known.items() if s == section and rest.startswith(prefix)), None)


def compare(real: dict[str, Any] | None, shim: dict[str, Any],
            known: dict[tuple[str, str], str] | None = None) -> list[dict[str, Any]]:
    """Every answer that differs between the two probes' records (or that only one side has)."""
    if not real or not real.get("answers") or not shim.get("answers"):
        return []
    a, b = real["answers"], shim["answers"]
    diffs = []
    for section in dict.fromkeys([*a, *b]):  # in the probe's order
        ra, sa = a.get(section, {}), b.get(section, {})
        for key in dict.fromkeys([*ra, *sa]):
            if ra.get(key) != sa.get(key):
                diff = {"section": section, "key": key, "real": ra.get(key), "shim": sa.get(key)}
                why = note_for(section, key, known or {})
                diffs.append({**diff, "note": why} if why else diff)
    return diffs


def summary(diffs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"differences": len(diffs), "by_section": dict(Counter(d["section"] for d in diffs)),
            "explained": sum(1 for d in diffs if d.get("note"))}


OVERVIEW = ("driver", "device", "edge", "cuGetExportTable")  # sections the Markdown shows whole


def cell(value: Any) -> str:
    """An answer as `status: value` for a Markdown table."""
    if value is None:
        return "—"
    text = f": {json.dumps(value['value'])}" if value.get("value") is not None else ""
    return f"{value['status']}{text}".replace("|", "\\|")[:160]


def key_cell(record: dict[str, Any], section: str, key: str) -> str:
    return f"{key} ({record['tables'][key]})" if section == "cuGetExportTable" else key


def markdown(record: dict[str, Any]) -> str:
    s, sides = record["summary"], record["sides"]
    lines = [f"# What the driver answers: real vs shim\n\n`{record['command']}`\n",
             f"{record['machine']} — {record['when']}\n"]
    if "differences" in s:
        lines.append(f"**{s['differences']} differences** ({s['explained']} explained): "
                     + ", ".join(f"{k} {v}" for k, v in sorted(s["by_section"].items())) + "\n")
    for name, side in sides.items():
        where = side.get("library") if side.get("present") else f"absent: {side.get('reason')}"
        lines.append(f"- {name}: {where}")
    if not sides["real"].get("present"):
        lines.append("\nNo real driver here: the record holds the shim's answers only, nothing is compared.")
    logged = record["from_logs"]
    if logged["tables"] or logged["slots"]:
        lines.append("\n## Asked for in the logs, not implemented by the shim\n")
        lines += [f"- table {u}: {', '.join(p)}" for u, p in logged["tables"].items()]
        lines += [f"- slot {k}: {', '.join(p)}" for k, p in logged["slots"].items()]
    if record["differences"]:
        lines += ["\n## Differences (status: value)\n", "| section | key | real | shim | note |",
                  "|---|---|---|---|---|"]
        lines += [f"| {d['section']} | {key_cell(record, d['section'], d['key'])} | {cell(d['real'])} | "
                  f"{cell(d['shim'])} | {d.get('note') or ''} |" for d in record["differences"]]
    answers = {name: side.get("answers", {}) for name, side in sides.items()}
    lines += ["\n## Versions, devices, edge cases, private tables (status: value; the rest is in the JSON)\n",
              "| section | key | real | shim |", "|---|---|---|---|"]
    for section in OVERVIEW:
        keys = dict.fromkeys([*answers["real"].get(section, {}), *answers["shim"].get(section, {})])
        lines += [f"| {section} | {key_cell(record, section, key)} | {cell(answers['real'].get(section, {}).get(key))}"
                  f" | {cell(answers['shim'].get(section, {}).get(key))} |" for key in keys]
    return "\n".join(lines) + "\n"


def record_answers(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    logged = tables_from_logs(args.tables_log)
    known = shim_tables()
    labels = {**{u: f"shim {n}" for u, n in known.items()}, **EXTRA_TABLES,
              **{u: "from the logs" for u in logged["tables"] if u not in known and u not in EXTRA_TABLES}}
    tables = list(labels)
    real = run_side([], real_env(ensure_shim().parent), tables)
    if real.get("is_shim"):
        real = {"present": False, "reason": f"libcuda.so.1 is xpuremote's shim ({real.get('library')})"}
    shim = run_side(xpu_run(args.server, args.backend), dict(os.environ), tables)
    if shim.get("present") and not shim.get("is_shim"):
        shim = {"present": False, "reason": f"libcuda.so.1 under xpu-run is not the shim ({shim.get('library')})"}
    diffs = compare(real, shim, notes())
    return {"command": "python bench/driver_answers.py " + shlex.join(argv),
            "machine": f"{platform.node()} {platform.platform()} python {platform.python_version()}",
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "server": args.server or f"local, backend {args.backend}",
            "summary": summary(diffs) if real.get("present") else {"real": "absent"},
            "tables": labels, "from_logs": logged, "sides": {"real": real, "shim": shim}, "differences": diffs}


def write_error_strings(record_path: Path, out: Path) -> int:
    """The shim's cuGetErrorString texts, as a real driver answered them in a record."""
    record = json.loads(record_path.read_text())
    record = record.get("stages", {}).get("5", {}).get("answers", record)  # a gpu-check.json holds one
    real = record["sides"]["real"]
    if not real.get("present"):
        print(f"{record_path}: no real driver in this record", file=sys.stderr)
        return 1
    texts = {key.split(" ", 1)[1]: a["value"] for key, a in real["answers"]["cuGetErrorString"].items()
             if a["status"] == 0 and a["value"]}
    driver = real["answers"]["driver"]["cuDriverGetVersion"]["value"]
    out.write_text(json.dumps({"recorded": f"cuGetErrorString of {real['library'].rsplit('/', 1)[-1]} (CUDA "
                                           f"{driver // 1000}.{driver % 1000 // 10}), {record['when']}, by "
                                           "bench/driver_answers.py --error-strings",
                               "strings": texts}, indent=1, sort_keys=False) + "\n")
    print(f"{len(texts)} texts -> {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="the record, FILE.json (and FILE.md beside it)")
    parser.add_argument("--server", help="tcp://host:port of an xpu-server for the shim side")
    parser.add_argument("--backend", choices=["auto", "cuda", "sim"], help="the local server's, without --server")
    parser.add_argument("--tables-log", nargs="*", default=[], metavar="LOG", help="logs of runs under xpu-run")
    parser.add_argument("--error-strings", nargs=2, metavar=("RECORD", "FILE"),
                        help="write the real driver's cuGetErrorString texts from RECORD (this script's "
                             "--out, or a gpu-check.json) to FILE (protocol/driver_error_strings.json)")
    parser.add_argument("--probe", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--table", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        probe(args.table, lambda found: Path(args.probe).write_text(json.dumps(found)))
        return 0
    if args.error_strings:
        return write_error_strings(Path(args.error_strings[0]), Path(args.error_strings[1]))
    if not args.out:
        parser.error("--out FILE.json is required")
    record = record_answers(args, argv)
    out = Path(args.out)
    out.write_text(json.dumps(record, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(record))
    print(markdown(record).split("\n## ")[0].rstrip())
    print(f"-> {out}, {out.with_suffix('.md')}")
    return 0 if record["sides"]["shim"].get("present") else 1


if __name__ == "__main__":
    raise SystemExit(main())
