"""The client core runs in an interpreter of its own (interpose/core.c): any application Python works,
and threads that call the driver under their own locks never wait for the application's GIL.

The other Pythons are whatever this machine has beside the tests' own: Debian's system python3 (a
static build) and interpreters of other minor versions found on the PATH or under pyenv. Each runs
NVIDIA's libcudart round trips through the shim built for the tests' Python. Conda and uv interpreters
are not among them: neither installs here (no conda channel is reachable, and uv downloads its
standalone builds from GitHub). What sets them apart is covered all the same: uv's builds are static,
as Debian's is, and a conda environment's own libraries are the application's, which the core's
link-map namespace does not load. The threaded cases
(tests/programs/thread_check.py) each repeat their race 200 times, bounded in time: they hung or
deadlocked while the client shared the application's interpreter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, TORCH_SIM_KERNELS, Server, assert_all_ok, start_server
from test_cudart import SCRIPT as CUDART_SCRIPT
from test_torch import run_torch
from toolchain import cudart_path

THREADS = ROOT / "tests" / "programs" / "thread_check.py"


def version_of(exe: str) -> str | None:
    """`major.minor (build)` of a Python, or None where it does not run as one."""
    probe = "import sys, sysconfig; print(sys.version.split()[0], sysconfig.get_config_var('Py_ENABLE_SHARED'))"
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH")}
    try:
        out = subprocess.run([exe, "-c", probe], capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def other_pythons() -> dict[str, str]:
    """Interpreters other than the tests' own, by what they are: Debian's, and one per other minor version."""
    ours = sys.version.split()[0]
    found: dict[str, str] = {}
    if (v := version_of("/usr/bin/python3")) and v.split()[0] != ours:
        found["system"] = "/usr/bin/python3"
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [shutil.which(f"python3.{m}") for m in range(10, 15)]
    candidates += sorted(str(p) for p in pyenv.glob("3.1[0-9]*/bin/python3"))
    for exe in filter(None, candidates):
        v = version_of(exe)
        minor = v and ".".join(v.split()[0].split(".")[:2])
        if minor and minor != ".".join(ours.split(".")[:2]) and minor not in found:
            found[minor] = exe
    return found


PYTHONS = other_pythons()


@pytest.fixture(scope="module")
def torch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """PyTorch's kernels skipped where the sim has none: the threads' calls are what is tested."""
    srv = start_server(tmp_path_factory.mktemp("torch-threads"),
                       env={"XPU_SIM_KERNELS": TORCH_SIM_KERNELS, "XPU_SIM_SKIP_KERNELS": "1"})
    yield srv
    srv.stop()


@pytest.mark.parametrize("which", sorted(PYTHONS) or ["none"])
def test_cudart_round_trips_under_another_python(run_on, which: str) -> None:
    """The application's interpreter is another build or version than xpuremote's: the client
    still runs (in its own), and NVIDIA's runtime moves bytes correctly."""
    if which == "none":
        pytest.skip("this machine has no Python other than the tests' own (Debian's python3, pyenv, python3.1x)")
    cudart = cudart_path(13)
    if cudart is None:
        pytest.skip("the CUDA 13 runtime wheel is not installed")
    proc = run_on([PYTHONS[which], str(CUDART_SCRIPT), cudart, "roundtrip"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '"copy_mismatch_at": null' in proc.stdout and "mismatch_at\": 0" not in proc.stdout, proc.stdout[-2000:]
    assert "ERROR" not in proc.stderr, proc.stderr[-3000:]


def test_a_path_that_shadows_cffi_does_not_reach_the_client(run_on, tmp_path: Path) -> None:
    """What broke the client when it ran in the application's interpreter: the application's path puts
    another cffi first. The core's interpreter ignores the application's PYTHONPATH."""
    (tmp_path / "_cffi_backend.py").write_text('raise ImportError("not the cffi xpuremote was built with")\n')
    cudart = cudart_path(13)
    if cudart is None:
        pytest.skip("the CUDA 13 runtime wheel is not installed")
    proc = run_on([sys.executable, str(CUDART_SCRIPT), cudart, "roundtrip"], PYTHONPATH=str(tmp_path))
    assert proc.returncode == 0 and '"copy_mismatch_at": null' in proc.stdout, proc.stderr[-3000:]


def test_the_environment_is_read_at_the_first_call_not_at_exec(run_on, two_devices: Server) -> None:
    """The core's libc has an environment of its own: it must be the application's as of its first CUDA
    call, so a CUDA_VISIBLE_DEVICES set by the program itself still picks the device."""
    body = ("import ctypes, os\nos.environ['CUDA_VISIBLE_DEVICES'] = '1'\ncu = ctypes.CDLL('libcuda.so.1')\n"
            "n = ctypes.c_int()\nprint(cu.cuInit(0), cu.cuDeviceGetCount(ctypes.byref(n)), n.value)\n")
    proc = run_on([sys.executable, "-c", body], address=two_devices.address)
    assert proc.stdout.split() == ["0", "0", "1"], proc.stderr[-3000:]


@pytest.mark.parametrize("case", ["streams_events", "spin", "mutex"])
def test_threads_calling_the_driver(run_on, case: str) -> None:
    assert_all_ok(run_on([sys.executable, str(THREADS), case, "200"], timeout=300), at_least=1)


@pytest.mark.parametrize("case, rounds", [("torch_streams", 100), ("dataloader", 200), ("autograd", 200)])
def test_threads_in_pytorch(torch_server: Server, case: str, rounds: int) -> None:
    assert_all_ok(run_torch(torch_server, [str(THREADS), case, str(rounds)]), at_least=1)


def test_an_install_reached_through_pythonpath_serves_a_python_without_cffi(server: Server, tmp_path: Path) -> None:
    """xpuremote and its dependencies in a folder of their own (as `pip install --target` leaves them),
    reached through PYTHONPATH from a Python whose environment lacks cffi: the core's interpreter is
    given that folder before cffi starts (on the first GPU machine every call failed NOT_INITIALIZED)."""
    cudart = cudart_path(13)
    if cudart is None:
        pytest.skip("the CUDA 13 runtime wheel is not installed")
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "xpuremote").symlink_to(ROOT)  # the checkout is the package
    # the dependencies from where this Python finds them: its environment, and a folder on PYTHONPATH (the
    # GPU check installs them so, for a Python without pyzmq and cffi)
    paths = sysconfig.get_paths()
    places = [*os.environ.get("PYTHONPATH", "").split(os.pathsep), paths["purelib"], paths["platlib"]]
    for place in dict.fromkeys(p for p in places if p and Path(p).is_dir()):
        for entry in Path(place).iterdir():
            linked = folder / entry.name
            if not entry.name.startswith(("xpuremote", "__editable__", "_xpuremote")) and not linked.exists():
                linked.symlink_to(entry)
    bare = tmp_path / "bare"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = str(bare / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(folder)
    proc = subprocess.run([python, "-m", "xpuremote.interpose.run", "--server", server.address, "--",
                           python, str(CUDART_SCRIPT), cudart, "roundtrip"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and '"copy_mismatch_at": null' in proc.stdout, proc.stderr[-3000:]


def test_a_program_that_loads_and_frees_the_library_itself_exits_cleanly(server: Server, shim: Path) -> None:
    """Loaded with cffi's dlopen (no LD_PRELOAD, as the cuda backend loads a libcuda), libcuda.so.1 was
    closed when that interpreter shut down, and the core's exit handlers then jumped into it (SIGSEGV)."""
    body = ("import cffi, sys\nffi = cffi.FFI()\nffi.cdef('int cuInit(unsigned); int cuDeviceGetCount(int *);')\n"
            "lib = ffi.dlopen(sys.argv[1])\nn = ffi.new('int *')\n"
            "print(lib.cuInit(0), lib.cuDeviceGetCount(n), n[0])\n")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    proc = subprocess.run([sys.executable, "-c", body, str(shim)], env={**env, "XPU_SERVER": server.address},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["0", "0", "1"], (proc.returncode, proc.stderr[-3000:])
