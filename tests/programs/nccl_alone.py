"""Rank 0 of a two-rank NCCL communicator whose rank 1 never comes; first, a call xpuremote refuses.

Usage (under xpu-run): nccl_alone.py. Calls NCCL's C API as a program linked against libnccl.so.2 would: prints
what ncclMemAlloc answered (refused: device memory is the application's CUDA allocator's), makes a unique id,
then ncclCommInitRank(2 ranks, rank 0), which waits on the server for rank 1 until XPU_NCCL_TIMEOUT_S, and prints
its status and ncclGetErrorString's words for it.
"""

import ctypes


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


nccl = ctypes.CDLL("libnccl.so.2")
nccl.ncclGetErrorString.restype = ctypes.c_char_p
pointer = ctypes.c_void_p()
print(f"ncclMemAlloc: {nccl.ncclMemAlloc(ctypes.byref(pointer), ctypes.c_size_t(1 << 20))}", flush=True)
unique = UniqueId()
print(f"ncclGetUniqueId: {nccl.ncclGetUniqueId(ctypes.byref(unique))}", flush=True)
comm = ctypes.c_void_p()
status = nccl.ncclCommInitRank(ctypes.byref(comm), 2, unique, 0)
print(f"ncclCommInitRank: {status} {nccl.ncclGetErrorString(status).decode()}", flush=True)
raise SystemExit(1 if status else 0)
