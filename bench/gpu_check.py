"""One prepared command that proves xpuremote on a GPU machine, and its dry run anywhere.

    python bench/gpu_check.py bundle --out gpu-bundle [--python-version 3.12] [--headers-from PYTHON]
    python bench/gpu_check.py run --bundle gpu-bundle --out DIR [--backend cuda|sim] [--stages 3,6,4,2,5,1]
                                  [--torch-python PYTHON] [--call-limit 550]

`make gpu-bundle` and `make gpu-check OUT=DIR [BACKEND=sim] [STAGES=...]` call these; docs/gpu-check.md
says how to run them by hand and what each output means.

bundle (here, with the package index): the project's wheel and the wheels it needs (pyzmq, cffi,
msgpack, ...) for the GPU machine's Python and for this one, NVIDIA's runtime wheels the tests pin,
and, taken from a local Python of that version if there is one, its headers and libpython, which
the shim's build needs where the GPU machine's Python lacks them. A hash of the project's source
says which tree it was made from.

run (there, no network): installs the bundle into build/gpu-check/site (pip --no-index --target),
builds the shim, then runs the chosen stages in their order, each inside its share of --call-limit seconds
(STAGE_SHARES; docs/gpu-check.md says how the shares were budgeted):

  1 suite     pytest with XPU_TEST_BACKEND=cuda (the tests that make sense on a GPU, real kernels);
              with --backend sim, where CI has just run the suite, it only collects that selection
  2 programs  NVIDIA's runtimes, cuda-python, an nvcc-built program and the stock PyTorch, through
              `xpu-run` against a local `xpu-server` over loopback TCP, and natively beside them
  3 bench     bench/foundation.py, graphs.py, allocators.py and torch_e2e.py's eight workloads (native vs
              through xpuremote), each inside a share of the stage's time
  4 perf      bench/perf_validate.py --torch: five PyTorch workloads' step times recorded at loopback, predicted and
              run over emulated links (RTT 25-2000 µs x 10, 100 Gbit/s; on the sim two workloads, two links),
              against the issue's aims
  5 answers   bench/driver_answers.py: what the real driver answers beside the shim's answers
  6 calls     bench/async_calls.py, native_lane.py, server_calls.py: the CPU each side spends a call; a PyTorch
              workload recorded, and `xpu-perf calls`: where a step's time goes, call by call; and
              bench/client_cpu.py: the client's CPU a call in a workload's steps, untraced

and writes DIR/gpu-check.json (everything), DIR/gpu-check.md (the summary) and DIR/gpu-check.log
(each command's output). Exit status 0 when every chosen stage passed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tarfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from torch_e2e import cpu_split  # the script's own folder is on the path; torch itself is imported lazily

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("protocol", "client", "server", "interpose", "perfmodel", "pyproject.toml")
WORK = ROOT / "build" / "gpu-check"
FAILURE_HEAD = "===== failed: "  # how tests/conftest.py heads each failure in XPU_FAILURE_LOG
# pip's names for the platforms of x86-64 Linux wheels, newest first (pip matches each exactly)
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)] + ["manylinux2014_x86_64",
                                                                                   "manylinux1_x86_64", "any"]
LOG_TAIL = 200_000  # characters of each command's output kept in gpu-check.log
SIM_KERNELS = ("examples/sim_kernels.py", "tests/sim_kernels.py", "tests/torch_sim_kernels.py")


# ---- running commands -------------------------------------------------------------------------------
@dataclass
class Context:
    backend: str
    python: str
    torch_python: str
    bundle: Path
    log: TextIO
    env: dict[str, str] = field(default_factory=dict)
    deadline: float = float("inf")  # the running stage's end (time.monotonic()): no command runs past it

    @property
    def gpu(self) -> bool:
        return self.backend == "cuda"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
        """`cmd` in its own process group (killed whole at the end: servers it started go too), cut at `timeout`
        or at the stage's end, whichever comes first."""
        timeout = max(1.0, min(timeout, self.left()))
        started = time.monotonic()
        self.log.write(f"\n===== {name}: {shlex.join(cmd)}\n")
        self.log.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env or self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
            rc: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            stuck = _group_snapshot(proc.pid)  # what was still running, and where each thread waited
            _kill_group(proc.pid)
            rc = None
            try:  # a process that left the group may still hold the pipe: don't wait on it for ever
                output, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                output = b"(no output: the pipe stayed open after the kill)"
        _kill_group(proc.pid)
        text = output.decode(errors="replace") + (f"\n(killed after {timeout:.0f} s)\n{stuck}" if rc is None else "")
        self.log.write(text[-LOG_TAIL:] + f"\n===== {name}: exit {rc}, {time.monotonic() - started:.1f} s\n")
        self.log.flush()
        return {"name": name, "command": shlex.join(cmd), "rc": rc, "seconds": round(time.monotonic() - started, 1),
                "output": text}


