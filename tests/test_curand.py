"""cuRAND's host API through xpuremote: a C program built with nvcc and linked against NVIDIA's libcurand.so.10
(the test extra's nvidia-curand wheel) runs under xpu-run, where the replacement of that SONAME forwards its calls to
the server: generated there by the sim device with numpy (server/backends/sim_rand.py) or (XPU_TEST_BACKEND=cuda)
by NVIDIA's cuRAND on the server's GPU. tests/programs/curand_check.cu checks the numbers itself, deterministically.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, Build, Server, start_server
from test_torch_math import library_calls
from toolchain import nvcc_lib_dir

PROGRAM = ROOT / "tests" / "programs" / "curand_check.cu"


def curand_lib_dir() -> Path | None:
    """The folder of NVIDIA's libcurand.so.10, from the nvidia-curand wheel."""
    import nvidia

    found = [Path(base) / "cu13" / "lib" for base in nvidia.__path__]
    return next((d for d in found if (d / "libcurand.so.10").is_file()), None)


@pytest.fixture(scope="module")
def program(build: Build) -> Path:
    libs, runtime = curand_lib_dir(), nvcc_lib_dir()
    if libs is None or runtime is None:
        pytest.skip("no libcurand.so.10 (pip install nvidia-curand) or no static cudart beside nvcc")
    return build("curand_check", ["-arch=sm_90", f"-L{runtime}", f"-L{libs}", "-l:libcurand.so.10", str(PROGRAM)])


def run(server: Server, program: Path, mode: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "xpuremote.interpose.run", "--server", server.address, "--", str(program), mode]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_generators_seeded_and_their_numbers_copied_back(tmp_path: Path, program: Path) -> None:
    """Uniform, normal, log-normal, Poisson and 32-bit numbers generated into device memory come back the same for
    a seed and an offset and otherwise not, in range, with their moments; an odd count of normals and 64-bit values
    from a pseudorandom generator are refused at the call as cuRAND does; the calls arrive at the server."""
    srv = start_server(tmp_path)
    try:
        proc = run(srv, program, "all")
    finally:
        srv.stop()
    assert proc.returncode == 0 and "curand_check: all correct" in proc.stdout, f"{proc.stdout}\n{proc.stderr}"
    assert "WRONG" not in proc.stdout, proc.stdout
    # eight generators made, each seeded, its offset set, its numbers generated, destroyed; one with six more
    # generations, its stream, ordering and seeds
    assert library_calls(srv).get("curand", 0) >= 8 * 5 + 10, library_calls(srv)
    said = proc.stderr.count("curandCreateGeneratorHost is not supported by xpuremote")
    assert said == 1, proc.stderr[-3000:]
    assert "private table" not in proc.stderr, proc.stderr[-3000:]
    assert not re.search(r"curand\w* failed", srv.log()), srv.log()[-3000:]


@pytest.mark.sim_only(reason="the server's library versions are the sim's claim (XPU_SIM_LIBRARY_VERSIONS)")
def test_a_server_with_an_older_curand_major_is_refused_at_the_generator(tmp_path: Path, program: Path) -> None:
    """A server whose cuRAND is of another major than the header the replacement was generated from refuses the
    first curandCreateGenerator, naming both versions: the program gets CURAND_STATUS_VERSION_MISMATCH."""
    from xpuremote.protocol import curand_api

    major = curand_api.VERSION[0]
    srv = start_server(tmp_path, env={"XPU_SIM_LIBRARY_VERSIONS": f"curand={major - 1}.5.0"})
    try:
        proc = run(srv, program, "create")
    finally:
        srv.stop()
    version_mismatch = curand_api.ENUMS["CURAND_STATUS_VERSION_MISMATCH"]
    assert proc.returncode == 1 and f"create: status {version_mismatch}" in proc.stdout, proc.stdout + proc.stderr
    assert f"cannot serve curand {major}.x" in proc.stderr, proc.stderr[-3000:]
    assert f"the server has {major - 1}.5.0" in proc.stderr, proc.stderr[-3000:]


def test_the_sims_philox_rounds_give_random123s_known_answers() -> None:
    """The sim's bits are Philox4x32-10's (curand_philox4x32_x.h): Random123's known-answer vectors, and a
    generator's offset moves along one sequence."""
    from xpuremote.server.backends.sim_rand import Generator, philox

    def block(counter: tuple[int, ...], key: int) -> list[int]:
        return [int(w[0]) for w in philox([np.array([c], dtype=np.uint64) for c in counter], key)]

    assert block((0, 0, 0, 0), 0) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert block((0xFFFFFFFF,) * 4, 2**64 - 1) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert block((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), 0x299F31D0_A4093822) == \
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]
    whole = Generator(161, seed=7).bits(11)
    later = Generator(161, seed=7, offset=5).bits(6)
    assert (whole[5:] == later).all()


@pytest.mark.sim_only(reason="the cuda backend on stand-in libraries chained to a sim server")
def test_the_same_program_through_the_cuda_backend(shim: Path, tmp_path: Path, program: Path) -> None:
    """The cuda backend calling a libcurand.so.10 of NVIDIA's shape (xpuremote's own, a stand-in named as such,
    chained to a sim server): the generator made by the library, a stream, 64-bit seeds and offsets, float and
    double by-value arguments, device outputs, without a GPU."""
    sim = start_server(tmp_path, backend="sim")
    cuda = start_server(tmp_path, backend="cuda", env={"XPU_CUDA_LIBRARY": str(shim), "XPU_SERVER": sim.address,
                                                       "XPU_CURAND_LIBRARY": str(shim.parent / "libcurand.so.10")})
    try:
        proc = run(cuda, program, "all")
    finally:
        cuda.stop()
        sim.stop()
    assert proc.returncode == 0 and "curand_check: all correct" in proc.stdout, f"{proc.stdout}\n{proc.stderr}"
    assert library_calls(sim).get("curand", 0) >= 8 * 5 + 10, library_calls(sim)  # the stand-in's, forwarded again
