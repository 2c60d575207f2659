"""The worker's CPU per math library call on the cuda backend: what xpuremote's own Python costs the server for
each cuBLAS, cuBLASLt and cuDNN call PyTorch makes, beside the session's cheapest call in the same run.

    python bench/server_calls.py [--backend cuda|stand-in] [--rounds N] [--out bench/results/server-calls.json]

In process: a cuda-backend session (Accounted over CudaBackend, as a worker has it) runs batches of the calls one
PyTorch operation makes, as the client sends them (shapes from a ResNet-18 and a GPT-2 step). NVIDIA's math
libraries are replaced by a stand-in whose functions do nothing (named as such: `NoOpLibrary`; a Create writes a
fresh value through its pointer), so the figure is the session's own work per call: decoding, handles, address
checks, argument conversion, outputs. NVIDIA's own CPU time for the call comes on top of it on a GPU. The
reference row is `cuMemsetD8Async` through a batch, the driver's call of integers and handles, in the same run.
`cuda` uses NVIDIA's libcuda (a GPU); `stand-in` uses xpuremote's own shim chained to a sim server started here.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CTX = 0x7C00_0000_1000
HANDLES = itertools.count(0x7C00_0100_0000, 16)  # the client's handles, as its shadow calls make them


class NoOpLibrary:
    """A stand-in for one of NVIDIA's math libraries: every function returns success and does nothing, except
    that a Create writes a fresh value through its output pointer, as the real one writes its object's."""

    def __init__(self, ffi: Any) -> None:
        self.ffi, self.made = ffi, itertools.count(0x5000_0000, 16)
        self.out_types = (ffi.typeof("uint64_t *"), ffi.typeof("void **"))

    def __getattr__(self, name: str) -> Callable[..., int]:
        ffi, out_types, made = self.ffi, self.out_types, self.made

        def create(*args: Any) -> int:
            out = next(a for a in args if isinstance(a, ffi.CData) and ffi.typeof(a) in out_types)
            ffi.cast("uint64_t *", out)[0] = next(made)
            return 0
        fn = create if "Create" in name else (lambda *args: 0)
        setattr(self, name, fn)
        return fn