def _group_snapshot(pgid: int) -> str:
    """Each process of the group (a command cut at its limit): its command, how long it had run, and each
    thread's state and kernel wait channel (a thread in futex_wait for minutes is a deadlock; in a poll, it
    waits for a peer). Linux's /proc only; what cannot be read is left out."""
    tick, uptime = os.sysconf("SC_CLK_TCK"), float(Path("/proc/uptime").read_text().split()[0])
    lines = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # fields[2] is the process group (stat's 5th field)
                continue
            task = stat.parent
            cmd = (task / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:300]
            age = uptime - int(fields[19]) / tick
            threads = []
            for thread in sorted((task / "task").iterdir()):
                with contextlib.suppress(OSError, IndexError):
                    state = (thread / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    threads.append(f"{thread.name} {state} {(thread / 'wchan').read_text() or '-'}")
            lines.append(f"pid {task.name}, running {age:.0f} s: {cmd}\n  threads: {'; '.join(threads)}")
    return "still running when cut:\n" + "\n".join(sorted(lines)) if lines else ""


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _brief(step: dict[str, Any], lines: int = 25) -> dict[str, Any]:
    """A step as the JSON keeps it: the end of its output only (the log has more)."""
    return {**{k: v for k, v in step.items() if k != "output"},
            "tail": "\n".join(step["output"].strip().splitlines()[-lines:])}


# This script runs before the bundle is installed, so it imports nothing of xpuremote's.
def _query(python: str, code: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _built(path: Path) -> bool:
    return "__pycache__" in path.parts or path.suffix in (".so", ".o", ".pyc")


def source_hash() -> str:
    """The project's source as one hash: which tree a bundle was made from."""
    h = hashlib.sha256()
    for top in SOURCES:
        path = ROOT / top
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and not _built(p))
        for f in files:
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


# ---- the bundle (made here, with the package index) ---------------------------------------------------
def _pins() -> list[str]:
    """NVIDIA's runtime wheels and cuRAND's (tests/test_curand.py links it, the server runs it) as the test extra pins
    them (pyproject.toml says them once)."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return [r for r in extras["test"] if r.startswith(("nvidia-cuda-runtime", "nvidia-curand"))]


def _pip_download(wheels: Path, version: str, requirements: list[str]) -> None:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version",
                    version, "--implementation", "cp", *platforms, "-d", str(wheels), *requirements], check=True)


# What the machine's Python has, asked of it (the set-up records it; the bundle reads the headers' Python).
FACTS = """import json, os, sys, sysconfig, shutil
lib = os.path.join(sysconfig.get_config_var('LIBDIR') or '', sysconfig.get_config_var('INSTSONAME') or '')
include = sysconfig.get_paths()['include']
print(json.dumps({'python': sys.version.split()[0], 'version': sysconfig.get_python_version(),
  'executable': sys.executable, 'shared_libpython': bool(sysconfig.get_config_var('Py_ENABLE_SHARED')),
  'libpython': os.path.isfile(lib), 'libpython_path': lib,
  'headers': os.path.isfile(os.path.join(include, 'Python.h')), 'include': include,
  'gcc': shutil.which('gcc'), 'nvcc': shutil.which('nvcc'), 'nvidia_smi': shutil.which('nvidia-smi')}))"""


def _python_files(python: str, version: str) -> tuple[Path, Path] | None:
    """The header folder and libpython of `python`, where it is Python `version` and has both."""
    facts = json.loads(_query(python, FACTS) or "{}")
    if facts.get("version") != version or not (facts["headers"] and facts["libpython"]):
        return None
    return Path(facts["include"]), Path(facts["libpython_path"])


def _toolchain_here() -> Any:
    sys.path.insert(0, str(ROOT / "tests"))
    import toolchain

    return toolchain


def bundle(out: Path, version: str, headers_from: str | None) -> int:
    if out.exists():
        shutil.rmtree(out)
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(ROOT)],
                   check=True)
    project = next(wheels.glob("xpuremote-*.whl"))
    here = sysconfig.get_python_version()
    for v in dict.fromkeys([version, here]):  # the GPU machine's Python, and this one's for the dry run
        # pip judges the project's markers by the Python that runs it: name what 3.12 adds
        _pip_download(wheels, v, [str(project), *_pins(), "setuptools>=68"])
    # the runtimes the tests fetch with pip (tests/toolchain.py) besides the pinned ones: kept apart, since
    # `wheels` holds the pinned versions of the same packages
    toolchain = _toolchain_here()
    _pip_download(out / "runtimes", version, [toolchain.cudart_requirement(v) for v in toolchain.FETCHED_CUDARTS])
    notes = {"source": source_hash(), "python_version": version, "made": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             "wheels": sorted(p.name for p in wheels.iterdir()), "python_files": None}
    files = _python_files(headers_from, version) if headers_from else None
    if files:
        include, lib = files
        with tarfile.open(out / f"python{version}.tar.xz", "w:xz") as tar:
            tar.add(include, arcname=f"include/{include.name}")
            tar.add(lib, arcname=f"lib/{lib.name}")
        notes["python_files"] = f"python{version}.tar.xz: headers and {lib.name} of {headers_from}"
    else:
        print(f"gpu-bundle: no Python {version} with headers and libpython given (--headers-from): the GPU "
              f"machine's own python{version}-dev must provide them", file=sys.stderr)
    (out / "bundle.json").write_text(json.dumps(notes, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{out}: {len(notes['wheels'])} wheels, {size / 2**20:.1f} MiB, source {notes['source']}")
    return 0


# ---- set-up on the machine: facts, install, the shim ---------------------------------------------------
def _command_line(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({exc})"
    return (proc.stdout or proc.stderr).strip()


def environment(ctx: Context) -> dict[str, Any]:
    facts = json.loads(_query(ctx.python, FACTS) or "{}")
    facts["machine"] = f"{platform.node()}, {platform.platform()}, {os.cpu_count()} cpus"
    if facts.get("nvidia_smi"):
        facts["gpus"] = _command_line(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                                       "--format=csv,noheader"]).splitlines()
    if facts.get("nvcc"):
        facts["nvcc_version"] = _command_line(["nvcc", "--version"]).splitlines()[-1:]
    facts["torch"] = _query(ctx.torch_python, "import torch; print(torch.__version__, torch.version.cuda)")
    return facts


def setup(ctx: Context, facts: dict[str, Any]) -> dict[str, Any]:
    """Install the bundle (no network), fall back on its Python files where needed, build the shim."""
    notes = json.loads((ctx.bundle / "bundle.json").read_text())
    if notes["source"] != source_hash():
        return {"ok": False, "why": f"the bundle was made from another tree (source {notes['source']}, this tree "
                                    f"{source_hash()}): run `make gpu-bundle` again"}
    site, shim = WORK / "site", WORK / "shim"
    shutil.rmtree(site, ignore_errors=True)
    steps = [ctx.run("install", [ctx.python, "-m", "pip", "install", "--quiet", "--no-index", "--no-compile",
                                 "--find-links", str(ctx.bundle / "wheels"), "--target", str(site), "xpuremote",
                                 *_pins()], 300)]
    ctx.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    # what the tests fetch with pip (runtimes besides the pinned ones) comes from the bundle, not the network
    ctx.env |= {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(ctx.bundle / "runtimes")}
    ctx.env["XPU_SHIM_DIR"] = str(shim)
    fallback = _python_fallback(ctx, facts)
    steps.append(ctx.run("build the shim", [ctx.python, "-m", "xpuremote.interpose.build"], 300))
    ok = all(s["rc"] == 0 for s in steps)
    return {"ok": ok, "bundle": notes, "python_files": fallback, "steps": [_brief(s) for s in steps]}


def _python_fallback(ctx: Context, facts: dict[str, Any]) -> str:
    if facts.get("headers") and facts.get("libpython"):
        return "the machine's own"
    archive = next(ctx.bundle.glob("python*.tar.xz"), None)
    if archive is None:
        return "missing, and the bundle has none: the shim will not build"
    target = WORK / "python"
    shutil.rmtree(target, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    lib = target / "lib"
    real = next(lib.glob("libpython*.so*"))
    unversioned = lib / re.sub(r"\.so.*", ".so", real.name)  # what the linker's -lpythonX.Y looks for
    if not unversioned.exists():
        unversioned.symlink_to(real.name)
    include = next((target / "include").iterdir())
    for var, value in (("C_INCLUDE_PATH", include), ("LIBRARY_PATH", lib), ("LD_LIBRARY_PATH", lib)):
        ctx.env[var] = os.pathsep.join(filter(None, [str(value), ctx.env.get(var)]))
    return f"from the bundle ({archive.name})"


# ---- stage 1: the test suite ----------------------------------------------------------------------
# What a GPU shows that the sim cannot, first: NVIDIA's math libraries under PyTorch and the runtimes on real
# kernels, and one client over two servers' real driver addresses. The suite is cut at its limit on a lent
# machine; the thread races (test_client_core) come later.
# test_torch_math.py comes last of them: its end-to-end tests take minutes, and this call's programs and bench
# stage run PyTorch's math on the GPU already.
SUITE_FIRST = ("test_mathlibs.py", "test_torch.py", "test_cudart.py", "test_graphs.py", "test_memory_pools.py",
               "test_sparse.py", "test_sparselt.py", "test_fft.py", "test_linalg.py", "test_nvrtc.py", "test_curand.py",
               "test_several_servers.py", "test_torch_math.py")


def stage_suite(ctx: Context) -> dict[str, Any]:
    env = {**ctx.env, "XPU_TEST_BACKEND": "cuda", "XPU_TORCH_PYTHON": ctx.torch_python,
           "XPU_TEST_FIRST": ",".join(SUITE_FIRST)}
    select = ["-m", "pytest", "-m", "not sim_only", "-p", "no:cacheprovider"]
    if not ctx.gpu:  # CI has just run the whole suite on the sim: check that the GPU's selection collects
        step = ctx.run("collect the GPU selection", [ctx.python, *select, "--collect-only", "-q"], 300, env)
        counts = _pytest_counts(step["output"])
        return {"ok": step["rc"] == 0 and counts.get("collected", 0) > 0, "counts": counts, "steps": [_brief(step)]}
    junit, failure_log, temp = WORK / "suite.xml", WORK / "suite-failures.txt", WORK / "suite-tmp"
    junit.unlink(missing_ok=True)
    failure_log.unlink(missing_ok=True)
    env["XPU_FAILURE_LOG"] = str(failure_log)  # tests/conftest.py adds each failure there as it happens
    # one process: tests compare the GPU's device-wide free memory, which parallel workers would move;
    # -v names each test's outcome as it ends, so a run cut short at its limit still says what passed
    # the tests' own folders stay (--basetemp): their servers' logs say what a test cut short was waiting for
    step = ctx.run("pytest", [ctx.python, *select, "-v", "-rfE", f"--junitxml={junit}", f"--basetemp={temp}"],
                   ctx.left() - 15, env)  # time to read its report back
    verdicts = re.findall(_VERDICT, step["output"], re.M)
    counts = _pytest_counts(step["output"]) if step["rc"] is not None else _tally(verdicts)
    failures = _junit_failures(junit) or _logged_failures(failure_log)
    if failure_log.is_file():
        ctx.log.write(f"\n===== each failure as it happened\n{failure_log.read_text(errors='replace')}")
    if step["rc"] is None:
        for log in sorted(temp.glob("**/server-*.log"), key=lambda f: f.stat().st_mtime)[-2:]:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
            ctx.log.write(f"\n===== the last lines of {log.relative_to(temp)}, a server the cut suite used\n{tail}\n")
    return {"ok": step["rc"] == 0, "counts": counts, "failures": failures, "steps": [_brief(step, 60)]}


def _logged_failures(path: Path) -> list[dict[str, str]]:
    """The failures of a run cut short, from XPU_FAILURE_LOG: each test's assertion lines ("E   ...")."""
    if not path.is_file():
        return []
    failures = []
    for entry in path.read_text(errors="replace").split(FAILURE_HEAD)[1:]:
        head, _, body = entry.partition("\n")
        said = [line[1:].strip() for line in body.splitlines() if line.startswith("E ")]
        failures.append({"test": head, "message": ("\n".join(said) or body[-400:])[:1200]})
    return failures


_VERDICT = r"^(tests/\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)"


def _tally(verdicts: list[tuple[str, str]]) -> dict[str, int]:
    """Counts from the per-test lines (-v) of a run killed before its own tally."""
    counts: dict[str, int] = {"cut short": 1}
    for _, verdict in verdicts:
        counts[verdict.lower()] = counts.get(verdict.lower(), 0) + 1
    return counts


def _pytest_counts(output: str) -> dict[str, int]:
    """pytest's last tally: "3 failed, 230 passed, ..." or "234/263 tests collected (29 deselected)"."""
    last = next((line for line in reversed(output.splitlines())
                 if re.search(r"\d+ (passed|failed|error|errors|skipped|deselected)|tests? collected", line)), "")
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed)", last)}
    if collected := re.search(r"(?:(\d+)/)?(\d+) tests? collected", last):
        counts["collected"] = int(collected[1] or collected[2])
    return counts


