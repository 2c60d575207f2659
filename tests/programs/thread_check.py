"""Threads calling the driver the ways that deadlock a client sharing the application's GIL.

    thread_check.py CASE [ROUNDS]

Cases (each prints `ok <what>` per passed round group, `FAIL <what>: <why>`, and `ALL OK` at the end):
- streams_events: 8 threads at once create a stream and an event, record, synchronize, destroy;
- spin: a thread makes synchronous round trips while the main thread spins in pure Python;
- mutex: a native thread holds a C mutex while it calls the driver, while the main thread, holding
  the GIL, blocks on that mutex without releasing it (a small cffi extension does both, as PyTorch's
  C++ does with its own locks);
- torch_streams: processes forked from one that imported torch, each with 8 threads making their
  first torch.cuda.Stream() and Event at once (the stream pools' one-time set-up);
- dataloader: DataLoader with pin_memory and 4 workers, its batches copied to the GPU;
- autograd: an MLP's backward passes (autograd's device thread calls the driver).
Each round of the driver cases uses fresh objects, so ROUNDS repeats the race ROUNDS times.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
import threading
import time
from ctypes import byref, c_size_t, c_uint64, c_void_p
from pathlib import Path

FAILURES: list[str] = []


def check(cond: bool, what: str, why: str = "") -> None:
    if cond:
        print(f"ok {what}", flush=True)
    else:
        FAILURES.append(what)
        print(f"FAIL {what}: {why}", flush=True)


# ---- the driver API, through ctypes ---------------------------------------------------------------
cu = ctypes.CDLL("libcuda.so.1")


def call(name: str, *args: object) -> None:
    rc = getattr(cu, name)(*args)
    if rc:
        raise RuntimeError(f"{name} returned {rc}")


def context() -> c_void_p:
    call("cuInit", 0)
    ctx = c_void_p()
    call("cuDevicePrimaryCtxRetain", byref(ctx), 0)
    call("cuCtxSetCurrent", ctx)
    return ctx


def streams_events(rounds: int) -> None:
    ctx = context()
    barrier = threading.Barrier(8)
    errors: list[str] = []

    def work() -> None:
        try:
            call("cuCtxSetCurrent", ctx)
            for _ in range(rounds):
                barrier.wait()
                stream, event = c_void_p(), c_void_p()
                call("cuStreamCreate", byref(stream), 1)  # CU_STREAM_NON_BLOCKING
                call("cuEventCreate", byref(event), 0)
                call("cuEventRecord", event, stream)
                call("cuStreamSynchronize", stream)
                call("cuEventSynchronize", event)
                call("cuEventDestroy_v2", event)
                call("cuStreamDestroy_v2", stream)
        except Exception as exc:
            errors.append(repr(exc))
            barrier.abort()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, f"8 threads x {rounds} rounds of streams and events", "; ".join(errors[:3]))


def round_trip(ptr: c_uint64, value: int) -> int:
    data = c_uint64(value)
    back = c_uint64()
    call("cuMemcpyHtoD_v2", ptr, byref(data), c_size_t(8))
    call("cuMemcpyDtoH_v2", byref(back), ptr, c_size_t(8))
    return back.value


def spin(rounds: int) -> None:
    context()
    ptr = c_uint64()
    call("cuMemAlloc_v2", byref(ptr), c_size_t(8))
    done, wrong = threading.Event(), []

    def work() -> None:
        try:
            for i in range(rounds):
                if round_trip(ptr, i * 7919) != i * 7919:
                    wrong.append(i)
        except Exception as exc:
            wrong.append(repr(exc))
        done.set()

    threading.Thread(target=work).start()
    spins = 0
    while not done.is_set():  # pure Python: gives the GIL up only at the switch interval
        spins += 1
    check(not wrong, f"{rounds} round trips from a thread while the main thread spins", repr(wrong[:3]))


MUTEX_C = r"""
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

typedef int (*alloc_fn)(uint64_t *, size_t);
typedef int (*free_fn)(uint64_t);
typedef int (*set_ctx_fn)(void *);
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int holding, result;
static alloc_fn alloc;
static free_fn release;
static set_ctx_fn set_ctx;
static void *ctx;

