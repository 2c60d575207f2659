"""Real programs built with nvcc, run through the shim against the session's server.

- tests/programs/driver_api.cu: the driver API only (host part built with -cudart none and linked
  against the shim's libcuda.so.1; its kernels built separately as a fatbin and a cubin);
- examples/vector_add.cu: the runtime API, with NVIDIA's static cudart.
On the sim their kernels run through the host implementations in tests/sim_kernels.py and
examples/sim_kernels.py; on a GPU (XPU_TEST_BACKEND=cuda) the kernels nvcc built for sm_90 run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DEVICE_NAME, Build
from toolchain import nvcc_lib_dir

ROOT = Path(__file__).resolve().parent.parent
DRIVER_API = ROOT / "tests" / "programs" / "driver_api.cu"
VECTOR_ADD = ROOT / "examples" / "vector_add.cu"
CUDA_ERROR_NO_BINARY_FOR_GPU = 209

def kernels(build: Build, name: str, *options: str) -> Path:
    """The kernels of driver_api.cu alone, as a module image (--fatbin or --cubin in `options`)."""
    return build(name, [*options, "-DKERNELS_ONLY", "-x", "cu", str(DRIVER_API)])


@pytest.fixture(scope="session")
def driver_api(build: Build, shim: Path) -> Path:
    # host code only, so plain C++: nvcc would otherwise add a cudart fatbin registration
    return build("driver_api", ["-x", "c++", "-cudart", "none", str(DRIVER_API), f"-L{shim.parent}",
                                "-l:libcuda.so.1"])


def test_driver_api_program(run_on, build: Build, driver_api: Path) -> None:
    fatbin = kernels(build, "kernels_sm90.fatbin", "-arch=sm_90", "--fatbin")
    cubin = kernels(build, "kernels_sm90.cubin", "-arch=sm_90", "--cubin")
    proc = run_on([str(driver_api), "all", str(fatbin), str(cubin)])
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    for step in ("saxpy (kernelParams): correct", "fill_index (extra) and cuMemsetD32: correct",
                 "cuMemcpy2D with pitches: correct", "stream and events: correct",
                 "primary context and cuModuleLoad: correct", "driver_api: all correct"):
        assert step in proc.stdout, proc.stdout


def test_vector_add_example(run_on, build: Build) -> None:
    lib_dir = nvcc_lib_dir()
    if lib_dir is None:
        pytest.skip("nvcc's wheel has no lib directory with libcudart_static.a")
    program = build("vector_add", ["-arch=sm_90", f"-L{lib_dir}", str(VECTOR_ADD)])
    proc = run_on([str(program)])
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "vector_add of 1048576 floats: correct (0 wrong)" in proc.stdout, proc.stdout
    assert DEVICE_NAME in proc.stdout


# On a GPU the kernel runs: only the sim has kernels it cannot execute.
@pytest.mark.sim_only(reason="a kernel with no sim host implementation")
def test_kernel_without_host_implementation_fails_naming_it(run_on, build: Build, driver_api: Path,
                                                             server) -> None:
    fatbin = kernels(build, "kernels_sm90.fatbin", "-arch=sm_90", "--fatbin")
    proc = run_on([str(driver_api), "unregistered", str(fatbin)])
    # exit 0: the program saw the launch or the synchronisation after it fail
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "unregistered:" in proc.stdout
    assert "unregistered_kernel" in proc.stderr + server.log()


def test_module_without_code_for_the_servers_gpu(run_on, build: Build, driver_api: Path) -> None:
    sm80 = kernels(build, "kernels_sm80.fatbin", "-gencode", "arch=compute_80,code=sm_80", "--fatbin")
    proc = run_on([str(driver_api), "load", str(sm80)])
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert f"load: {CUDA_ERROR_NO_BINARY_FOR_GPU}" in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if "no code for the server's GPU" in line]
    assert lines, proc.stderr
    assert "sm_90" in lines[0] and "sm_80" in lines[0], lines[0]