def _junit_failures(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    failures = []
    for case in ET.parse(path).iter("testcase"):
        for bad in (*case.iter("failure"), *case.iter("error")):
            failures.append({"test": f"{case.get('classname')}::{case.get('name')}",
                             "message": (bad.get("message") or "")[:400]})
    return failures


# ---- stage 2: programs through xpu-run, and natively ---------------------------------------------------
@dataclass
class Program:
    name: str
    argv: list[str]
    verdict: Callable[[dict[str, Any]], str | None]  # None: passed; else why not


def _exit_ok(step: dict[str, Any]) -> str | None:
    return None if step["rc"] == 0 else f"exit {step['rc']}: {_last_line(step)}"


def _last_line(step: dict[str, Any]) -> str:
    lines = step["output"].strip().splitlines()
    return lines[-1][:300] if lines else "(no output)"


def _json_checks(step: dict[str, Any]) -> str | None:
    """The torch_*_check.py programs: one JSON line of check -> largest difference (or the error)."""
    if step["rc"] != 0:
        return _exit_ok(step)
    results = _checks_of(step)
    if results is None:
        return f"no JSON line: {_last_line(step)}"
    errors = [k for k, v in results.items() if isinstance(v, str)]
    return f"errors in {', '.join(errors)}" if errors else None


def _checks_of(step: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return json.loads(step["output"].strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def programs(ctx: Context) -> list[Program]:
    tests = str(ROOT / "tests" / "programs")
    found = _toolchain(ctx, "cudart_path(12)", "cudart_path(13)")
    progs = []
    for major, lib in zip((12, 13), found + ["None"] * (2 - len(found))):
        for sub in ("properties", "roundtrip", "stream"):
            if lib != "None":
                progs.append(Program(f"cudart{major} {sub}", [ctx.python, f"{tests}/cudart_check.py", lib, sub],
                                     _exit_ok))
    progs.append(Program("cuda-python", [ctx.python, f"{tests}/cuda_python_check.py"], _exit_ok))
    progs.append(Program("cuda-python: arrays and textures", [ctx.python, f"{tests}/array_check.py"], _exit_ok))
    progs.append(Program("cuda-python: green contexts", [ctx.python, f"{tests}/green_check.py"], _exit_ok))
    kernels = _nvcc(ctx, "graph_kernels.fatbin", ["--fatbin", "-DKERNELS_ONLY", "-x", "cu", f"{tests}/driver_api.cu"])
    if kernels:
        progs.append(Program("cuda-python: capture and graphs", [ctx.python, f"{tests}/graph_check.py", kernels],
                             _exit_ok))
    vector_add = _nvcc(ctx, "vector_add", [str(ROOT / "examples" / "vector_add.cu")], link=True)
    if vector_add:
        progs.append(Program("vector_add (nvcc)", [vector_add], _exit_ok))
    progs.append(Program("torch: memory, copies, streams", [ctx.torch_python, f"{tests}/torch_check.py"], _exit_ok))
    for name in ("torch_math_check", "torch_train_check"):
        progs.append(Program(f"torch: {name}", [ctx.torch_python, f"{tests}/{name}.py"], _json_checks))
    return progs


def _toolchain(ctx: Context, *calls: str) -> list[str]:
    """What tests/toolchain.py finds, asked of the checks' Python with the bundle installed."""
    code = "import sys; sys.path.insert(0, 'tests'); import toolchain as t; " + "; ".join(
        f"print(t.{c})" for c in calls)
    return _query(ctx.python, code, ctx.env).splitlines()


def _nvcc(ctx: Context, name: str, args: list[str], link: bool = False) -> str | None:
    """nvcc's output for this device (a program linked against NVIDIA's cudart, or a module image), or None."""
    nvcc, lib = (_toolchain(ctx, "nvcc_path()", "nvcc_lib_dir()") + ["None", "None"])[:2]
    if nvcc == "None":
        return None
    out = WORK / name
    libs = [f"-L{lib}"] if link and lib != "None" else []
    step = ctx.run(f"nvcc {name}", [nvcc, f"-arch=sm_{_compute_capability(ctx)}", *libs, "-o", str(out), *args], 300)
    return str(out) if step["rc"] == 0 else None


def _compute_capability(ctx: Context) -> str:
    if ctx.gpu:
        cap = _command_line(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]).splitlines()
        if cap and re.fullmatch(r"\d+\.\d+", cap[0].strip()):
            return cap[0].strip().replace(".", "")
    return "90"  # the sim reports an H100's compute capability


def start_server(ctx: Context, name: str, extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    address = f"tcp://127.0.0.1:{_free_port()}"
    log = open(WORK / f"server-{name}.log", "w")  # noqa: SIM115 - the server keeps the descriptor
    env = {**ctx.env, "XPU_LOG": "INFO", **(extra_env or {})}
    if not ctx.gpu:
        env["XPU_SIM_KERNELS"] = ",".join(str(ROOT / k) for k in SIM_KERNELS)
    proc = subprocess.Popen([ctx.python, "-m", "xpuremote.server.daemon", "--listen", address, "--backend",
                             ctx.backend], stderr=log, env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while "ready" not in (WORK / f"server-{name}.log").read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"xpu-server did not start: {(WORK / f'server-{name}.log').read_text()[-2000:]}")
        time.sleep(0.1)
    return proc, address


def stage_programs(ctx: Context) -> dict[str, Any]:
    server, address = start_server(ctx, "programs")
    rows, steps = [], []
    shutil.rmtree(WORK / "programs", ignore_errors=True)
    (WORK / "programs").mkdir()  # each program's output through xpu-run, which stage 5 reads
    env = {**ctx.env, "XPU_TEST_BACKEND": ctx.backend}  # the programs expect the backend's device names
    # through xpu-run, each call that fails is logged with the client's reason: a check that fails only
    # there says why in the log, not only which status it got
    remote_env = {**env, "XPU_LOG": "DEBUG"}
    try:
        for prog in programs(ctx):
            if ctx.left() < 5:  # the stage's share is spent: the rest say so rather than fail at once
                rows.append({"program": prog.name, "xpuremote": "not run: the stage's time ran out", "xpuremote_s": 0})
                continue
            remote = ctx.run(f"{prog.name} via xpu-run", [ctx.python, "-m", "xpuremote.interpose.run", "--server",
                                                          address, "--", *prog.argv], 240, remote_env)
            (WORK / "programs" / f"{re.sub(r'[^a-z0-9]+', '-', prog.name.lower())}.log").write_text(remote["output"])
            row = {"program": prog.name, "xpuremote": prog.verdict(remote) or "pass", "xpuremote_s": remote["seconds"],
                   "xpuremote_checks": _checks_of(remote) if prog.verdict is _json_checks else None}
            steps.append(remote)
            if ctx.gpu:
                native = ctx.run(f"{prog.name} natively", prog.argv, 240, env)
                row |= {"native": prog.verdict(native) or "pass", "native_s": native["seconds"],
                        "native_checks": _checks_of(native) if prog.verdict is _json_checks else None}
                steps.append(native)
            rows.append(row)
    finally:
        _kill_group(server.pid)
    ok = bool(rows) and all(r["xpuremote"] == "pass" and r.get("native", "pass") == "pass" for r in rows)
    return {"ok": ok, "server": f"xpu-server --backend {ctx.backend} at {address}", "programs": rows,
            "steps": [_brief(s, 8) for s in steps]}


# ---- the plan: shares of a call's time ---------------------------------------------------------------
class Schedule:
    """Items run one after another toward one end, each with a share (seconds). Item i may run until the end less
    the shares of the items after it: one that ends early leaves its time to those after it, and none takes what
    those after it are owed. Where the time is less than the shares, each share shrinks in proportion."""

    def __init__(self, seconds: float, shares: list[float], clock: Callable[[], float] = time.monotonic) -> None:
        self.clock, self.end = clock, clock() + seconds
        total = sum(shares)
        self.shares = [share * min(1.0, seconds / total) if total else share for share in shares]

    def limit(self, i: int, most: float | None = None) -> float:
        left = self.end - self.clock() - sum(self.shares[i + 1:])
        return max(0.0, left if most is None else min(most, left))


# ---- stage 3: benchmarks -------------------------------------------------------------------------------
E2E = ("mlp_train", "cnn_train_fp32", "cnn_train_amp", "gpt2_step_bf16", "cnn_infer_b1", "cnn_infer_b32",
       "mlp_compile_graph", "gpt2_generate")
SIM_E2E = ("mlp_train", "cnn_infer_b1")  # the sim runs PyTorch with its kernels skipped, at toy sizes
# a step of gpt2_generate takes seconds through xpuremote (5.5 on the H200): three steps say it
GPU_STEPS = {"gpt2_generate": ["--steps", "3", "--warmup", "1"]}
SIM_TORCH = {"XPU_SIM_SKIP_KERNELS": "1"}
# Each item's share of the stage, in seconds (on a GPU, on the sim), in the order they run: what it took in the
# recorded runs (bench/results/gpu/, docs/gpu-check.md) and a little more. A workload's time is mostly its two
# processes' start (PyTorch, the CUDA context, the libraries, the warm-up), not its steps: a share cuts its steps
# short where it must, and the last ones take what the others left.
BENCH_SHARES = {"foundation": (45, 40), "graphs": (12, 15), "allocators": (40, 40),
                "mlp_train": (24, 20), "cnn_train_fp32": (28, 0), "cnn_train_amp": (28, 0), "gpt2_step_bf16": (33, 0),
                "cnn_infer_b1": (16, 20), "cnn_infer_b32": (14, 0), "mlp_compile_graph": (55, 0),
                "gpt2_generate": (40, 0)}


def _bench_commands(ctx: Context, out: Path) -> dict[str, tuple[list[str], dict[str, str] | None]]:
    """The benchmarks besides PyTorch's workloads, each with its environment (None: the check's)."""
    torch_env = {**ctx.env, "XPU_TORCH_PYTHON": ctx.torch_python}
    # a GPU's sync calls take ~80 µs: 5,000 a repeat are 0.4 s of each row, and the 5 repeats' spread is drift
    counts = ["--sync-n", "5000", "--async-n", "100000"] if ctx.gpu else ["--quick"]
    return {"foundation": ([ctx.python, "bench/foundation.py", "--backend", ctx.backend, *counts, "--out",
                            str(out / "foundation.json")], None),
            "graphs": ([ctx.python, "bench/graphs.py", "--backend", ctx.backend,
                        *([] if ctx.gpu else ["--steps", "30"]), "--out", str(out / "graphs.json")], None),
            "allocators": ([ctx.python, "bench/allocators.py", "--backend", ctx.backend, "--out",
                            str(out / "allocators.json")], torch_env)}


def stage_bench(ctx: Context) -> dict[str, Any]:
    out = WORK / "bench"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    commands = _bench_commands(ctx, out)
    workloads = E2E if ctx.gpu else SIM_E2E
    names = [*commands, *workloads]
    plan = Schedule(ctx.left(), [BENCH_SHARES[n][0 if ctx.gpu else 1] for n in names])
    env = {**ctx.env, **({} if ctx.gpu else SIM_TORCH)}
    steps, rows, e2e = [], [], []
    for i, name in enumerate(names):
        limit = plan.limit(i)
        if name in commands:
            cmd, item_env = commands[name]
            steps.append(ctx.run(name, cmd, limit, item_env))
            rows.append(_plan_row(name, plan.shares[i], limit, steps[-1]))
            continue
        size = GPU_STEPS.get(name, []) if ctx.gpu else ["--size", "small", "--steps", "2", "--warmup", "1"]
        folder = out / name
        # the workload's own budget ends a few seconds before its limit: its report is written in time
        steps.append(ctx.run(f"torch_e2e {name}", [ctx.torch_python, "bench/torch_e2e.py", "--backend", ctx.backend,
                                                   "--workloads", name, "--budget", f"{max(limit - 4, 10):.0f}",
                                                   *size, "--out", str(folder)], limit, env))
        result = _read_json(folder / "torch_e2e.json").get("results", [{"workload": name, "native": {}, "remote": {
            "error": f"no result ({_outcome(steps[-1])})"}}])
        e2e += result
        rows.append(_plan_row(name, plan.shares[i], limit, steps[-1], result[0]))
    ok = all(step["rc"] == 0 for step in steps[:len(commands)]) and bool(_read_json(out / "foundation.json")) and all(
        "error" not in r.get("remote", {"error": 1}) and (not ctx.gpu or "error" not in r.get("native", {}))
        for r in e2e)
    return {"ok": ok, "plan": rows, **_results(out, commands), "torch_e2e": e2e,
            "steps": [_brief(step, 12) for step in steps]}


def _results(out: Path, names: Iterable[str]) -> dict[str, Any]:
    """Each benchmark's JSON and Markdown, as `out` holds them."""
    return {k: v for name in names for k, v in ((name, _read_json(out / f"{name}.json")),
                                                 (f"{name}_markdown", _markdown(out / f"{name}.md")))}


def _outcome(step: dict[str, Any]) -> str:
    return "done" if step["rc"] == 0 else "cut at its limit" if step["rc"] is None else f"exit {step['rc']}"


def _plan_row(name: str, share: float, limit: float, step: dict[str, Any],
              e2e: dict[str, Any] | None = None) -> dict[str, Any]:
    """What an item of the stage was given and took, and for a workload the steps each run timed."""
    row = {"item": name, "share_s": round(share), "limit_s": round(limit), "seconds": step["seconds"],
           "outcome": _outcome(step)}
    if e2e is not None:
        runs = {side: e2e.get(side, {}) for side in ("native", "remote")}
        row["steps"] = {side: run.get("steps", len(run.get("steps_s", []))) for side, run in runs.items()
                        if "steps_s" in run}
        row["steps_asked"] = next((run["steps_asked"] for run in runs.values() if "steps_asked" in run), None)
    return row


def _markdown(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


# ---- stage 4: xpu-perf validate -------------------------------------------------------------------------
# The five PyTorch workloads, each recorded at loopback and run over RTT {25, 100, 500, 2000} µs x {10, 100}
# Gbit/s (bench/perf_validate.py --torch): its nine processes start together and time their steps one at a time, so
# a workload costs about one process's start, its nine timed windows and the model. The cheapest first: a stage
# shorter than the shares runs those whose whole share is left, and names the others as not run (on a GPU the one
# call's 45 s hold mlp_train; `STAGES=4` alone, about 190 s, all five).
PERF_E2E = ("mlp_train", "cnn_infer_b1", "gpt2_step_bf16", "cnn_train_fp32", "gpt2_generate")
SIM_PERF_E2E = ("mlp_train", "gpt2_generate")  # the sim's: two links, its steps at toy sizes
# Each workload's share (on a GPU, on the sim), in seconds: a start of nine processes on 16 cores (~15 s, from one
# process's ~11 s), the timed steps (10 a run; gpt2_generate 2 of 8 tokens: ~0.7 s a step through xpuremote), the
# exits and the model; on the sim, the runs measured (three processes: 14 and 20 s alone on the 2-core machine,
# 28 and 40 s while other work ran there).
PERF_SHARES = {"mlp_train": (30, 40), "cnn_infer_b1": (30, 0), "gpt2_step_bf16": (40, 0),
               "cnn_train_fp32": (40, 0), "gpt2_generate": (50, 45)}
PERF_STEPS = {"gpt2_generate": ["--steps", "2", "--warmup", "1", "--new-tokens", "8"]}
def stage_perf(ctx: Context) -> dict[str, Any]:
    workloads = PERF_E2E if ctx.gpu else SIM_PERF_E2E
    shares = [PERF_SHARES[w][0 if ctx.gpu else 1] for w in workloads]
    # all the shares if they fit, else each its whole share while the stage's time lasts
    plan = Schedule(ctx.left(), shares) if ctx.left() >= sum(shares) else None
    grid = [] if ctx.gpu else ["--rtt-us", "500,2000", "--gbps", "10"]
    # on the sim, the twins of PyTorch's kernels its servers run (validate starts its own)
    env = {**ctx.env, **({} if ctx.gpu else {**SIM_TORCH, "XPU_SIM_KERNELS": ",".join(str(ROOT / k)
                                                                                       for k in SIM_KERNELS)})}
    out = WORK / "perf"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    results, steps = [], []
    for i, workload in enumerate(workloads):
        if plan is None and ctx.left() < shares[i]:  # it would be cut before its end
            results.append({"workload": workload, "not run": f"{ctx.left():.0f} s left in the stage, its share "
                                                              f"{shares[i]} s"})
            continue
        limit = plan.limit(i) if plan else shares[i]
        size = (PERF_STEPS.get(workload, ["--steps", "10", "--warmup", "2"]) if ctx.gpu
                else ["--size", "small", "--steps", "3", "--warmup", "1"])
        record = out / f"{workload}.json"
        steps.append(ctx.run(f"xpu-perf validate {workload}", [
            ctx.python, "bench/perf_validate.py", "--torch", "--backend", ctx.backend, "--workloads", workload,
            *grid, *size, "--torch-python", ctx.torch_python, "--timeout", f"{max(limit - 5, 5):.0f}",
            "--out", str(record)], limit, env))
        found = _read_json(record)
        results += found.get("workloads") or [{"workload": workload, "error": (found.get("failures") or [{}])[0].get(
            "error", "") or f"no result ({_outcome(steps[-1])}): {_last_line(steps[-1])}"}]
    done = [r for r in results if "points" in r]
    merged = out / "perf.json"  # the workloads' reports as one, with its table against the aims
    if done:
        steps.append(ctx.run("perf report", [ctx.python, "bench/perf_validate.py", "--merge",
                                             *(str(out / f"{r['workload']}.json") for r in done),
                                             "--out", str(merged)], 60, env))
    ok = bool(done) and all("error" not in r for r in results)
    return {"ok": ok, "validations": results, "summary": _read_json(merged).get("summary"),
            "markdown": _markdown(merged.with_suffix(".md")), "steps": [_brief(s, 12) for s in steps]}


def _last_json(output: str) -> dict[str, Any] | None:
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


# ---- stage 5: the driver's answers beside the shim's ---------------------------------------------------
def stage_answers(ctx: Context) -> dict[str, Any]:
    record = WORK / "answers.json"
    logs = sorted(str(p) for p in (WORK / "programs").glob("torch*.log")) if (WORK / "programs").is_dir() else []
    step = ctx.run("driver answers", [ctx.python, "bench/driver_answers.py", "--backend", ctx.backend, "--out",
                                      str(record), *[a for log in logs for a in ("--tables-log", log)]], 300)
    answers = _read_json(record)
    text = _markdown(record.with_suffix(".md"))
    return {"ok": step["rc"] == 0 and bool(answers), "answers": answers, "markdown": text,
            "steps": [_brief(step, 12)]}


# ---- stage 6: where a PyTorch step's time goes, call by call ---------------------------------------------
# One workload on a GPU, in the call's share (a trace of gpt2_generate alone took 50-56 s, and a trace turns the
# client's C paths off: client_cpu says more about it); the sim's two are quick.
CALLS_E2E = ("cnn_infer_b1",)  # the furthest from native of the quick ones: cuDNN's calls
CALLS_CPU = ("cnn_infer_b1",)  # the client's CPU a call, untraced


def _calls_commands(ctx: Context, out: Path) -> dict[str, list[str]]:
    """The CPU each side spends a call: libcudart's async calls (both ends), the worker's lane records and its
    math-library calls. On a GPU with 3 repeats (native_lane's and server_calls' medians of 5 moved under 10% from
    one run to the next) and async_calls with 100,000 calls (0.1 s of its lane's)."""
    if ctx.gpu:
        sizes = {"async_calls": ["--calls", "100000", "--repeats", "3"], "native_lane": ["--repeats", "3"],
                 "server_calls": ["--repeats", "3"]}
    else:
        sizes = {"async_calls": ["--calls", "20000", "--repeats", "1"], "native_lane": ["--records", "5000"],
                 "server_calls": ["--rounds", "200"]}
    backend = {"async_calls": ctx.backend, "native_lane": "cuda" if ctx.gpu else "stand-in",
               "server_calls": "cuda" if ctx.gpu else "stand-in"}
    return {name: [ctx.python, f"bench/{name}.py", "--backend", backend[name], *sizes[name], "--out",
                   str(out / f"{name}.json")] for name in sizes}


def stage_calls(ctx: Context) -> dict[str, Any]:
    """The CPU a call costs each side (bench/async_calls.py, native_lane.py, server_calls.py); each workload recorded
    (a warm-up, then 2 steps, the GPU's time measured), then `xpu-perf predict` at the recorded link and `xpu-perf
    calls` over the run's second half (past the warm-up); bench/client_cpu.py, the client's CPU a call untraced."""
    out = WORK / "calls"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    commands = _calls_commands(ctx, out)
    steps = [ctx.run(name, cmd, 180) for name, cmd in commands.items()]
    benches_ok = all(step["rc"] == 0 for step in steps)
    size = [] if ctx.gpu else ["--size", "small"]
    env = {**ctx.env, **({} if ctx.gpu else SIM_TORCH)}  # a trace times the GPU's work by default
    results = []
    for workload in CALLS_E2E if ctx.gpu else SIM_E2E:
        path = WORK / f"{workload}.trace"
        path.unlink(missing_ok=True)
        run = [ctx.torch_python, "bench/torch_e2e.py", "--run", workload, "--steps", "2", "--warmup", "1", *size]
        steps.append(ctx.run(f"record {workload}", [ctx.python, "-m", "xpuremote.interpose.run", "--backend",
                                                    ctx.backend, "--trace", str(path), "--", *run], 240, env))
        if steps[-1]["rc"] != 0:
            results.append({"workload": workload, "error": _last_line(steps[-1])})
            continue
        perf = [ctx.python, "-m", "xpuremote.perfmodel.cli"]
        steps.append(ctx.run(f"predict {workload}", [*perf, "predict", "--rtt-us", "0", "--json", str(path)], 120))
        predict = _last_json(steps[-1]["output"]) or {}
        half_ms = str(predict.get("trace_s", 0) * 500)  # the recorded run's second half: past the warm-up
        steps.append(ctx.run(f"calls {workload}", [*perf, "calls", "--top", "25", "--from-ms", half_ms, "--json",
                                                   str(path)], 120))
        results.append({"workload": workload, "predict": predict, "calls": _last_json(steps[-1]["output"])})
        path.unlink(missing_ok=True)  # large; the tables are what comes back
    cpu_out = out / "client_cpu.json"  # the same steps untraced: the client's CPU a call, its C paths on
    steps.append(ctx.run("client_cpu", [ctx.python, "bench/client_cpu.py", "--backend", ctx.backend, "--repeats", "1",
                                        "--workloads", ",".join(CALLS_CPU), "--out", str(cpu_out)], 240,
                         {**ctx.env, "XPU_TORCH_PYTHON": ctx.torch_python}))
    client_cpu = _read_json(cpu_out)
    ok = benches_ok and all("error" not in r and r["predict"] and r["calls"] for r in results) and bool(client_cpu)
    return {"ok": ok, **_results(out, commands), "workloads": results, "client_cpu": client_cpu,
            "client_cpu_markdown": _markdown(cpu_out.with_suffix(".md")), "steps": [_brief(s, 12) for s in steps]}


STAGES: dict[str, Callable[[Context], dict[str, Any]]] = {
    "1": stage_suite, "2": stage_programs, "3": stage_bench, "4": stage_perf, "5": stage_answers, "6": stage_calls}
STAGE_NAMES = {"1": "suite", "2": "programs", "3": "bench", "4": "perf", "5": "answers", "6": "calls"}
# The one call: the stages that time something first, alone, then the others; the suite takes what is left.
DEFAULT_STAGES = "3,6,4,2,5,1"
CALL_LIMIT = 550  # seconds for the whole command: a 10-minute call with the machine's start and the transfers
# Each stage's share of the call, in seconds (on a GPU, on the sim): what it took in the recorded runs with this
# plan's sizes (docs/gpu-check.md), the set-up's ~15 s aside. The bench stage never runs past BENCH_MOST.
STAGE_SHARES = {"3": (335, 150), "6": (65, 60), "4": (45, 90), "2": (85, 90), "5": (5, 30), "1": (0, 30)}
BENCH_MOST = 345  # the bound for every figure of stage 3 is 6 minutes


# ---- the report --------------------------------------------------------------------------------------
def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [f"# xpuremote GPU check, backend {report['backend']} ({report['when']})", "",
             f"Command: `{report['command']}`", "",
             f"Machine: {env.get('machine')}; GPUs: {'; '.join(env.get('gpus', [])) or 'none'}; "
             f"Python {env.get('python')} ({env.get('executable')}, shared libpython: {env.get('shared_libpython')}); "
             f"torch {env.get('torch') or '-'}; nvcc: {' '.join(env.get('nvcc_version', [])) or '-'}", "",
             f"Set-up: {'ok' if report['setup'].get('ok') else 'FAILED: ' + str(report['setup'].get('why', ''))}; "
             f"Python headers and libpython: {report['setup'].get('python_files', '-')}", ""]
    for key, stage in report["stages"].items():
        lines += [f"## Stage {key}: {STAGE_NAMES[key]} — {'pass' if stage.get('ok') else 'FAIL'} "
                  f"({stage.get('seconds', 0):.0f} s of its {stage.get('limit', '-')})", ""]
        lines += SECTIONS[key](stage) if "why" not in stage else [f"Not run: {stage['why']}"]
        lines.append("")
    return "\n".join(lines) + "\n"


def _md_suite(stage: dict[str, Any]) -> list[str]:
    out = [", ".join(f"{n} {k}" for k, n in stage.get("counts", {}).items()) or "(no counts)"]
    out += [f"- FAIL `{f['test']}`: {f['message'][:200]}" for f in stage.get("failures", [])]
    return out


def _md_programs(stage: dict[str, Any]) -> list[str]:
    rows = ["| program | through xpuremote | s | natively | s |", "|---|---|---|---|---|"]
    rows += [f"| {r['program']} | {r['xpuremote']} | {r['xpuremote_s']} | {r.get('native', '-')} | "
             f"{r.get('native_s', '-')} |" for r in stage.get("programs", [])]
    return [stage.get("server", ""), "", *rows]


def _md_bench(stage: dict[str, Any]) -> list[str]:
    out = _md_plan(stage.get("plan", []))
    out += ["", *(re.sub(r"^#", "###", line) for line in stage.get("foundation_markdown", "").splitlines())]
    for key in ("graphs_markdown", "allocators_markdown"):
        out += ["", *(re.sub(r"^#", "###", line) for line in stage.get(key, "").splitlines())]
    out += ["", "### PyTorch end to end", "", "| workload | native ms/step | xpuremote ms/step | slowdown | "
            "CPU ms/step: native; application, server |", "|---|---|---|---|---|"]
    for r in stage.get("torch_e2e", []):
        n, x = r.get("native", {}), r.get("remote", {})
        if "not run" in r:
            out.append(f"| {r['workload']} | not run: {r['not run']} | | | |")
            continue
        ratio = f"{x['median_ms'] / n['median_ms']:.2f}x" if "median_ms" in n and "median_ms" in x else "-"
        out.append(f"| {r['workload']} | {_cell(n)} | {_cell(x)} | {ratio} | {cpu_split(n, x)} |")
    return out


def _md_plan(rows: list[dict[str, Any]]) -> list[str]:
    """Each item's share of the stage, its limit (its share and what the items before it left), what it took."""
    if not rows:
        return []
    out = ["| item | share s | limit s | took s | outcome | steps timed (native, xpuremote) |",
           "|---|---:|---:|---:|---|---|"]
    for r in rows:
        steps = ", ".join(str(r["steps"].get(side, "-")) for side in ("native", "remote")) if "steps" in r else ""
        asked = f" of {r['steps_asked']}" if steps and r.get("steps_asked") else ""
        out.append(f"| {r['item']} | {r['share_s']} | {r['limit_s']} | {r['seconds']:.0f} | {r['outcome']} | "
                   f"{steps}{asked} |")
    return out


def _cell(run: dict[str, Any]) -> str:
    if "median_ms" in run:
        return f"{run['median_ms']:.2f}"
    return "error: " + run["error"].strip().splitlines()[-1][:100] if "error" in run else run.get("skipped", "-")


def _md_perf(stage: dict[str, Any]) -> list[str]:
    """The workloads' points against the issue's aims (bench/perf_validate.py's table), and the workloads not run."""
    table = stage.get("markdown", "").split("\n\n", 3)[-1:]  # past its title, command and machine
    out = [line for line in table[0].splitlines()] if stage.get("markdown") else []
    out += [f"- {r['workload']}: {'not run: ' + r['not run'] if 'not run' in r else 'error: ' + r['error'][-300:]}"
            for r in stage.get("validations", []) if "points" not in r]
    return out


def _md_answers(stage: dict[str, Any]) -> list[str]:
    """bench/driver_answers.py's own Markdown, its headings put under this stage's (as foundation.py's)."""
    return [re.sub(r"^#", "###", line) for line in stage.get("markdown", "").splitlines()]


def _md_calls(stage: dict[str, Any]) -> list[str]:
    out = []
    for key in ("async_calls_markdown", "native_lane_markdown", "server_calls_markdown"):
        out += [*(re.sub(r"^#", "###", line) for line in stage.get(key, "").splitlines()), ""]
    for w in stage.get("workloads", []):
        out += [f"### {w['workload']}", ""]
        if "error" in w:
            out += [f"error: {w['error']}", ""]
            continue
        p, c = w.get("predict") or {}, w.get("calls") or {}
        b = p.get("breakdown_s", {})
        out += [f"Recorded {p.get('trace_s', 0):.3f} s, {p.get('round_trips', '-')} round trips; at the recorded link: "
                + ", ".join(f"{k} {v:.3f} s" for k, v in b.items()), "",
                f"Calls from {c.get('from_s', 0):.3f} s on (the run's second half), dearest first; the GPU's work "
                f"of their messages: {_seconds(c.get('gpu_s'))}", "",
                "| call | class | count | inside ms | µs/call | server ms | waits | wait ms |",
                "|---|---|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {r['name']} | {r['cls']} | {r['count']} | {r['inside_ns'] / 1e6:.2f} | "
                f"{r['inside_ns'] / r['count'] / 1e3:.2f} | {r['server_ns'] / 1e6:.2f} | {r['waits']} | "
                f"{r['wait_ns'] / 1e6:.2f} |" for r in c.get("calls", [])]
        out.append("")
    cpu = stage.get("client_cpu_markdown", "").splitlines()
    if cpu:  # its own title, and its headings two levels down
        out += ["### The client's CPU a call, untraced (bench/client_cpu.py)", "",
                *("##" + line if line.startswith("#") else line for line in cpu[1:])]
    return out


def _seconds(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.3f} s"


SECTIONS = {"1": _md_suite, "2": _md_programs, "3": _md_bench, "4": _md_perf, "5": _md_answers, "6": _md_calls}


def _stage(ctx: Context, key: str, set_up: bool, limit: float) -> dict[str, Any]:
    if not set_up:
        return {"ok": False, "why": "set-up failed"}
    if limit < 5:
        return {"ok": False, "why": f"no time left in the call ({limit:.0f} s)"}
    try:
        return STAGES[key](ctx)
    except Exception as exc:  # noqa: BLE001 - one stage's crash must not lose the others' results
        return {"ok": False, "why": f"{type(exc).__name__}: {exc}"}


def run(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "XPU_SERVER", "XPU_TEST_BACKEND")}
    env["PYTHONUNBUFFERED"] = "1"
    with open(args.out / "gpu-check.log", "w") as log:
        # a path, since the benches that take XPU_TORCH_PYTHON look for the file
        torch_python = args.torch_python or args.python
        ctx = Context(args.backend, args.python, shutil.which(torch_python) or torch_python, args.bundle.resolve(), log,
                      env)
        facts = environment(ctx)
        report: dict[str, Any] = {"command": shlex.join(sys.argv), "when": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                                  "backend": args.backend, "environment": facts, "stages": {}}
        call_end = time.monotonic() + args.call_limit
        started = time.monotonic()
        report["setup"] = setup(ctx, facts)
        report["setup"]["seconds"] = round(time.monotonic() - started, 1)
        keys = args.stages.split(",")
        plan = Schedule(call_end - time.monotonic(), [STAGE_SHARES[k][0 if ctx.gpu else 1] for k in keys])
        most = {"1": args.suite_limit, "3": args.bench_limit or (BENCH_MOST if ctx.gpu else None)}
        for i, key in enumerate(keys):
            started, limit = time.monotonic(), plan.limit(i, most.get(key))
            ctx.deadline = started + limit
            print(f"stage {key} ({STAGE_NAMES[key]}): up to {limit:.0f} s", flush=True)
            result = _stage(ctx, key, report["setup"]["ok"], limit)
            report["stages"][key] = {**result, "stage": STAGE_NAMES[key], "limit": round(limit),
                                     "seconds": round(time.monotonic() - started)}
            print(f"stage {key} ({STAGE_NAMES[key]}): {'pass' if result['ok'] else 'FAIL'}", flush=True)
            (args.out / "gpu-check.json").write_text(json.dumps(report, indent=1) + "\n")  # after each stage
            (args.out / "gpu-check.md").write_text(markdown(report))
    print((args.out / "gpu-check.md").read_text())
    return 0 if report["setup"]["ok"] and all(s["ok"] for s in report["stages"].values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    b = sub.add_parser("bundle", help="make the bundle (here, with the package index)")
    b.add_argument("--out", type=Path, default=ROOT / "gpu-bundle")
    b.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    b.add_argument("--headers-from", help="a local Python of that version whose headers and libpython to carry")
    r = sub.add_parser("run", help="install the bundle, build the shim, run the stages")
    r.add_argument("--bundle", type=Path, default=ROOT / "gpu-bundle")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--backend", choices=["cuda", "sim"], default="cuda")
    r.add_argument("--stages", default=DEFAULT_STAGES, help=f"in order (default {DEFAULT_STAGES})")
    r.add_argument("--python", default=sys.executable, help="the Python that runs the checks (default: this one)")
    r.add_argument("--torch-python", help="a Python with torch (default: --python)")
    r.add_argument("--call-limit", type=float, default=CALL_LIMIT,
                   help=f"seconds for the whole command, shared among the stages (default {CALL_LIMIT})")
    r.add_argument("--suite-limit", type=float, help="at most this many seconds for stage 1 (default: what is left)")
    r.add_argument("--bench-limit", type=float, help=f"at most this many seconds for stage 3 (default {BENCH_MOST} on "
                                                     "a GPU)")
    args = parser.parse_args(argv)
    if args.verb == "bundle":
        return bundle(args.out, args.python_version, args.headers_from)
    if unknown := set(args.stages.split(",")) - set(STAGES):
        parser.error(f"unknown stages {sorted(unknown)}: choose from {','.join(STAGES)}")
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
