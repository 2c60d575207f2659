"""The record ABI: what the shim's C, the client's and the worker's Python and the worker's C share.

Layouts, enums and limits are declared once, here. `python -m xpuremote.protocol.generate` writes them out
as `protocol/abi.h` (C: `#define`s, enums, structs with their sizes and offsets asserted at compile time) and
`protocol/abi.py` (Python: the same constants, each record's `struct.Struct` and offsets, the cffi
declarations of the records the core reads), together with the op numbers of the generated entry points.
Neither side types any of it again: change a row here, regenerate, and both follow
(`tests/test_abi.py` shows it).

A C name is `XPU_` and the Python name: `LANE_BYTES` is `XPU_LANE_BYTES`; an enum's member `KEPT`,
`CREATE` is `KEPT_CREATE` in Python and `XPU_KEPT_CREATE` in C; a record `lane_record` is
`struct xpu_lane_record` in C and `LANE_RECORD` (a `struct.Struct`, where its fields are flat) in Python.
"""

from __future__ import annotations

from . import mathlibs

# name -> (value, why)
LIMITS: dict[str, tuple[int, str]] = {
    "LANE_BYTES": (256 << 10, "the fast lane's buffer (interpose/lane.h): full, it declines and the core sends it. "
                   "Room for about ten of PyTorch's foreach launches, whose argument bytes are about 25 KiB each"),
    "LANE_BLOB_MAX": (32764, "kernel argument bytes a launch record may carry: the driver's bound"),
    "LANE_ARGS_MAX": (32, "arguments of a lane record: cudnnBatchNormalizationBackwardEx's 30, "
                      "cublasGemmStridedBatchedEx's 23, xpuLaunchKernel's 12; a bit each in `scalars`"),
    "LANE_NO_BLOB": (0xFFFF, "a lane record's blob_at when none of its arguments is a blob"),
    "LANE_STREAM_NOTED": (64, "added to xpu_lane_allow's stream argument where only a trace's stamps read it (an "
                          "op that is not per-thread); above any argument's index"),
    "LANE_KNOWN_HANDLES": (1024, "handles the core let take the lane (a power of two): graph instantiations"),
    "KEPT_INTS": (18, "a kept tensor's longest setting: an Nd one of KEPT_DIMS dimensions (type, count, dims, "
                  "strides)"),
    "KEPT_DIMS": (8, "CUDNN_DIM_MAX"),
    "KEPT_MADE": (4, "a cuBLASLt create's integer arguments: a layout's type, rows, columns, ld"),
    "KEPT_ATTRIBUTES": (12, "a kept cuBLASLt descriptor's attributes, each of at most KEPT_VALUE bytes"),
    "KEPT_VALUE": (16, "bytes of one kept attribute"),
    "KEPT_PACK_ELEMENTS": (16, "a kept variant pack's elements of each attribute"),
    "KEPT_PACK_ATTRIBUTES": (3, "a variant pack's attributes an execution takes: unique ids, data pointers, "
                             "workspace"),
    "KEPT_HANDLES": (1024, "(library, op, handle) entries of the calls kept.h queues for a handle the core let take "
                     "the lane (cuFFT's plans, cuRAND's generators; a power of two); at half, it starts over"),
    "KEPT_ANSWERS": (256, "answers kept in C (cuBLASLt's heuristics, cuDNN's sizes; a power of two); full, it "
                     "starts over"),
    "KEPT_HEURISTIC_RESULTS": (8, "results a heuristic question kept in C may ask for"),
    "KEPT_LT_POINTERS": (16, "cuBLASLt matmul attributes that hold a device pointer, told by the core"),
    "KEPT_SCALAR_ADDRESSES": (256, "host addresses of variant packs' by-value scalars the core told C (a power of "
                              "two); at half, it starts over"),
    "NATIVE_FAILURES": (64, "failed records one run of server/native_lane.c reports before it hands back"),
    "NATIVE_VETTED": (4096, "records server/native_lane.c keeps as run by Python (a power of two); at half, it "
                      "starts over"),
    "NATIVE_FLOATS": (8, "float and double arguments a VETTED call passes in floating registers (x86-64's and "
                      "AArch64's eight: none goes on the stack, so the integers keep their places)"),
    "OP_LIBRARY": (1 << 20, "the core's op numbers of the math libraries start here"),
    "OP_LIBRARY_SHIFT": (16, "a math library's op numbers: OP_LIBRARY + (library << OP_LIBRARY_SHIFT) + op"),
}