def operations(address: int, cudnn: int, blas: int, lt: int, plan: int, enums: dict[str, int]) -> dict[str, Callable]:
    """Each operation's calls as an older client sent them, [symbol, wire arguments], with fresh client handles
    each time; and a convolution as the client sends it now."""
    one, zero = struct.pack("<f", 1.0), struct.pack("<f", 0.0)
    dims, strides = struct.pack("<4i", 1, 64, 56, 56), struct.pack("<4i", 64 * 56 * 56, 56 * 56, 56, 1)

    def batch_norm() -> list[list[Any]]:  # ResNet-18's inference: cuDNN's legacy API, descriptors made each time
        x, y = next(HANDLES), next(HANDLES)
        made = [c for t in (x, y) for c in (["cudnnCreateTensorDescriptor", [t]],
                                            ["cudnnSetTensorNdDescriptor", [t, 0, 4, dims, strides]])]
        return [*made, ["cudnnBatchNormalizationForwardInference",
                        [cudnn, 1, one, zero, x, address, y, address, y, address, address, address, address, 1e-5]],
                ["cudnnDestroyTensorDescriptor", [x]], ["cudnnDestroyTensorDescriptor", [y]]]

    def convolution() -> list[list[Any]]:  # cudnn-frontend's execution: a variant pack made for each
        pack, e = next(HANDLES), enums
        return [["cudnnBackendCreateDescriptor", [e["CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR"], pack]],
                ["cudnnBackendSetAttribute", [pack, e["CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS"],
                                              e["CUDNN_TYPE_VOID_PTR"], 3, struct.pack("<3Q", *[address] * 3)]],
                ["cudnnBackendSetAttribute", [pack, e["CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS"], e["CUDNN_TYPE_INT64"],
                                              3, struct.pack("<3q", 1, 2, 3)]],
                ["cudnnBackendSetAttribute", [pack, e["CUDNN_ATTR_VARIANT_PACK_WORKSPACE"],
                                              e["CUDNN_TYPE_VOID_PTR"], 1, struct.pack("<Q", address)]],
                ["cudnnBackendFinalize", [pack]], ["cudnnBackendExecute", [cudnn, pack, pack]],
                ["cudnnBackendDestroyDescriptor", [pack]]]

    def kept_convolution() -> list[list[Any]]:  # the same, as the client sends it now: one internal call
        from xpuremote.protocol import mathlibs

        pointers, uids = struct.pack("<3Q", *[address] * 3), struct.pack("<3q", 1, 2, 3)
        return [["xpuCudnnExecute", [cudnn, plan, 3, address, mathlibs.execute_pack(pointers, uids, bytes(24),
                                                                                    bytes(3))]]]

    def lt_gemm() -> list[list[Any]]:  # PyTorch's cuBLASLt GEMM: its descriptors made and destroyed each time
        desc, pref, layouts = next(HANDLES), next(HANDLES), [next(HANDLES) for _ in range(3)]
        four = struct.pack("<i", 1)
        return [["cublasLtMatmulDescCreate", [desc, 68, 0]],
                *(["cublasLtMatmulDescSetAttribute", [desc, attribute, four, 4]] for attribute in (3, 4)),  # TRANSA, B
                *(["cublasLtMatrixLayoutCreate", [h, 0, 768, 768, 768]] for h in layouts),
                ["cublasLtMatmulPreferenceCreate", [pref]],
                ["cublasLtMatmulPreferenceSetAttribute", [pref, 1, struct.pack("<Q", 1 << 20), 8]],
                ["cublasLtMatmul", [lt, desc, one, address, layouts[0], address, layouts[1], zero, address, layouts[2],
                                    address, layouts[2], bytes(64), address, 1 << 20, 0]],
                ["cublasLtMatmulPreferenceDestroy", [pref]], ["cublasLtMatmulDescDestroy", [desc]],
                *(["cublasLtMatrixLayoutDestroy", [h]] for h in layouts)]

    def blas_gemm() -> list[list[Any]]:  # cuBLAS's GEMM as PyTorch calls it: the stream and workspace set first
        return [["cublasSetStream_v2", [blas, 0]], ["cublasSetWorkspace_v2", [blas, address, 1 << 20]],
                ["cublasGemmEx", [blas, 0, 0, 768, 768, 768, one, address, 0, 768, address, 0, 768, zero, address, 0,
                                  768, 68, -1]]]

    return {"cuDNN batch norm (legacy descriptors)": batch_norm, "cuDNN convolution (variant pack)": convolution,
            "cuDNN convolution (a kept pack: xpuCudnnExecute)": kept_convolution,
            "cuBLASLt GEMM (descriptors each time)": lt_gemm, "cuBLAS GEMM (stream, workspace, GemmEx)": blas_gemm}


