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
from conftest import ROOT, Build, Server, lane_runs, start_server
from test_native_lane import in_c_and_in_python
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


LANE_PROGRAM = r"""
import ctypes, json
import numpy as np
from xpuremote.protocol.curand_api import ENUMS as E

cu, rand = ctypes.CDLL("libcuda.so.1"), ctypes.CDLL("libcurand.so.10")
context, N, ROUNDS = ctypes.c_void_p(), 64, 3
assert cu.cuInit(0) == 0 and cu.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
assert cu.cuCtxSetCurrent(context) == 0
address = ctypes.c_uint64()
assert cu.cuMemAlloc_v2(ctypes.byref(address), 8 * N * ROUNDS) == 0
out, f, d = ctypes.c_uint64(address.value), ctypes.c_float, ctypes.c_double


def read(dtype):
    values = np.empty(N * ROUNDS, dtype)
    assert cu.cuMemcpyDtoH_v2(values.ctypes.data_as(ctypes.c_void_p), out, values.nbytes) == 0
    return values.tolist()


def generator(kind):
    gen = ctypes.c_void_p()
    assert rand.curandCreateGenerator(ctypes.byref(gen), E[kind]) == 0
    return gen


gen, results, statuses = generator("CURAND_RNG_PSEUDO_PHILOX4_32_10"), {}, {}
assert rand.curandSetPseudoRandomGeneratorSeed(gen, ctypes.c_ulonglong(1234)) == 0
for name, args, dtype in (("Uniform", (), "<f4"), ("UniformDouble", (), "<f8"), ("", (), "<u4"),
                          ("Normal", (f(1.0), f(2.0)), "<f4"), ("NormalDouble", (d(1.0), d(2.0)), "<f8"),
                          ("LogNormal", (f(0.0), f(0.5)), "<f4"), ("LogNormalDouble", (d(0.0), d(0.5)), "<f8")):
    size = np.dtype(dtype).itemsize
    for i in range(ROUNDS):  # the first through the client, the others queued in C
        status = getattr(rand, "curandGenerate" + name)(gen, ctypes.c_uint64(out.value + i * N * size),
                                                       ctypes.c_size_t(N), *args)
        assert status == 0, (name, status)
    assert cu.cuCtxSynchronize() == 0
    results[name] = read(dtype)
# what cuRAND refuses at the call, refused at the call still: an odd count of normals after even ones went in C
statuses["odd_normals"] = rand.curandGenerateNormal(gen, out, ctypes.c_size_t(N - 1), f(0.0), f(1.0))
statuses["long_long_of_pseudo"] = rand.curandGenerateLongLong(gen, out, ctypes.c_size_t(N))
quasi = generator("CURAND_RNG_QUASI_SOBOL32")  # its numbers the GPU's (the sim has no Sobol): its counts' checks
assert rand.curandSetQuasiRandomGeneratorDimensions(quasi, 4) == 0
statuses["quasi"] = [rand.curandGenerateUniform(quasi, out, ctypes.c_size_t(n)) for n in (N, N, N - 2)]
assert rand.curandSetQuasiRandomGeneratorDimensions(quasi, 3) == 0  # N is no multiple of 3: refused at the call
statuses["quasi_redimensioned"] = [rand.curandGenerateUniform(quasi, out, ctypes.c_size_t(n)) for n in (N, N - 1)]
statuses["quasi_sync"] = cu.cuCtxSynchronize()
assert rand.curandDestroyGenerator(gen) == 0
statuses["destroyed"] = rand.curandGenerateUniform(gen, out, ctypes.c_size_t(N))
statuses["sync"] = cu.cuCtxSynchronize()
print(json.dumps({"results": results, "statuses": statuses}))
"""


@pytest.mark.sim_only(reason="counts the sim's library calls per session; the client's side is the same on any "
                      "backend")