# name -> (why, members); members are numbered from 0 in order
ENUMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "LANE_OPEN": ("the lane's state as the core sets it (lane.h's xpu_lane_set_open): closed, open, or open with "
                  "each record's stamp (lane_stamp) kept and taken with the records, for a trace",
                  ("CLOSED", "OPEN", "TRACED")),
    "LANE": ("how the fast lane takes an op (calls.LANE): not at all, its arguments as they are, packed as "
             "xpuLaunchKernel with the kernel's argument bytes, or as they are where the core let its first "
             "argument take the lane (a graph instantiation without host copies)",
             ("OFF", "PLAIN", "LAUNCH", "KNOWN")),
    "KEPT": ("what an op marked for interpose/kept.h is: a create, a setter or a destroy of one kind of "
             "descriptor (a pack's finalize too), a library handle's setter or getter, cuBLAS's stream and "
             "workspace setters and stream getter, cuBLASLt's heuristic (answered again from the core's first "
             "answer for the same descriptors), a cuBLAS call queued in the lane (a GEMM with its scalars' "
             "bytes), or a cuBLASLt one (cublasLtMatmul: its descriptors named by the server's descriptors for their "
             "settings), or a call whose answer is a constant the core told C (a library's version), or "
             "cudnnBackendExecute of a kept pack (queued as xpuCudnnExecute once the core has told C which of its "
             "data pointers are by-value scalars), or a cuDNN call queued in the lane (a batch norm: its tensor "
             "descriptors named by the server's descriptors for their settings), or a size question of a "
             "cuDNN handle, integers and tensor descriptors (a batch norm's workspace: answered again from the "
             "core's first answer for the same settings), or a call of a handle the core let take the lane for that "
             "op (a cuFFT transform, a cuRAND generation: its arguments as they are, a count argument a multiple of "
             "what the core said). A tensor record's setter is one of the three SET_",
             ("NONE", "CREATE", "SET_ND", "SET_4D", "SET_4D_EX", "DESTROY", "LT_CREATE", "LT_SET", "LT_DESTROY",
              "PACK_CREATE", "PACK_SET", "PACK_FINALIZE", "PACK_DESTROY", "SETTING", "GETTING", "BLAS_STREAM",
              "BLAS_WORKSPACE", "BLAS_GET_STREAM", "HEURISTIC", "BLAS_CALL", "LT_CALL", "CONSTANT",
              "PACK_EXECUTE", "DNN_CALL", "SIZE", "HANDLE_CALL")),
    "EXECUTE_ARG": ("xpuCudnnExecute's arguments in the call table's order (the session checks that they are), as "
                    "server/native_lane.c reads its record", ("HANDLE", "PLAN", "COUNT", "WORKSPACE", "PACK")),
    "EXECUTE_PART": ("xpuCudnnExecute's `pack` of `count` elements: the data pointers, their unique ids and the "
                     "by-value scalars' bytes, 8 bytes an element each, in this order from 8 * count * part; then "
                     "BY_VALUE, a byte an element, 1 where that pointer is a by-value scalar's",
                     ("POINTERS", "UNIQUE_IDS", "SCALARS", "BY_VALUE")),
    "PACK_ATTRIBUTE": ("a kept variant pack's attributes, in their order in its record (kept_pack)",
                       ("UNIQUE_IDS", "DATA_POINTERS", "WORKSPACE")),
    "KEPT_KIND": ("the kind of a kept descriptor's record",
                  ("TENSOR", "LT_MATMUL", "LT_LAYOUT", "LT_PREFERENCE", "PACK")),
    "ASK": ("the context questions interpose/answers.h answers in C",
            ("NONE", "CURRENT", "DEVICE", "DEVICE_OF", "PRIMARY_STATE", "STREAM_CAPTURING")),
    "OP": ("the core's own ops, numbered after the driver's symbols (the export tables' requests, exit); the "
           "NVML functions follow from OP_NVML", ("PRIMARY_CTX", "INTEGRITY", "UNKNOWN_SLOT", "EXIT",
                                                   "UNKNOWN_TABLE", "CONTEXT_KIND", "NVML")),
    "NATIVE_ARG": ("a lane record argument's kind, for server/native_lane.c: a number, a handle, the blob's bytes, "
                   "a host scalar's bytes in its slot (passed by their address), a float or a double by value (its "
                   "bits in the slot, passed in a floating register)",
                   ("INT", "HANDLE", "BLOB", "SCALAR", "FLOAT", "DOUBLE")),
    "NATIVE_CALL": ("how server/native_lane.c calls an op's function: its arguments as they are (integers and "
                    "handles, up to 8), as cuLaunchKernel takes xpuLaunchKernel's, or (a math library's call, up to "
                    "LANE_ARGS_MAX, NATIVE_FLOATS of them floats) only where the session's Python ran a record of the "
                    "same values before; or xpuCudnnExecute's record, also vetted so, as cudnnBackendExecute of a "
                    "variant pack made once for the record's values (its functions and constants: NATIVE_CUDNN)",
                    ("PLAIN", "LAUNCH", "VETTED", "EXECUTE")),
    "NATIVE_CUDNN": ("what server/native_lane.c is given of cuDNN for an EXECUTE op, in this order: the functions "
                     "that make, set, finalize and destroy a variant pack, then the constants they take (the pack's "
                     "descriptor type, its attributes' names, their element types); COUNT of them",
                     ("CREATE", "SET", "FINALIZE", "DESTROY", "VARIANT_PACK", "DATA_POINTERS", "UNIQUE_IDS",
                      "WORKSPACE", "VOID_PTR", "INT64", "COUNT")),
}

