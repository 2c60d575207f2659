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
I64 = "<i8"
BOOL = "?"
KernelImpl = Callable[[Launch], None]
VECS = (1, 2, 4, 8)  # vectorized kernels' vector sizes: which one runs depends on the operands' alignment

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
for vec in VECS:  # torch.full(..., dtype=bool): generate's stopping criteria
    register(FILL_KERNEL.format(vec, "b"))(fill("?", BOOL))

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


def operand_types(types: tuple[str, ...], dtype: str, nargs: int) -> tuple[str, ...]:
    """Each operand's dtype, the output first: `types` where an op mixes them (comparisons, masks), else `dtype`."""
    return types or (dtype,) * nargs


def vectorized(op: ElementwiseOp, dtype: str = F32, types: tuple[str, ...] = ()) -> KernelImpl:
    """vectorized_elementwise_kernel(int N, functor, array<char*, n> data): all operands contiguous."""

    def run(k: Launch) -> None:
        count_param, functor_param, data_param = k.kernel.params
        count = struct.unpack_from("<i", k.params, count_param.offset)[0]
        functor = k.params[functor_param.offset : functor_param.offset + functor_param.size]
        out, *inputs = struct.unpack_from(f"<{data_param.size // 8}Q", k.params, data_param.offset)
        out_type, *in_types = operand_types(types, dtype, len(inputs) + 1)
        values = op(functor, [k.array(address, count, t) for address, t in zip(inputs, in_types, strict=True)])
        k.store(out, np.ascontiguousarray(values, dtype=out_type))

    return run


def strided(op: ElementwiseOp, nargs: int, dtype: str = F32, types: tuple[str, ...] = ()) -> KernelImpl:
    """elementwise_kernel<128, unroll>(int N, lambda{OffsetCalculator<nargs>, data[nargs], functor})."""

    def run(k: Launch) -> None:
        count_param, lambda_param = k.kernel.params
        count = struct.unpack_from("<i", k.params, count_param.offset)[0]
        at = lambda_param.offset
        offsets = OffsetCalculator.decode(k.params, at, nargs).offsets(count)
        data_at = at + align(OffsetCalculator.nbytes(nargs), 8)
        data = struct.unpack_from(f"<{nargs}Q", k.params, data_at)
        functor = k.params[data_at + 8 * nargs : lambda_param.offset + lambda_param.size]
        out_type, *in_types = operand_types(types, dtype, nargs)
        values = op(functor, [gather(k, data[i], offsets[i], in_types[i - 1]) for i in range(1, nargs)])
        scatter(k, data[0], offsets[0], np.asarray(values, dtype=out_type))

    return run


# c10::ScalarType codes -> numpy dtypes, for the operands of casting loads and stores
SCALAR_TYPES = {0: "<u1", 1: "<i1", 2: "<i2", 3: "<i4", 4: I64, 6: F32, 7: "<f8", 11: BOOL}


def cast_types(k: Launch, param_index: int, count: int) -> tuple[str, ...]:
    """The operand dtypes of a LoadWithCast<count> / StoreWithCast<count> parameter (array<ScalarType, count>,
    then array<uint32, count> element sizes); () for LoadWithoutCast / StoreWithoutCast, which are empty."""
    param = k.kernel.params[param_index]
    if param.size < 5 * count:
        return ()
    return tuple(SCALAR_TYPES[code] for code in struct.unpack_from(f"<{count}b", k.params, param.offset))


def unrolled(op: ElementwiseOp, types: tuple[str, ...]) -> KernelImpl:
    """unrolled_elementwise_kernel(int N, functor, data, in_calc, out_calc, loader, storer): contiguous operands
    (TrivialOffsetCalculators); `types` are the functor's, which a casting loader or storer converts from and to
    (e.g. int64 & bool computed in int64)."""

    def run(k: Launch) -> None:
        count_param, functor_param, data_param = k.kernel.params[:3]
        count = struct.unpack_from("<i", k.params, count_param.offset)[0]
        functor = k.params[functor_param.offset : functor_param.offset + functor_param.size]
        out, *inputs = struct.unpack_from(f"<{data_param.size // 8}Q", k.params, data_param.offset)
        loaded = cast_types(k, 5, len(inputs)) or types[1:]
        stored = cast_types(k, 6, 1) or types[:1]
        args = [k.array(address, count, t).astype(compute)
                for address, t, compute in zip(inputs, loaded, types[1:], strict=True)]
        values = np.asarray(op(functor, args), dtype=types[0])
        k.store(out, np.ascontiguousarray(values.astype(stored[0])))

    return run


