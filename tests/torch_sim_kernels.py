"""Host implementations (numpy) of the ATen CUDA kernels that tests/programs/torch_check.py and
tests/programs/torch_train_check.py launch: fills, the elementwise ops of a Linear/ReLU/MSE
forward and backward pass, sum and mean reductions, and the foreach ops of the SGD optimizer.

ATen passes its own C++ structs by value as kernel parameters; this module decodes them:

- `vectorized_elementwise_kernel<vec>(int N, functor, std::array<char*, n> data)`: contiguous
  operands, data[0] the output.
- `elementwise_kernel<128, 2>(int N, lambda)` (gpu_kernel_impl_nocast, for strided or broadcast
  operands): the lambda captures an `OffsetCalculator<n>`, then `data`, then the functor.
- `OffsetCalculator<n>`: `int dims; IntDivider<uint32> sizes[25]; uint32 strides[25][n]` (byte
  strides, innermost dimension first; an IntDivider is {divisor, magic, shift}).
- `reduce_kernel<nt, vec>(ReduceOp)`: ops, identity, ReduceConfig, an input and an output
  OffsetCalculator, pointers and flags; see `ReduceLayout`.
- `multi_tensor_apply_kernel(TensorListMetadata<depth>, functor, op, scalar)`: the foreach ops,
  with the 32 KiB parameter layout of CUDA 13 builds; see `TensorLists`.

Functors' captured scalars sit at the start of the functor's bytes, in declaration order. The
layouts were checked by dumping the parameters of launches with known shapes and values.

The sim loads this file without entering it in sys.modules, so no `from __future__ import
annotations` here: dataclasses would look their string annotations up there.
"""

import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from xpuremote.server.backends.sim_kernels import Launch, register

F32 = "<f4"
KernelImpl = Callable[[Launch], None]

# ---------------------------------------------------------------------------------------------- fill

# (mangled scalar type, struct format of the value, numpy dtype); 16-byte vectors, at most 4 elements
FILL_TYPES = [("f", "f", "<f4"), ("d", "d", "<f8"), ("i", "i", "<i4"), ("l", "q", "<i8")]
FILL_KERNEL = "_ZN2at6native29vectorized_elementwise_kernelILi{}ENS0_11FillFunctorI{}EESt5arrayIPcLm1EELb0EEEviT0_T1_"


def fill(value_format: str, dtype: str) -> KernelImpl:
    def run(k: Launch) -> None:
        count, value, out = k.args("i", value_format, "Q")
        k.store(out, np.full(count, value, dtype=dtype))

    return run


