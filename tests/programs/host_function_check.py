"""Host functions on streams, through the shim (run under xpu-run's environment).

Prints one line per check and `ALL OK` at the end; exits 1 on the first failure."""

import ctypes
import sys
import threading
import time

cu = ctypes.CDLL("libcuda.so.1")
HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        sys.exit(1)


check(cu.cuInit(0) == 0, "cuInit")
dev, ctx, stream = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
cu.cuDeviceGet(ctypes.byref(dev), 0)
cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
cu.cuCtxSetCurrent(ctx)
check(cu.cuStreamCreate(ctypes.byref(stream), 0) == 0, "cuStreamCreate")

# 1. the call does not wait for the function: it blocks until we set the event after the call
released, ran = threading.Event(), []


@HOSTFN
def blocking(_data):
    ran.append(released.wait(10))


check(cu.cuLaunchHostFunc(stream, blocking, None) == 0, "cuLaunchHostFunc returns")
check(not ran, "the function has not run by the time the call returned")
released.set()
check(cu.cuStreamSynchronize(stream) == 0, "cuStreamSynchronize")
check(ran == [True], "the function ran, after the call returned, before the stream sync returned")

# 2. the function runs even if the application makes no further CUDA call
flag = threading.Event()


@HOSTFN
def signal(_data):
    flag.set()


check(cu.cuLaunchHostFunc(stream, signal, None) == 0, "cuLaunchHostFunc (no later call)")
check(flag.wait(5), "the function ran with no further CUDA call from the application")

# 3. work queued after the function waits for it: a memset behind a slow function
order = []


@HOSTFN
def slow(_data):
    time.sleep(0.3)
    order.append("function")


ptr, back = ctypes.c_uint64(), ctypes.c_uint8()
cu.cuMemAlloc_v2(ctypes.byref(ptr), 16)
cu.cuLaunchHostFunc(stream, slow, None)
cu.cuMemsetD8Async(ptr, 42, 16, stream)
check(cu.cuMemcpyDtoH_v2(ctypes.byref(back), ptr, 1) == 0 and back.value == 42, "memset after the function")
order.append("copy returned")
check(order == ["function", "copy returned"], f"stream order kept: {order}")

# 4. the user data reaches the function; cuStreamAddCallback gets the stream and a status
seen = []
CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)


@CALLBACK
def callback(s, status, data):
    seen.append((s, status, data))


check(cu.cuStreamAddCallback(stream, callback, ctypes.c_void_p(0x1234), 0) == 0, "cuStreamAddCallback")
cu.cuStreamSynchronize(stream)
check(seen == [(stream.value, 0, 0x1234)], f"callback arguments {seen}")
# 5. a host function may wait for a thread that is making CUDA calls meanwhile
other, waited = ctypes.c_void_p(), []
cu.cuStreamCreate(ctypes.byref(other), 0)
go = threading.Event()


@HOSTFN
def waits_for_main(_data):
    waited.append(go.wait(5))


cu.cuLaunchHostFunc(stream, waits_for_main, None)
time.sleep(0.2)  # the server has reached the function by now
check(cu.cuMemsetD8Async(ptr, 7, 16, other) == 0, "a call on another stream while the function runs")
go.set()
check(cu.cuStreamSynchronize(stream) == 0 and waited == [True], f"no deadlock: {waited}")
print("ALL OK")