VECTORIZED = "_ZN2at6native29vectorized_elementwise_kernelILi{vec}E{functor}St5arrayIPcLm{n}EELb0EEEviT0_T1_"
STRIDED = ("_ZN2at6native18elementwise_kernelILi128ELi{unroll}EZNS0_22gpu_kernel_impl_nocastI{functor}EEv{tail}"
           "EUliE_EEviT1_")
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
    register(STRIDED.format(unroll=2, functor=functor, tail=tail))(strided(op, n))

# ------------------------------------------------------- int64 and bool elementwise (generate's bookkeeping)

# Comparison functors hold their operator as an int enum: CompareEqFunctor's EqOpType {EQ, NE}, CompareFunctor's
# OpType {GE, GT, LE, LT}; a scalar operand (int64) follows at offset 8.
EQ_OPS = (np.equal, np.not_equal)
ORDER_OPS = (np.greater_equal, np.greater, np.less_equal, np.less)


def compare_eq(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    return EQ_OPS[struct.unpack_from("<i", functor)[0]](x[0], x[1])


def compare_eq_scalar(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    # AUnaryFunctor / BUnaryFunctor {CompareEqFunctor f, int64 scalar}: == and != are symmetric
    op, scalar = struct.unpack_from("<i4xq", functor)
    return EQ_OPS[op](x[0], np.int64(scalar))


def compare(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    return ORDER_OPS[struct.unpack_from("<i", functor)[0]](x[0], x[1])


def compare_scalar(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    # compare_scalar_kernel's lambda captures {CompareFunctor f, int64 rhs}: lhs op rhs
    op, rhs = struct.unpack_from("<i4xq", functor)
    return ORDER_OPS[op](x[0], np.int64(rhs))


def add_alpha(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    # CUDAFunctor_add {alpha}: a + alpha * b
    return x[0] + np.int64(struct.unpack_from("<q", functor)[0]) * x[1]


def add_scalar_on_self(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    # CUDAFunctorOnSelf_add {other, alpha}: self + alpha * other (tensor + scalar)
    other, alpha = struct.unpack_from("<qq", functor)
    return x[0] + np.int64(alpha) * np.int64(other)


def add_scalar_on_other(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    # CUDAFunctorOnOther_add {self, alpha}: self + alpha * other (scalar - tensor, as rsub)
    self_, alpha = struct.unpack_from("<qq", functor)
    return np.int64(self_) + np.int64(alpha) * x[0]


def bitwise_and(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    return x[0] & x[1]


def bitwise_or(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    return x[0] | x[1]


def bitwise_not(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    return ~x[0]  # logical not for numpy bools


def masked_fill(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    # masked_fill_kernel's lambda captures the fill value: mask ? value : self
    return np.where(x[1], np.int64(struct.unpack_from("<q", functor)[0]), x[0])


COMPARE_EQ_F = "NS0_51_GLOBAL__N__68c48bfe_18_CompareEQKernel_cu_d8008c9616CompareEqFunctorIlEE"
COMPARE_NS = "NS0_50_GLOBAL__N__30bf7ff7_17_CompareKernels_cu_8f1b29aa"
COMPARE_F = f"{COMPARE_NS}14CompareFunctorIlEE"
BITWISE_AND_L = "NS0_13BinaryFunctorIlllNS0_17BitwiseAndFunctorIlEEEE"
LLB, LL, BB = (BOOL, I64, I64), (I64, I64), (BOOL, BOOL)  # operand dtypes, output first
# (functor, operand count incl. the output, op, operand dtypes)
INT_VECTORIZED_OPS = [
    (f"NS0_13BinaryFunctorIllb{COMPARE_EQ_F}EE", 3, compare_eq, LLB),
    (f"NS0_13AUnaryFunctorIllb{COMPARE_EQ_F}EE", 2, compare_eq_scalar, LLB[:2]),
    (f"NS0_13BUnaryFunctorIllb{COMPARE_EQ_F}EE", 2, compare_eq_scalar, LLB[:2]),
    (COMPARE_F, 3, compare, LLB),
    (f"ZNS0_21compare_scalar_kernelIlEEvRNS_18TensorIteratorBaseE{COMPARE_NS}6OpTypeET_EUllE_", 2, compare_scalar,
     LLB[:2]),
    ("NS0_13BinaryFunctorIlllNS0_15binary_internal10MulFunctorIlEEEE", 3, mul, (I64,) * 3),
    ("NS0_15CUDAFunctor_addIlEE", 3, add_alpha, (I64,) * 3),
    ("NS0_21CUDAFunctorOnSelf_addIlEE", 2, add_scalar_on_self, LL),
    ("NS0_22CUDAFunctorOnOther_addIlEE", 2, add_scalar_on_other, LL),
    (BITWISE_AND_L, 3, bitwise_and, (I64,) * 3),
    ("NS0_13BinaryFunctorIbbbNS0_17BitwiseAndFunctorIbEEEE", 3, bitwise_and, (BOOL,) * 3),
    ("NS0_13BinaryFunctorIbbbNS0_16BitwiseOrFunctorIbEEEE", 3, bitwise_or, (BOOL,) * 3),
    ("ZNS0_23bitwise_not_kernel_cudaERNS_18TensorIteratorBaseEEUlbE_", 2, bitwise_not, BB),
    ("ZZZNS0_44_GLOBAL__N__b23ef953_11_Indexing_cu_89862edb18masked_fill_kernelERNS_14TensorIteratorERKN3c106Scalar"
     "EENKUlvE_clEvENKUlvE2_clEvEUllbE_", 3, masked_fill, (I64, I64, BOOL)),
    ("ZNS0_27converting_copy_kernel_cudaIblEEvRNS_18TensorIteratorBaseEEUlbE_", 2, copy, (I64, BOOL)),
]
for functor, n, op, types in INT_VECTORIZED_OPS:
    for vec in VECS:
        register(VECTORIZED.format(vec=vec, functor=functor, n=n))(vectorized(op, types=types))
    for unroll in (2, 4):  # the same functors on strided or broadcast operands
        register(STRIDED.format(unroll=unroll, functor=functor, tail=ITER))(strided(op, n, types=types))

DIRECT_COPY_F = "ZZZNS0_23direct_copy_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE1_clEvENKUlvE{}_clEvEUl{}E_"
for unroll in (2, 4):
    register(STRIDED.format(unroll=unroll, functor=DIRECT_COPY_F.format(2, "l"), tail="S4_RKT_"))(
        strided(copy, 2, I64))
    register(STRIDED.format(unroll=unroll, functor=DIRECT_COPY_F.format(9, "b"), tail="S4_RKT_"))(
        strided(copy, 2, BOOL))

UNROLLED = "_ZN2at6native27unrolled_elementwise_kernelI{}EEviT_T0_T2_T3_T4_T5_"
# (the template arguments, op, the functor's operand dtypes); written out whole: their mangling back-references
# (S7_, SA_...) number the components of the functor before them
UNROLLED_OPS = [
    ("NS0_13BinaryFunctorIllbNS0_51_GLOBAL__N__68c48bfe_18_CompareEQKernel_cu_d8008c9616CompareEqFunctorIlEEEESt5array"
     "IPcLm3EELi4E23TrivialOffsetCalculatorILi2EjESA_ILi1EjENS0_6memory15LoadWithoutCastENSD_16StoreWithoutCastE",
     compare_eq, LLB),
    ("NS0_15CUDAFunctor_addIlEESt5arrayIPcLm3EELi4E23TrivialOffsetCalculatorILi2EjES7_ILi1EjENS0_6memory15LoadWithout"
     "CastENSA_16StoreWithoutCastE", add_alpha, (I64,) * 3),
    ("NS0_13BinaryFunctorIlllNS0_17BitwiseAndFunctorIlEEEESt5arrayIPcLm3EELi4E23TrivialOffsetCalculatorILi2EjES9_ILi1"
     "EjENS0_6memory12LoadWithCastILi2EEENSC_13StoreWithCastILi1EEE", bitwise_and, (I64,) * 3),  # int64 & bool
    ("ZZZNS0_23direct_copy_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE1_clEvENKUlvE9_clEvEUlbE_St5arrayIPcLm2EELi4E"
     "23TrivialOffsetCalculatorILi1EjESB_NS0_6memory12LoadWithCastILi1EEENSC_13StoreWithCastILi1EEE", copy, BB),
]
for template_args, op, types in UNROLLED_OPS:
    register(UNROLLED.format(template_args))(unrolled(op, types))

# ---------------------------------------------------------------------------------- arange and cat


def arange(k: Launch) -> None:
    """elementwise_kernel_with_index<int>(int N, lambda{start, step}, int64* out): out[i] = start + step * i."""
    count_param, lambda_param, out_param = k.kernel.params
    count = struct.unpack_from("<i", k.params, count_param.offset)[0]
    start, step = struct.unpack_from("<qq", k.params, lambda_param.offset)
    out = struct.unpack_from("<Q", k.params, out_param.offset)[0]
    k.store(out, start + step * np.arange(count, dtype=np.int64))


register("_ZN50_GLOBAL__N__2fa45684_17_RangeFactories_cu_38772b0829elementwise_kernel_with_indexIiZZZN2at6native15"
         "arange_cuda_outERKN3c106ScalarES6_S6_RNS1_6TensorEENKUlvE_clEvENKUlvE2_clEvEUllE_EEvT_T0_PN15function_traits"
         "ISD_E11result_typeE")(arange)

CAT_MAX_DIMS = 4  # CAT_ARRAY_MAX_INPUT_DIMS


def cat_offsets(index: np.ndarray, sizes: tuple, strides: tuple, dims: int, concat_dim: int,
                dim_size: int) -> np.ndarray:
    """CatArrIndexToOffset: an input's linear indices -> element offsets in the output (the input has the
    output's shape but `dim_size` along the concatenated dimension)."""
    offset = np.zeros_like(index)
    for dim in range(dims - 1, 0, -1):
        index, within = np.divmod(index, dim_size if dim == concat_dim else sizes[dim])
        offset += within * strides[dim]
    return offset + index * strides[0]


def cat_contiguous(itemsize: int, dims: int, batch: int) -> KernelImpl:
    """CatArrayBatchedCopy_alignedK_contig(T* out, CatArrInputTensorMetadata inputs, TensorSizeStride out_shape,
    int concat_dim, uint dim_stride): contiguous inputs, one per blockIdx.y. The metadata: T* input[batch],
    uint offset[batch], uint dim_size[batch], uint count[batch], bool contiguous[batch], strides."""

    dtype = f"<u{itemsize}"  # only moved: OpaqueType<itemsize>

    def run(k: Launch) -> None:
        out_param, meta_param, shape_param, dim_param, dim_stride_param = k.kernel.params
        out = struct.unpack_from("<Q", k.params, out_param.offset)[0]
        at = meta_param.offset
        inputs = struct.unpack_from(f"<{batch}Q", k.params, at)
        offsets, dim_sizes, counts = (struct.unpack_from(f"<{batch}I", k.params, at + 8 * batch + 4 * batch * i)
                                      for i in range(3))
        sizes = struct.unpack_from(f"<{CAT_MAX_DIMS}I", k.params, shape_param.offset)
        strides = struct.unpack_from(f"<{CAT_MAX_DIMS}I", k.params, shape_param.offset + 4 * CAT_MAX_DIMS)
        concat_dim = struct.unpack_from("<i", k.params, dim_param.offset)[0]
        dim_stride = struct.unpack_from("<I", k.params, dim_stride_param.offset)[0]
        for i in range(k.grid[1]):
            index = np.arange(counts[i], dtype=np.int64)
            where = offsets[i] * dim_stride + cat_offsets(index, sizes, strides, dims, concat_dim, dim_sizes[i])
            scatter(k, out, where * itemsize, k.array(inputs[i], counts[i], dtype))

    return run


CAT_CONTIG = ("_ZN2at6native40_GLOBAL__N__f1f992fe_8_Shape_cu_49f7391c35CatArrayBatchedCopy_alignedK_contigINS1_10"
              "OpaqueTypeILj{size}EEEjLi{dims}ELi128ELi1ELi16EEEvPT_NS1_25CatArrInputTensorMetadataIS5_T0_XT2_EXT3_EEE"
              "NS1_16TensorSizeStrideIS8_Lj4EEEiS8_")
for size in (1, 2, 4, 8):
    for dims in range(1, CAT_MAX_DIMS + 1):  # torch.cat of generate's token ids: int64 (1, n) + (1, 1)
        register(CAT_CONTIG.format(size=size, dims=dims))(cat_contiguous(size, dims, 128))


def cat_vectorized(itemsize: int) -> KernelImpl:
    """CatArrayBatchedCopy_vectorized<T, uint, Dims=1, ...>(char* out, CatArrInputTensorMetadata inputs,
    TensorSizeStride out_shape, int concat_dim, uint trailing): 1-D contiguous inputs, one per blockIdx.y, each to
    the output from its offset (in elements, times `trailing`) on. DDP flattens a bucket's tensors this way."""

    def run(k: Launch) -> None:
        out_param, meta_param, _shape, _dim, trailing_param = k.kernel.params
        out = struct.unpack_from("<Q", k.params, out_param.offset)[0]
        at = meta_param.offset
        inputs = struct.unpack_from("<128Q", k.params, at)
        offsets, _sizes, counts = (struct.unpack_from("<128I", k.params, at + 8 * 128 + 4 * 128 * i) for i in range(3))
        trailing = struct.unpack_from("<I", k.params, trailing_param.offset)[0]
        for i in range(k.grid[1]):
            k.store(out + offsets[i] * trailing * itemsize, k.array(inputs[i], counts[i] * itemsize, "<u1"))

    return run


CAT_VECTORIZED = ("_ZN2at6native40_GLOBAL__N__f1f992fe_8_Shape_cu_49f7391c30CatArrayBatchedCopy_vectorizedINS1_10"
                  "OpaqueTypeILj{size}EEEjLi1ELi128ELi1ELi16ELi{per_vec}EEEvPcNS1_25CatArrInputTensorMetadataIT_T0_XT2_"
                  "EXT3_EEENS1_16TensorSizeStrideIS8_Lj4EEEiS8_")
for size in (1, 2, 4, 8):  # 16-byte vectors
    register(CAT_VECTORIZED.format(size=size, per_vec=16 // size))(cat_vectorized(size))

# -------------------------------------------------------------------------------------- reductions


def add_rows(values: np.ndarray) -> np.ndarray:
    """Row sums: floats in float64 (the order of a GPU's partial sums is not reproduced anyway), integers exactly."""
    return values.astype(np.float64).sum(axis=1) if values.dtype.kind == "f" else values.sum(axis=1)


@dataclass
class ReduceKind:
    """A ReduceOp's ops_t: its size in the struct, and how partial results combine and finish."""

    ops_format: str  # struct format of ops_t's members ("x": an empty functor)
    project: Callable[[tuple, np.ndarray], np.ndarray]  # (ops_t's members, accumulated) -> output
    combine: Callable[[np.ndarray], np.ndarray] = add_rows  # (outputs, inputs) -> one accumulated value per output
    acc: np.dtype | None = None  # arg_t, the identity's type, where it is not the input's: its size and alignment
    splits: bool = True  # whether partial results of split launches (acc_buf, accumulate) can be merged by adding


def identity(ops: tuple, acc: np.ndarray) -> np.ndarray:
    return acc


SUM = ReduceKind("x", identity)
MEAN = ReduceKind("f", lambda ops, acc: acc * ops[0])  # MeanOps{factor}: sum * (1 / count)
# generate's bookkeeping: unfinished_sequences.max(), any / all of bool masks, argmax of the logits
MAX = ReduceKind("x", identity, lambda values: values.max(axis=1), splits=False)
ANY = ReduceKind("x", identity, lambda values: values.any(axis=1), splits=False)
ALL = ReduceKind("x", identity, lambda values: values.all(axis=1), splits=False)
# ArgMaxOps' arg_t is pair<value, int64 index>; np.argmax, like ArgMaxOps, takes the first maximum and a NaN over all
ARGMAX = ReduceKind("x", identity, lambda values: values.argmax(axis=1), np.dtype([("v", F32), ("i", I64)], align=True),
                    splits=False)


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
    def decode(cls, buf: bytes, kind: ReduceKind, acc: np.dtype) -> "ReduceLayout":
        ops = struct.unpack_from("<" + kind.ops_format, buf)
        ident_at = align(struct.calcsize(kind.ops_format), acc.alignment)
        config_at = align(ident_at + acc.itemsize, 4)
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


def reduction(kind: ReduceKind, dtype: str = F32, out_dtype: str = "") -> KernelImpl:
    """reduce_kernel(ReduceOp): the whole reduction at once, whatever the grid's split across
    threads, warps and blocks (those only change the summation order)."""

    def run(k: Launch) -> None:
        op = ReduceLayout.decode(k.params, kind, kind.acc or np.dtype(dtype))
        if (op.accumulate or not op.final_output) and not kind.splits:
            raise ValueError(f"{k.kernel.name}: a reduction split across launches, which this does not merge")
        out_offsets, in_starts = op.output_calc.offsets(op.num_outputs)
        in_offsets = op.input_calc.offsets(op.num_inputs)[0]
        values = gather(k, op.src, in_starts[:, None] + in_offsets[None, :], dtype)
        acc = kind.combine(values)
        # partial results of an earlier launch (a split reduction) are in acc_buf or the output
        target = op.acc_buf if op.acc_buf else op.dst
        if op.accumulate:
            acc += gather(k, target, out_offsets, dtype)
        if op.final_output:
            scatter(k, op.dst, out_offsets, kind.project(op.ops, acc).astype(out_dtype or dtype))
        else:
            scatter(k, target, out_offsets, acc.astype(dtype))

    return run


REDUCE = "_ZN2at6native13reduce_kernelILi{nt}ELi{vec}ENS0_8ReduceOpI{scalar}{ops}j{out}Li4ELi4EEEEEvT1_"
SUM_OPS = "NS0_14func_wrapper_tIfZNS0_11sum_functorIfffEclERNS_14TensorIteratorEEUlffE_EE"
MEAN_OPS = "NS0_7MeanOpsIffffEE"
LOGICAL_OPS = "NS0_14func_wrapper_tIbZZZNS0_{}_kernel_cudaERNS_14TensorIteratorEENKUlvE_clEvENKUlvE10_clEvEUlbbE_EE"
# (input and output type in the mangling, ops_t, kind, input dtype, output dtype)
REDUCTIONS = [
    ("f", SUM_OPS, "f", SUM, F32, F32),
    ("f", MEAN_OPS, "f", MEAN, F32, F32),
    ("l", "NS0_14func_wrapper_tIlZNS0_11sum_functorIlllEclERNS_14TensorIteratorEEUlllE_EE", "l", SUM, I64, I64),
    ("l", "NS0_14func_wrapper_tIlNS0_13MaxNanFunctorIlEEEE", "l", MAX, I64, I64),
    ("b", LOGICAL_OPS.format("14or"), "b", ANY, BOOL, BOOL),
    ("b", LOGICAL_OPS.format("15and"), "b", ALL, BOOL, BOOL),
    ("f", "NS0_9ArgMaxOpsIfEE", "l", ARGMAX, F32, I64),
]
for scalar, ops, out, kind, dtype, out_dtype in REDUCTIONS:
    for nt, vec in ((512, 1), (256, 2), (128, 4)):  # 512 threads, or fewer that each produce vec outputs
        register(REDUCE.format(nt=nt, vec=vec, scalar=scalar, ops=ops, out=out))(reduction(kind, dtype, out_dtype))

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

# -------------------------------------------------------------------- cuSPARSE's neighbours (tests/test_sparse.py)

# a COO matrix's int64 row indices cast to int32 before cusparseXcoo2csr (LoadWithCast from int64)
register(UNROLLED.format(
    "ZZZNS0_23direct_copy_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE1_clEvENKUlvE1_clEvEUliE_St5arrayIPcLm2EELi4E"
    "23TrivialOffsetCalculatorILi1EjESB_NS0_6memory12LoadWithCastILi1EEENSC_13StoreWithCastILi1EEE"))(
    unrolled(copy, ("<i4", "<i4")))

# ------------------------------------------------------------------------------ around cuFFT (torch.fft)
# An inverse transform's normalisation multiplies the result by 1/n in place (AUnaryFunctor{op, scalar}: the scalar
# last, after the empty MulFunctor), complex results in complex, real ones (irfft) in double; a
# strided complex result is copied element by element.
C64, F64 = "<c8", "<f8"


def mul_by_scalar(dtype: str) -> ElementwiseOp:
    scalar_type = np.dtype(dtype)

    def op(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
        return x[0] * np.frombuffer(functor, scalar_type, 1, len(functor) - scalar_type.itemsize)[0]
    return op


FFT_SCALAR_OPS = [  # (functor, operand dtype)
    ("NS0_13AUnaryFunctorIN3c107complexIfEES5_S5_NS0_15binary_internal10MulFunctorIS5_EEEE", C64),
    ("NS0_13AUnaryFunctorIdddNS0_15binary_internal10MulFunctorIdEEEE", F64),
]
for functor, dtype in FFT_SCALAR_OPS:
    for vec in VECS:
        register(VECTORIZED.format(vec=vec, functor=functor, n=2))(vectorized(mul_by_scalar(dtype), dtype))
register(STRIDED.format(unroll=2, functor=DIRECT_COPY_F.format(7, "N3c107complexIfEE"), tail="S4_RKT_"))(
    strided(copy, 2, C64))



def hermitian_offsets(buf: bytes, at: int, count: int, mirror: bool) -> np.ndarray:
    """Element offsets of linear indices 0..count-1 from ATen's OffsetCalculator<1, uint32, signed strides> (its
    element strides) or, `mirror`, its HermitianSymmetryOffsetCalculator<uint32> (the same, then a bit mask of the
    dimensions whose index i is mirrored to size - i for i > 0). Strides are read signed: the last dimension's is
    negative, to mirror it."""
    dims = struct.unpack_from("<i", buf, at)[0]
    sizes = [struct.unpack_from("<I", buf, at + 4 + 12 * d)[0] for d in range(dims)]
    strides = struct.unpack_from(f"<{dims}i", buf, at + 4 + 12 * MAX_DIMS)
    mask = struct.unpack_from("<I", buf, at + 4 + 16 * MAX_DIMS)[0] if mirror else 0
    index, out = np.arange(count, dtype=np.int64), np.zeros(count, dtype=np.int64)
    for d, (size, stride) in enumerate(zip(sizes, strides, strict=True)):
        index, within = np.divmod(index, size)
        if mask >> d & 1:
            within = np.where(within == 0, 0, size - within)
        out += within * stride
    return out


def conjugate_copy(dtype: str) -> KernelImpl:
    """_fft_conjugate_copy_kernel(int64 numel, T *out, const T *in, in_calc, out_calc): an r2c's half spectrum
    mirrored into the other half, conjugated (torch.fft.fft of real input)."""
    itemsize = np.dtype(dtype).itemsize

    def run(k: Launch) -> None:
        numel_param, out_param, in_param, in_calc, out_calc = k.kernel.params
        count = struct.unpack_from("<q", k.params, numel_param.offset)[0]
        out, source = (struct.unpack_from("<Q", k.params, p.offset)[0] for p in (out_param, in_param))
        values = gather(k, source, hermitian_offsets(k.params, in_calc.offset, count, False) * itemsize, dtype)
        scatter(k, out, hermitian_offsets(k.params, out_calc.offset, count, True) * itemsize, np.conj(values))

    return run


CONJUGATE_COPY = ("_ZN2at6native26_fft_conjugate_copy_kernelIN3c107complexI{}EEj16OffsetCalculatorILi1EjLb1EENS0_33"
                  "HermitianSymmetryOffsetCalculatorIjEEEEvlPT_PKS9_T1_T2_")
for scalar, dtype in (("f", C64), ("d", "<c16")):
    register(CONJUGATE_COPY.format(scalar))(conjugate_copy(dtype))
# a real tensor cast to complex before a c2c transform (fftn over some of its dimensions)
SCALAR_TYPES.update({9: C64, 10: "<c16"})  # c10::ScalarType ComplexFloat, ComplexDouble
register(UNROLLED.format(
    "ZZZNS0_23direct_copy_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE1_clEvENKUlvE7_clEvEUlN3c107complexIfEEE_St5array"
    "IPcLm2EELi4E23TrivialOffsetCalculatorILi1EjESE_NS0_6memory12LoadWithCastILi1EEENSF_13StoreWithCastILi1EEE"))(
    unrolled(copy, (C64, C64)))