/* A native thread (no Python): takes the lock, then calls the driver while holding it. */
static void *native(void *arg) {
    (void)arg;
    pthread_mutex_lock(&lock);
    holding = 1;
    usleep(2000);                 /* the main thread is blocked on the lock by now, holding the GIL */
    uint64_t ptr = 0;
    result = set_ctx(ctx);
    if (!result) result = alloc(&ptr, 256);
    if (!result) result = release(ptr);
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* One round: returns the driver's answer to the native thread's calls. */
int one_round(void **driver, void *context) {
    pthread_t t;
    alloc = (alloc_fn)driver[0];
    release = (free_fn)driver[1];
    set_ctx = (set_ctx_fn)driver[2];
    ctx = context;
    holding = 0;
    result = -1;
    pthread_create(&t, NULL, native, NULL);
    while (!holding) usleep(50);
    PyGILState_STATE gil = PyGILState_Ensure();   /* hold the GIL, as C++ called from Python does */
    pthread_mutex_lock(&lock);                    /* ... and wait for the lock without releasing it */
    pthread_mutex_unlock(&lock);
    PyGILState_Release(gil);
    pthread_join(t, NULL);
    return result;
}
"""


def mutex_extension() -> object:
    import cffi

    ffi = cffi.FFI()
    ffi.cdef("int one_round(void **driver, void *context);")
    ffi.set_source("_thread_check_mutex", MUTEX_C, extra_link_args=["-lpthread"])
    build = Path(tempfile.mkdtemp(prefix="thread-check-"))
    ffi.compile(tmpdir=str(build), verbose=False)
    sys.path.insert(0, str(build))
    import _thread_check_mutex

    return _thread_check_mutex


def mutex(rounds: int) -> None:
    ext = mutex_extension()
    ctx = ext.ffi.cast("void *", context().value)
    driver = ext.ffi.new("void *[3]", [ext.ffi.cast("void *", ctypes.cast(f, c_void_p).value)
                                       for f in (cu.cuMemAlloc_v2, cu.cuMemFree_v2, cu.cuCtxSetCurrent)])
    answers = [ext.lib.one_round(driver, ctx) for _ in range(rounds)]
    bad = [a for a in answers if a != 0]
    check(not bad, f"{rounds} rounds of a native thread calling the driver under a lock the GIL holder waits for",
          f"answers {bad[:5]}")


# ---- PyTorch -------------------------------------------------------------------------------------
def torch_streams(rounds: int) -> None:
    import torch  # imported before forking, so that each child only initialises CUDA

    def child() -> None:
        barrier = threading.Barrier(8)
        errors = []

        def first_stream() -> None:
            try:
                barrier.wait()
                s, e = torch.cuda.Stream(), torch.cuda.Event()
                e.record(s)
                e.synchronize()
            except Exception as exc:
                errors.append(repr(exc))

        threads = [threading.Thread(target=first_stream) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        os._exit(1 if errors else 0)

    codes: list[int] = []
    running: list[int] = []
    for _ in range(rounds):
        if len(running) == 4:  # a few at a time: the machine may have two cores
            codes.append(os.waitstatus_to_exitcode(os.waitpid(running.pop(0), 0)[1]))
        pid = os.fork()
        if pid == 0:
            child()
        running.append(pid)
    codes += [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in running]
    check(codes == [0] * rounds, f"{rounds} processes with 8 threads making their first stream at once",
          f"exit codes {sorted(set(codes))}")


def dataloader(rounds: int) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    data = torch.arange(rounds * 64, dtype=torch.float32).reshape(rounds, 64)
    loader = DataLoader(TensorDataset(data), batch_size=1, num_workers=4, pin_memory=True)
    seen = [batch.cuda(non_blocking=True) for (batch,) in loader]
    torch.cuda.synchronize()
    back = torch.cat([b.cpu() for b in seen])
    check(torch.equal(back, data), f"DataLoader with pin_memory and 4 workers, {rounds} batches")


def autograd(rounds: int) -> None:
    import torch

    # autograd's device thread runs the backward's CUDA work: elementwise kernels and, for the Linear
    # layers, cuBLAS GEMMs (forwarded at cuBLAS's API, computed by the sim)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).cuda()
    x = torch.randn(16, 64, device="cuda")
    for _ in range(rounds):
        net.zero_grad(set_to_none=True)
        net(x).sum().backward()
    torch.cuda.synchronize()
    grads = [p.grad for p in net.parameters()]
    check(all(g is not None and g.is_cuda for g in grads), f"{rounds} backward passes of a 2-layer MLP")


CASES = {f.__name__: f for f in (streams_events, spin, mutex, torch_streams, dataloader, autograd)}

if __name__ == "__main__":
    name, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200
    start = time.monotonic()
    try:
        CASES[name](rounds)
    except Exception as exc:
        check(False, name, repr(exc))
    print(f"{name}: {time.monotonic() - start:.1f} s", flush=True)
    if FAILURES:
        print(f"{len(FAILURES)} FAILED")
        os._exit(1)
    print("ALL OK", flush=True)
    os._exit(0)