for mangled, value_format, dtype in FILL_TYPES:
    register(FILL_KERNEL.format(min(4, 16 // np.dtype(dtype).itemsize), mangled))(fill(value_format, dtype))

# ----------------------------------------------------------------------------------- strided memory

MAX_DIMS = 25  # OffsetCalculator's fixed capacity


def align(offset: int, alignment: int) -> int:
    return -(-offset // alignment) * alignment


@dataclass
class OffsetCalculator:
    """ATen's OffsetCalculator<nargs>: linear index -> byte offset of each operand."""

    nargs: int
    sizes: list[int]
    strides: list[tuple[int, ...]]  # per dimension, one byte stride per operand

    @staticmethod
    def nbytes(nargs: int) -> int:
        return 4 + 12 * MAX_DIMS + 4 * MAX_DIMS * nargs

    @classmethod
    def decode(cls, buf: bytes, at: int, nargs: int) -> "OffsetCalculator":
        dims = struct.unpack_from("<i", buf, at)[0]
        sizes = [struct.unpack_from("<I", buf, at + 4 + 12 * d)[0] for d in range(dims)]
        strides_at = at + 4 + 12 * MAX_DIMS
        strides = [struct.unpack_from(f"<{nargs}I", buf, strides_at + 4 * nargs * d) for d in range(dims)]
        return cls(nargs, sizes, strides)

    def offsets(self, count: int) -> np.ndarray:
        """Byte offsets, shape (nargs, count), of linear indices 0..count-1 (dimension 0 varies fastest)."""
        index = np.arange(count, dtype=np.int64)
        out = np.zeros((self.nargs, count), dtype=np.int64)
        for size, strides in zip(self.sizes, self.strides, strict=True):
            index, within = np.divmod(index, size)
            out += np.outer(strides, within)
        return out


def gather(k: Launch, base: int, offsets: np.ndarray, dtype: str) -> np.ndarray:
    """Elements at byte offsets from `base` (any shape), reading only the span they cover."""
    if offsets.size == 0:
        return np.empty(offsets.shape, dtype=dtype)
    itemsize = np.dtype(dtype).itemsize
    low = int(offsets.min())
    span = k.array(base + low, (int(offsets.max()) - low) // itemsize + 1, dtype)
    return span[(offsets - low) // itemsize]


def scatter(k: Launch, base: int, offsets: np.ndarray, values: np.ndarray) -> None:
    """Write values at byte offsets from `base`, keeping the elements between them."""
    if offsets.size == 0:
        return
    itemsize = values.dtype.itemsize
    low = int(offsets.min())
    span = k.array(base + low, (int(offsets.max()) - low) // itemsize + 1, values.dtype).copy()
    span[(offsets - low) // itemsize] = values
    k.store(base + low, span)


# ------------------------------------------------------------------------------------- elementwise

# An elementwise op: (the functor's bytes, the input operands) -> the output operand.
ElementwiseOp = Callable[[bytes, list[np.ndarray]], np.ndarray]


def mul(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    return x[0] * x[1]


def mul_scalar(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    # AUnaryFunctor / BUnaryFunctor {op, scalar}: the scalar is the other factor either way
    return x[0] * np.float32(struct.unpack_from("<f", functor, 4)[0])


def clamp_scalar(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    # launch_clamp_scalar's lambda captures {ClampLimits minmax, lim0, lim1}; Min=0, Max=1, MinMax=2
    minmax, low, high = struct.unpack_from("<iff", functor)
    v = x[0]
    if minmax == 0:
        out = np.maximum(v, np.float32(low))
    elif minmax == 1:
        out = np.minimum(v, np.float32(low))
    else:
        out = np.minimum(np.maximum(v, np.float32(low)), np.float32(high))
    return np.where(np.isnan(v), v, out)  # NaN propagates


def threshold(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    # threshold_kernel_impl's lambda captures {threshold, value}: x <= threshold ? value : other
    limit, value = struct.unpack_from("<ff", functor)
    return np.where(x[0] <= np.float32(limit), np.float32(value), x[1])


def mse(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    diff = x[0] - x[1]
    return diff * diff


def mse_backward(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    # alpha * (input - target) * grad_output, alpha = 2/N for a mean reduction
    alpha = np.float32(struct.unpack_from("<f", functor)[0])
    return alpha * (x[0] - x[1]) * x[2]


def copy(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    return x[0]


def vectorized(op: ElementwiseOp, dtype: str = F32) -> KernelImpl:
    """vectorized_elementwise_kernel(int N, functor, array<char*, n> data): all operands contiguous."""

    def run(k: Launch) -> None:
        count_param, functor_param, data_param = k.kernel.params
        count = struct.unpack_from("<i", k.params, count_param.offset)[0]
        functor = k.params[functor_param.offset : functor_param.offset + functor_param.size]
        out, *inputs = struct.unpack_from(f"<{data_param.size // 8}Q", k.params, data_param.offset)
        values = op(functor, [k.array(address, count, dtype) for address in inputs])
        k.store(out, np.ascontiguousarray(values, dtype=dtype))

    return run


def strided(op: ElementwiseOp, nargs: int, dtype: str = F32) -> KernelImpl:
    """elementwise_kernel<128, 2>(int N, lambda{OffsetCalculator<nargs>, data[nargs], functor})."""

    def run(k: Launch) -> None:
        count_param, lambda_param = k.kernel.params
        count = struct.unpack_from("<i", k.params, count_param.offset)[0]
        at = lambda_param.offset
        offsets = OffsetCalculator.decode(k.params, at, nargs).offsets(count)
        data_at = at + align(OffsetCalculator.nbytes(nargs), 8)
        data = struct.unpack_from(f"<{nargs}Q", k.params, data_at)
        functor = k.params[data_at + 8 * nargs : lambda_param.offset + lambda_param.size]
        values = op(functor, [gather(k, data[i], offsets[i], dtype) for i in range(1, nargs)])
        scatter(k, data[0], offsets[0], np.asarray(values, dtype=dtype))

    return run


VECTORIZED = "_ZN2at6native29vectorized_elementwise_kernelILi{vec}E{functor}St5arrayIPcLm{n}EELb0EEEviT0_T1_"
STRIDED = "_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastI{functor}EEv{tail}EUliE_EEviT1_"
ITER = "RNS_18TensorIteratorBaseERKT_"  # the lambda's enclosing signature, compressed when the functor names it

MUL_F = "NS0_13BinaryFunctorIfffNS0_15binary_internal10MulFunctorIfEEEE"
# a mangling back-reference inside it (S7_ / S8_) counts the components before it, which differ by kernel
THRESHOLD_F = ("NS0_13BinaryFunctorIfffZNS0_67_GLOBAL__N__d660debc_28_ActivationThresholdKernel_cu_e5d96c45_"
               "4378621threshold_kernel_implIfEEvRNS_18TensorIteratorBaseET_S{}_EUlffE_EE")
MSE_F = "ZZZNS0_15mse_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE_clEvENKUlvE0_clEvEUlffE_"
CLAMP_F = ("ZZZNS0_49_GLOBAL__N__037c6ad9_16_TensorCompare_cu_71e06f4e19launch_clamp_scalarERNS_18TensorIteratorBaseE"
           "N3c106ScalarES6_NS0_6detail11ClampLimitsEENKUlvE_clEvENKUlvE5_clEvEUlfE_")

# (functor, operand count incl. the output, op); float32 vectors of 4, or of 2 for 8-byte aligned operands
VECTORIZED_OPS = [
    (MUL_F, 3, mul),
    ("NS0_13AUnaryFunctorIfffNS0_15binary_internal10MulFunctorIfEEEE", 2, mul_scalar),
    ("NS0_13BUnaryFunctorIfffNS0_15binary_internal10MulFunctorIfEEEE", 2, mul_scalar),
    (CLAMP_F, 2, clamp_scalar),
    (THRESHOLD_F.format(7), 3, threshold),
    (MSE_F, 3, mse),
]
for functor, n, op in VECTORIZED_OPS:
    for vec in (2, 4):
        register(VECTORIZED.format(vec=vec, functor=functor, n=n))(vectorized(op))

# (functor, tail of the lambda's signature, operand count, op)
STRIDED_OPS = [
    (MUL_F, ITER, 3, mul),
    (THRESHOLD_F.format(8), "S7_RKS8_", 3, threshold),
    (MSE_F, "S4_RKT_", 3, mse),
    ("ZZZNS0_24mse_backward_cuda_kernelERNS_14TensorIteratorERKN3c106ScalarEENKUlvE_clEvENKUlvE0_clEvEUlfffE_",
     ITER, 4, mse_backward),
    ("ZZZNS0_23direct_copy_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE1_clEvENKUlvE5_clEvEUlfE_",
     "S4_RKT_", 2, copy),
]
for functor, tail, n, op in STRIDED_OPS:
    register(STRIDED.format(functor=functor, tail=tail))(strided(op, n))

# -------------------------------------------------------------------------------------- reductions


@dataclass
class ReduceKind:
    """A ReduceOp's ops_t: its size in the struct, and how partial results combine and finish."""

    ops_format: str  # struct format of ops_t's members ("x": an empty functor)
    project: Callable[[tuple, np.ndarray], np.ndarray]  # (ops_t's members, accumulated) -> output


SUM = ReduceKind("x", lambda ops, acc: acc)
MEAN = ReduceKind("f", lambda ops, acc: acc * ops[0])  # MeanOps{factor}: sum * (1 / count)


@dataclass
class ReduceLayout:
    """The ReduceOp<scalar, ops, uint32, out> parameter: the fields the host computation needs."""

    ops: tuple
    num_inputs: int
    num_outputs: int
    input_calc: OffsetCalculator
    output_calc: OffsetCalculator  # operand 0: the output, operand 1: the input slice's start
    src: int
    dst: int
    acc_buf: int
    accumulate: bool
    final_output: bool

    @classmethod
    def decode(cls, buf: bytes, kind: ReduceKind, acc_size: int) -> "ReduceLayout":
        ops = struct.unpack_from("<" + kind.ops_format, buf)
        ident_at = align(struct.calcsize(kind.ops_format), acc_size)
        config_at = align(ident_at + acc_size, 4)
        # ReduceConfig: element_size, num_inputs, num_outputs, step_input, step_output, ctas_per_output,
        # input_mult[3], output_mult[2], block_width, block_height, num_threads, vectorize_input, output_vec_size
        num_inputs, num_outputs = struct.unpack_from("<ii", buf, config_at + 4)
        input_at = config_at + 64
        output_at = input_at + OffsetCalculator.nbytes(1)
        pointers_at = align(output_at + OffsetCalculator.nbytes(2), 8)
        # src, dst[2], acc_buf, cta_buf, semaphores, int64 base_idx, bool accumulate, bool final_output
        src, dst, _, acc_buf, _, _, _, accumulate, final_output = struct.unpack_from("<7Q??", buf, pointers_at)
        return cls(ops, num_inputs, num_outputs, OffsetCalculator.decode(buf, input_at, 1),
                   OffsetCalculator.decode(buf, output_at, 2), src, dst, acc_buf, accumulate, final_output)


def reduction(kind: ReduceKind, dtype: str = F32) -> KernelImpl:
    """reduce_kernel(ReduceOp): the whole reduction at once, whatever the grid's split across
    threads, warps and blocks (those only change the summation order)."""

    def run(k: Launch) -> None:
        op = ReduceLayout.decode(k.params, kind, np.dtype(dtype).itemsize)
        out_offsets, in_starts = op.output_calc.offsets(op.num_outputs)
        in_offsets = op.input_calc.offsets(op.num_inputs)[0]
        values = gather(k, op.src, in_starts[:, None] + in_offsets[None, :], dtype)
        acc = values.astype(np.float64).sum(axis=1)
        # partial results of an earlier launch (a split reduction) are in acc_buf or the output
        target = op.acc_buf if op.acc_buf else op.dst
        if op.accumulate:
            acc += gather(k, target, out_offsets, dtype)
        if op.final_output:
            scatter(k, op.dst, out_offsets, kind.project(op.ops, acc).astype(dtype))
        else:
            scatter(k, target, out_offsets, acc.astype(dtype))

    return run


REDUCE = "_ZN2at6native13reduce_kernelILi{nt}ELi{vec}ENS0_8ReduceOpIf{ops}jfLi4ELi4EEEEEvT1_"
SUM_OPS = "NS0_14func_wrapper_tIfZNS0_11sum_functorIfffEclERNS_14TensorIteratorEEUlffE_EE"
MEAN_OPS = "NS0_7MeanOpsIffffEE"
for nt, vec in ((512, 1), (256, 2), (128, 4)):  # 512 threads, or fewer that each produce vec outputs
    register(REDUCE.format(nt=nt, vec=vec, ops=SUM_OPS))(reduction(SUM))
    register(REDUCE.format(nt=nt, vec=vec, ops=MEAN_OPS))(reduction(MEAN))

# ------------------------------------------------------------------------------------------ foreach

CHUNK = 65536  # elements per block (kChunkSize)
MAX_TENSORS = (770, 448, 336, 252, 210)  # per launch, by depth (32 KiB parameters)
MAX_BLOCKS = 2240


@dataclass
class TensorLists:
    """TensorListMetadata<depth>: addresses[depth][max_tensors], int64 numel[max_tensors],
    uint16 block_to_tensor[max_blocks], int32 block_to_chunk[max_blocks], int32 start_tensor."""

    addresses: list[tuple[int, ...]]  # per list
    numel: tuple[int, ...]
    block_to_tensor: tuple[int, ...]
    block_to_chunk: tuple[int, ...]

    @staticmethod
    def nbytes(depth: int) -> int:
        return align((depth + 1) * 8 * MAX_TENSORS[depth - 1] + 6 * MAX_BLOCKS + 4, 8)

    @classmethod
    def decode(cls, buf: bytes, depth: int) -> "TensorLists":
        tensors = MAX_TENSORS[depth - 1]
        addresses = [struct.unpack_from(f"<{tensors}Q", buf, 8 * tensors * d) for d in range(depth)]
        at = 8 * tensors * depth
        numel = struct.unpack_from(f"<{tensors}q", buf, at)
        at += 8 * tensors
        block_to_tensor = struct.unpack_from(f"<{MAX_BLOCKS}H", buf, at)
        block_to_chunk = struct.unpack_from(f"<{MAX_BLOCKS}i", buf, at + 2 * MAX_BLOCKS)
        return cls(addresses, numel, block_to_tensor, block_to_chunk)

    def chunks(self, blocks: int):
        """(tensor, first element, element count) of each block of the launch."""
        for block in range(blocks):
            tensor = self.block_to_tensor[block]
            start = self.block_to_chunk[block] * CHUNK
            yield tensor, start, min(CHUNK, self.numel[tensor] - start)


BINARY_OPS = {"St4plusIfE": np.add, "St10multipliesIfE": np.multiply}


def foreach(depth: int, reads: int, result: int, op: Callable, alpha_list: bool, dtype: str = F32) -> KernelImpl:
    """multi_tensor_apply_kernel(lists, functor, op, scalar): BinaryOpListAlphaFunctor computes
    op(a, scalar * b) of two lists, BinaryOpScalarFunctor op(a, scalar) of one; the result goes
    to list `result` (0: in place)."""

    def run(k: Launch) -> None:
        meta, _functor, _op, scalar_param = k.kernel.params
        if meta.size != TensorLists.nbytes(depth):
            raise ValueError(f"TensorListMetadata<{depth}> of {meta.size} bytes: not the layout this decodes")
        lists = TensorLists.decode(k.params[meta.offset :], depth)
        scalar = np.float32(struct.unpack_from("<f", k.params, scalar_param.offset)[0])
        itemsize = np.dtype(dtype).itemsize
        for tensor, start, count in lists.chunks(k.grid[0]):
            args = [k.array(lists.addresses[i][tensor] + start * itemsize, count, dtype) for i in range(reads)]
            values = op(args[0], scalar * args[1]) if alpha_list else op(args[0], scalar)
            k.store(lists.addresses[result][tensor] + start * itemsize, values.astype(dtype))

    return run


FOREACH_LIST = ("_ZN2at6native55_GLOBAL__N__f86471ef_22_ForeachBinaryOpList_cu_a911ec4325multi_tensor_apply_kernelI"
                "NS1_18TensorListMetadataILi{depth}EEENS1_24BinaryOpListAlphaFunctorIfLi{depth}ELi2ELi{result}EEE"
                "J{op}fEEEvT_T0_DpT1_")
FOREACH_SCALAR = ("_ZN2at6native57_GLOBAL__N__7e105b8f_24_ForeachBinaryOpScalar_cu_86b9896c25multi_tensor_apply_kernelI"
                  "NS1_18TensorListMetadataILi{depth}EEENS1_21BinaryOpScalarFunctorIfLi{depth}ELi1ELi{result}EEE"
                  "J{op}fEEEvT_T0_DpT1_")
for mangled_op, binary in BINARY_OPS.items():
    for depth, result in ((2, 0), (3, 2)):  # in place (a += alpha * b) and out of place
        register(FOREACH_LIST.format(depth=depth, result=result, op=mangled_op))(
            foreach(depth, 2, result, binary, alpha_list=True))
    for depth, result in ((1, 0), (2, 1)):
        register(FOREACH_SCALAR.format(depth=depth, result=result, op=mangled_op))(
            foreach(depth, 1, result, binary, alpha_list=False))