def measure(rounds: int, repeats: int) -> dict[str, Any]:
    """In this process: CPU µs per call of each operation's calls, and of a driver memset."""
    from xpuremote.protocol import mathlibs
    from xpuremote.protocol.calls import CALLS
    from xpuremote.server.backends.cuda import CudaBackend
    from xpuremote.server.limits import Accounted, Limits
    from xpuremote.server.session import Session

    backend = Accounted(CudaBackend(), Limits())
    session = Session(backend)
    session.limits = backend.limits
    for name in ("cudnn", "cublas", "cublasLt"):
        backend.inner.libraries[name] = NoOpLibrary(backend.inner.ffi)

    def wire(calls: list[list[Any]]) -> list[list[Any]]:
        return [[CALLS[symbol].opcode, args] for symbol, args in calls]

    def run(calls: list[list[Any]]) -> list[Any]:
        answer = session.run_batch(wire(calls), True)
        if answer["status"]:
            raise RuntimeError(f"{calls[-1][0]} failed: {answer}")
        return answer["outs"]

    run([["cuCtxCreate_v2", [CTX, 0, 0]]])
    address = int.from_bytes(run([["cuMemAlloc_v2", [8, 1 << 20]]])[0], "little")
    cudnn, blas, lt, plan = next(HANDLES), next(HANDLES), next(HANDLES), next(HANDLES)
    enums = mathlibs.api(mathlibs.CUDNN).ENUMS
    run([["cudnnCreate", [cudnn]], ["cublasCreate_v2", [blas]], ["cublasLtCreate", [lt]],
         ["cudnnBackendCreateDescriptor", [enums["CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR"], plan]]])
    figures: dict[str, Any] = {}
    for name, make in operations(address, cudnn, blas, lt, plan, enums).items():
        run(make())  # compiled, and checked to succeed
        samples = []
        for _ in range(repeats):
            batches = [wire(make()) for _ in range(rounds)]
            began = time.process_time()
            for batch in batches:
                session.run_batch(batch, False)
            samples.append((time.process_time() - began) / sum(map(len, batches)) * 1e6)
        figures[name] = {"calls": len(make()), "us_per_call": statistics.median(samples)}
    memset = wire([["cuMemsetD8Async", [address + 256 * i, i & 0xFF, 256, 0]] for i in range(64)])
    samples = []
    for _ in range(repeats):
        began = time.process_time()
        for _ in range(rounds):
            session.run_batch(memset, False)
        samples.append((time.process_time() - began) / (64 * rounds) * 1e6)
    figures["reference"] = {"calls": 1, "us_per_call": statistics.median(samples)}
    if session.deferred:
        raise RuntimeError(f"calls failed: {session.deferred[:3]}")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["cuda", "stand-in"], default="stand-in")
    parser.add_argument("--rounds", type=int, default=2000, help="operations per sample")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write JSON here and Markdown beside it")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:  # the child, in the environment the parent set
        print(json.dumps(measure(args.rounds, args.repeats)))
        return 0

    from foundation import child_figures, clean_env, publish, run_facts, start_stand_in, stop

    env, sim = clean_env(), None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if args.backend == "stand-in":
                sim, stand_in = start_stand_in(Path(tmp) / "sim.log")
                env |= stand_in
            figures = child_figures([sys.executable, __file__, "--measure", "--rounds", str(args.rounds),
                                     "--repeats", str(args.repeats)], env, "the measuring run")
    finally:
        if sim is not None:
            stop(sim)
    result = {"backend": args.backend, "rounds": args.rounds, "repeats": args.repeats, "figures": figures,
              **run_facts("server_calls.py", argv)}
    publish(args.out, result, markdown(result))
    return 0


def markdown(result: dict[str, Any]) -> str:
    figures = result["figures"]
    reference = figures["reference"]["us_per_call"]
    lines = ["# The worker's CPU per math library call (cuda backend, in process)", "", f"`{result['command']}`", "",
             f"Backend {result['backend']}, Python {result['python']}; medians of {result['repeats']} samples of "
             f"{result['rounds']:,} operations; load average after {[round(x, 2) for x in result['load']]}. "
             "NVIDIA's math libraries replaced by a stand-in that does nothing (NoOpLibrary): the figures are "
             "xpuremote's own work per call.", "",
             "| operation | calls | µs per call | / reference | µs per operation |", "|---|---:|---:|---:|---:|"]
    for name, figure in figures.items():
        if name != "reference":
            lines.append(f"| {name} | {figure['calls']} | {figure['us_per_call']:.2f} | "
                         f"{figure['us_per_call'] / reference:.1f}x | {figure['us_per_call'] * figure['calls']:.1f} |")
    lines.append(f"| reference: cuMemsetD8Async in a batch, the driver's own call included | 1 | {reference:.2f} "
                 f"| 1.0x | {reference:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