# Field types: u8..u64, i32, i64, or another record's name. A count is a number or a limit's name, or a
# tuple of them, multiplied.
Field = tuple[str, str] | tuple[str, str, int | str | tuple[int | str, ...]]

# name -> (why, fields), in C's declaration order (a record names only those before it)
RECORDS: dict[str, tuple[str, tuple[Field, ...]]] = {
    "lane_record": ("a fast-lane record's head, little-endian; `nargs` u64 arguments follow, then the blob that "
                    "replaces argument `blob_at` (LANE_NO_BLOB: none), padded to 8 bytes. An argument whose bit is set "
                    "in `scalars` holds a host scalar's first `scalar_size` bytes (a GEMM's alpha and beta)",
                    (("opcode", "u32"), ("nargs", "u8"), ("scalar_size", "u8"), ("blob_at", "u16"),
                     ("blob_len", "u32"), ("scalars", "u32"), ("ctx", "u64"))),
    "lane_stamp": ("what the lane keeps of each record while a trace is recorded (never sent): when it was queued "
                   "(CLOCK_MONOTONIC ns), its stream argument (0: none), its opcode, the lane's time on it (ns, from "
                   "the lane's first look at the call to the record's append), and the shim's op number of the "
                   "application's call (-1: a record kept.h made, named by its opcode)",
                   (("queued", "u64"), ("stream", "u64"), ("opcode", "u32"), ("took", "u32"), ("op", "i32"))),
    "kept_attribute": ("one attribute of a kept cuBLASLt descriptor: its name and last bytes",
                       (("name", "u32"), ("size", "u32"), ("value", "u8", "KEPT_VALUE"))),
    "kept_pack": ("a kept variant pack: its attributes in PACK_ATTRIBUTE's order; `set` has a bit per attribute "
                  "set; attribute a's elements from a * KEPT_PACK_ELEMENTS",
                  (("finalized", "i32"), ("set", "i32"), ("count", "i64", "KEPT_PACK_ATTRIBUTES"),
                   ("value", "u64", ("KEPT_PACK_ATTRIBUTES", "KEPT_PACK_ELEMENTS")))),
    "kept_record": ("a descriptor kept in C (interpose/kept.h), as the core reads it. `generation` is unique to "
                    "each create and set; a tensor's setting in `ints` (Nd: type, count, dims at 2, strides at "
                    "2 + KEPT_DIMS); a cuBLASLt create's arguments in `made`",
                    (("state", "i32"), ("kind", "i32"), ("setter", "i32"), ("attributes", "i32"),
                     ("generation", "i64"), ("ints", "i32", "KEPT_INTS"), ("made", "u64", "KEPT_MADE"),
                     ("attribute", "kept_attribute", "KEPT_ATTRIBUTES"), ("pack", "kept_pack"))),
    "blas_pair": ("a cuBLAS handle's stream and workspace as kept.h holds them, its pointer mode, and the stream "
                  "and workspace the server's handle has (sent_*); the core reads and writes them where they lie. "
                  "own: 1 while the workspace is cuBLAS's own (cublasSetStream puts it back)",
                  (("stream", "u64"), ("workspace", "u64"), ("bytes", "u64"), ("own", "u64"),
                   ("pointer_mode", "u64"), ("sent_stream", "u64"), ("sent_workspace", "u64"),
                   ("sent_bytes", "u64"), ("sent_own", "u64"))),
}

# name -> (why, {code: value}): lookup tables C needs of what Python knows
TABLES: dict[str, tuple[str, dict[int, int]]] = {
    "SCALAR_BYTES": ("bytes of a host scalar (alpha, beta) of a cudaDataType_t or cublasComputeType_t",
                     {mathlibs.api(mathlibs.CUBLAS).ENUMS[name]: size for name, size in mathlibs.SCALAR_BYTES.items()}),
    "DNN_SCALAR_BYTES": ("bytes of a cuDNN host scalar (alpha, beta) by its tensor's cudnnDataType_t where they are "
                         "not 4: double data's are doubles",
                         {mathlibs.api(mathlibs.CUDNN).ENUMS["CUDNN_DATA_DOUBLE"]: 8}),
}