def test_a_generators_generations_are_queued_in_c_after_the_first(shim: Path, tmp_path: Path) -> None:
    """Each kind of generation three times on a Philox generator: the first through the client, whose checks pass,
    which then lets C queue that generator's next ones of the kind in the fast lane (interpose/kept.h's HANDLE_CALL)
    for counts its checks would pass. With the lane and without, the same numbers (Philox is counter-based: a
    generation continues the sequence) and statuses, and the same calls reach the server; with it the client sees
    one generation of each kind. What cuRAND refuses at the call is refused at the call with the lane too: an odd
    count of normals, 64-bit values of a 32-bit generator, a count that is no multiple of a quasirandom generator's
    dimensions (after they changed, too: C forgets what it was let), a destroyed generator."""
    from xpuremote.protocol.curand_api import ENUMS

    lanes = lane_runs(LANE_PROGRAM, tmp_path, shim, "curand")
    out, runs = lanes.out, lanes.runs
    uniform = np.array(out["results"]["Uniform"])
    assert ((uniform > 0) & (uniform <= 1)).all() and len(set(uniform.tolist())) == len(uniform)
    statuses = out["statuses"]
    length, type_error = ENUMS["CURAND_STATUS_LENGTH_NOT_MULTIPLE"], ENUMS["CURAND_STATUS_TYPE_ERROR"]
    assert statuses["odd_normals"] == length and statuses["long_long_of_pseudo"] == type_error, statuses
    assert statuses["quasi"] == [0, 0, length] and statuses["quasi_redimensioned"] == [length, 0], statuses
    assert statuses["destroyed"] == ENUMS["CURAND_STATUS_NOT_INITIALIZED"], statuses
    in_c, by_core = runs["1"][1], runs["0"][1]
    for name in out["results"]:
        symbol = f"curandGenerate{name}"
        extra = {"Normal": 1, "Uniform": 3 + 2 + 1}.get(name, 0)  # the refused ones, and the quasi generator's
        assert by_core[symbol][0] == 3 + extra, (symbol, by_core)
        assert in_c[symbol][0] == 1 + extra - (name == "Uniform"), (symbol, in_c)  # the quasi's second: in C
    served = lanes.served
    assert len(served) == 2 and served[0] == served[1], served


# cuRAND's generations as the shim's C queues them (kept.h's HANDLE_CALL: the generator and the arguments as they
# are, a float's bits in its slot), run by a cuda-backend session whose cuRAND is the stand-in (xpuremote's own
# replacement library, named as such) on the sim, or NVIDIA's
NATIVE_SCENARIO = r"""
import numpy as np
from xpuremote.protocol.curand_api import ENUMS

GEN, N = 0x7C00_0000_6000, 64


def record(symbol, *args):
    call = CALLS[symbol]
    head = abi.pack_lane_record(opcode=call.opcode, nargs=len(args), blob_at=abi.LANE_NO_BLOB, ctx=CTX)
    return head + struct.pack(f"<{len(args)}Q", *args)


def bits(value):
    return struct.unpack("<I", struct.pack("<f", value))[0]


batch(("cuCtxCreate_v2", [CTX, 0, 0]), ("curandCreateGenerator", [GEN, ENUMS["CURAND_RNG_PSEUDO_PHILOX4_32_10"]]))
batch(("curandSetPseudoRandomGeneratorSeed", [GEN, 1234]))
out = int.from_bytes(batch(("cuMemAlloc_v2", [8, 4 * N]))[0], "little")
failures = lane(*[record("curandGenerateUniform", GEN, out, N) for _ in range(4)])
failures += lane(*[record("curandGenerateNormal", GEN, out, N, bits(1.0), bits(2.0)) for _ in range(3)])
ran = [in_c()]
normals = np.frombuffer(batch(("cuMemcpyDtoH_v2", [4 * N, out, 4 * N]))[0], np.float32)
failures += lane(record("curandGenerateUniform", GEN + 16, out, N))  # a generator the session does not have
batch(("curandDestroyGenerator", [GEN]))
failures += lane(record("curandGenerateUniform", GEN, out, N))
ran.append(in_c())
print(json.dumps({"ran": ran, "failures": failures, "normals": normals.tolist()}))
"""


def test_a_generators_generations_run_in_c_where_python_ran_the_same_values(driver_env: dict[str, str],
                                                                            shim: Path) -> None:
    """A generation record runs in the worker's C (server/native_lane.c, VETTED) once the session's Python ran one of
    the same values (a normal's mean and deviation by value in floating registers): the same numbers (the sequence
    goes on from call to call) and failures in C and in Python; a foreign generator and a destroyed one go to Python,
    refused as before."""
    env = {**driver_env, "XPU_CURAND_LIBRARY": str(shim.parent / "libcurand.so.10")} if driver_env else driver_env
    results = dict(zip("10", in_c_and_in_python(NATIVE_SCENARIO, env), strict=True))
    assert results["1"].pop("ran") == [5, 5] and results["0"].pop("ran") == [0, 0], results
    assert results["1"] == results["0"]
    assert [name for name, _ in results["1"]["failures"]] == ["curandGenerateUniform"] * 2, results
    normals = np.array(results["1"]["normals"])
    assert len(set(normals.tolist())) == len(normals) and abs(normals.mean() - 1.0) < 1.5, normals
