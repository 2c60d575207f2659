"""Host implementations (numpy) of the ATen CUDA kernels that torch.linalg launches around cuSOLVER's and cuBLAS's
calls in tests/programs/torch_linalg_check.py: triu/tril (Cholesky's and QR's factors), the strided fill of an
identity's diagonal (inv), the any() of the `info` results PyTorch checks, det's product of U's diagonal (a kernel
PyTorch's jiterator compiles with NVRTC at run time, which arrives by its plain name) and the pivots' sign, lstsq's
squared residuals, and the complex kernels around the complex64/complex128 factorizations.

Loaded beside tests/torch_sim_kernels.py (XPU_SIM_KERNELS=...,torch_sim_kernels.py,torch_sim_kernels_linalg.py),
whose decoders it uses: it loads its own copy of that file (the sim enters neither in sys.modules).
"""

import importlib.util
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np

from xpuremote.server.backends.sim_kernels import Launch, register

ElementwiseOp = Callable[[bytes, list[np.ndarray]], np.ndarray]

_spec = importlib.util.spec_from_file_location("xpuremote_sim_kernels_torch_base", Path(__file__).with_name(
    "torch_sim_kernels.py"))
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)

# ------------------------------------------------------------------------------------------- triu / tril
MAX_DIMS = 25  # cuda::detail::TensorInfo's fixed capacity


def tensor_info(buf: bytes, at: int, index: str) -> tuple[int, list[int], list[int]]:
    """TensorInfo<T, IndexType>: data pointer, sizes[25], strides[25] (elements), dims -> (data, sizes, strides)."""
    width = struct.calcsize(index)
    data = struct.unpack_from("<Q", buf, at)[0]
    sizes = struct.unpack_from(f"<{MAX_DIMS}{index}", buf, at + 8)
    strides = struct.unpack_from(f"<{MAX_DIMS}{index}", buf, at + 8 + MAX_DIMS * width)
    dims = struct.unpack_from("<i", buf, at + 8 + 2 * MAX_DIMS * width)[0]
    return data, list(sizes[:dims]), list(strides[:dims])


def triu_tril(dtype: str, index: str, upper: bool, inplace: bool):  # noqa: ANN201
    """triu_tril_kernel<scalar, IndexType, upper, elements_per_thread, inplace>(result, self, k, N_padded,
    last_dim_padded): keep the elements on or above (upper) / on or below the k-th diagonal, zero the rest."""
    itemsize = np.dtype(dtype).itemsize

    def run(k: Launch) -> None:
        result_p, self_p, k_p = k.kernel.params[:3]
        out, sizes, out_strides = tensor_info(k.params, result_p.offset, index)
        src, _, in_strides = tensor_info(k.params, self_p.offset, index)
        diagonal = struct.unpack_from("<q", k.params, k_p.offset)[0]
        grid = np.indices(sizes).reshape(len(sizes), -1)
        out_offsets = itemsize * (np.asarray(out_strides)[:, None] * grid).sum(axis=0)
        in_offsets = itemsize * (np.asarray(in_strides)[:, None] * grid).sum(axis=0)
        row, col = grid[-2], grid[-1]
        keep = col - row >= diagonal if upper else col - row <= diagonal
        values = base.gather(k, src, in_offsets, dtype)
        if inplace:
            base.scatter(k, out, out_offsets[~keep], np.zeros((~keep).sum(), dtype))
        else:
            base.scatter(k, out, out_offsets, np.where(keep, values, 0).astype(dtype))

    return run


TRIU_TRIL = "_ZN2at6native16triu_tril_kernelI{scalar}iLb{upper}ELi{per_thread}ELb{inplace}EEEvNS_4cuda6detail10" \
    "TensorInfoIT_T0_EENS{tail}"
# (mangled scalar, numpy dtype, elements per thread, the mangling's back-references after it: a complex scalar's
# own components shift them)
TRIU_TRIL_TYPES = [
    ("f", "<f4", 2, "4_IKS5_S6_EEllS6_"),
    ("d", "<f8", 1, "4_IKS5_S6_EEllS6_"),
    ("N3c107complexIfEE", "<c8", 1, "7_IKS8_S9_EEllS9_"),
    ("N3c107complexIdEE", "<c16", 1, "7_IKS8_S9_EEllS9_"),
]
for scalar, dtype, per_thread, tail in TRIU_TRIL_TYPES:
    for upper in (0, 1):
        for inplace in (0, 1):
            register(TRIU_TRIL.format(scalar=scalar, upper=upper, per_thread=per_thread, inplace=inplace, tail=tail))(
                triu_tril(dtype, "i", bool(upper), bool(inplace)))

# ----------------------------------------------------------------------------------- fill of a diagonal


def fill_strided(dtype: str):  # noqa: ANN201
    """elementwise_kernel<128, 2>(N, lambda{OffsetCalculator<1>, data, FillFunctor<T>{value}}): a strided fill
    (inv's identity: its diagonal set to 1)."""

    def run(k: Launch) -> None:
        count_param, lambda_param = k.kernel.params
        count = struct.unpack_from("<i", k.params, count_param.offset)[0]
        offsets = base.OffsetCalculator.decode(k.params, lambda_param.offset, 1).offsets(count)[0]
        data_at = lambda_param.offset + base.align(base.OffsetCalculator.nbytes(1), 8)
        out = struct.unpack_from("<Q", k.params, data_at)[0]
        value = np.frombuffer(k.params, dtype, 1, data_at + 8)[0]
        base.scatter(k, out, offsets, np.full(count, value, dtype))

    return run


FILL_STRIDED = "_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastINS0_11FillFunctorI{}EEEEv" \
    "RNS_18TensorIteratorBaseERKT_EUliE_EEviT1_"
for scalar, dtype in (("f", "<f4"), ("d", "<f8"), ("N3c107complexIfEE", "<c8"), ("N3c107complexIdEE", "<c16")):
    register(FILL_STRIDED.format(scalar))(fill_strided(dtype))

# ------------------------------------------------------------------------------------ any() of the infos
# reduce_kernel of or_kernel_cuda over int32 `info` results, to bool (PyTorch's check that all succeeded)
ANY_INT_OPS = "NS0_14func_wrapper_tIbZZZNS0_14or_kernel_cudaERNS_14TensorIteratorEENKUlvE_clEvENKUlvE1_clEvEUlbiE_EE"
# its accumulator (the lambda's first argument) is a bool, which places the ReduceOp's fields
ANY_INT = base.ReduceKind("x", base.identity, lambda values: values.any(axis=1), np.dtype(base.BOOL), splits=False)
for nt, vec in ((512, 1), (256, 2), (128, 4)):
    register(base.REDUCE.format(nt=nt, vec=vec, scalar="i", ops=ANY_INT_OPS, out="b"))(
        base.reduction(ANY_INT, "<i4", base.BOOL))

# ------------------------------------------------------------------------------------------------- det
# det = prod(diag(LU)) * sign(P): the sign from the pivots as
#   (arange(1, n + 1, int32) != pivots).sum(-1, dtype=long).fmod_(2).mul_(-2).add_(1)
# then the product's float times that int64 sign (a multiply that casts its operands).
I32, I64, F32 = "<i4", base.I64, base.F32
# c10::ScalarType codes of the complex types, for casting loads of complex dets (the base lacks them)
base.SCALAR_TYPES.update({9: "<c8", 10: "<c16"})


def arange_int32(k: Launch) -> None:
    """elementwise_kernel_with_index<int>(int N, lambda{int64 start, int64 step}, int32* out): an int32 arange
    (the lambda holds the accumulate type, int64)."""
    count_param, lambda_param, out_param = k.kernel.params
    count = struct.unpack_from("<i", k.params, count_param.offset)[0]
    start, step = struct.unpack_from("<qq", k.params, lambda_param.offset)
    out = struct.unpack_from("<Q", k.params, out_param.offset)[0]
    k.store(out, (start + step * np.arange(count, dtype=np.int64)).astype(I32))


# the Int case of arange_cuda_out's dispatch (the Long case, UlvE2_, is the base's)
register("_ZN50_GLOBAL__N__2fa45684_17_RangeFactories_cu_38772b0829elementwise_kernel_with_indexIiZZZN2at6native15"
         "arange_cuda_outERKN3c106ScalarES6_S6_RNS1_6TensorEENKUlvE_clEvENKUlvE1_clEvEUllE_EEvT_T0_PN15function_traits"
         "ISD_E11result_typeE")(arange_int32)


def fmod_scalar(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    """BUnaryFunctor{fmod's lambda, int64 b}: a % b with C's sign (of the dividend), as np.fmod."""
    return np.fmod(x[0], np.int64(struct.unpack_from("<q", functor, 8)[0]))


def mul_int_scalar(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    """AUnaryFunctor{MulFunctor, int64 a}: a * b."""
    return x[0] * np.int64(struct.unpack_from("<q", functor, 8)[0])


COMPARE_EQ_INT = ("NS0_13BinaryFunctorIiibNS0_51_GLOBAL__N__68c48bfe_18_CompareEQKernel_cu_d8008c9616CompareEqFunctorIi"
                  "EEEE")
FMOD_LONG = ("NS0_13BUnaryFunctorIlllZZZNS0_16fmod_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE_clEvENKUlvE2_clEvEUlll"
             "E_EE")
# (functor, operand count incl. the output, op, operand dtypes, output first)
DET_VECTORIZED_OPS = [
    (COMPARE_EQ_INT, 3, base.compare_eq, (base.BOOL, I32, I32)),
    (FMOD_LONG, 2, fmod_scalar, (I64, I64)),
    ("NS0_13AUnaryFunctorIlllNS0_15binary_internal10MulFunctorIlEEEE", 2, mul_int_scalar, (I64, I64)),
]
for functor, n, op, types in DET_VECTORIZED_OPS:
    for vec in (2, 4, 8):
        register(base.VECTORIZED.format(vec=vec, functor=functor, n=n))(base.vectorized(op, types=types))
# the same on strided or broadcast operands (a batch's pivots against one arange): (functor, unroll, tail of the
# lambda's signature); 4-byte operands unroll by 4
for functor, n, op, types in DET_VECTORIZED_OPS:
    unroll, tail = (4, base.ITER) if types[1] == I32 else (2, "S5_RKT_" if functor == FMOD_LONG else base.ITER)
    register(base.STRIDED.format(unroll=unroll, functor=functor, tail=tail))(base.strided(op, n, types=types))

# the product of the diagonals times the int64 sign: a float multiply whose loader casts (LoadWithCast<2>)
register(base.UNROLLED.format(
    "NS0_13BinaryFunctorIfffNS0_15binary_internal10MulFunctorIfEEEESt5arrayIPcLm3EELi4E23TrivialOffsetCalculatorILi2"
    "EjESA_ILi1EjENS0_6memory12LoadWithCastILi2EEENSD_13StoreWithCastILi1EEE"))(base.unrolled(base.mul, (F32,) * 3))

# ------------------------------------------------------------------------- the jitted product reduction
# PyTorch's jiterator compiles `prod` at run time (NVRTC): `reduction_prod_kernel(ReduceJitOp r)`, whose name says
# nothing of the type. ReduceJitOp is a ReduceOp without the ops functor: ident (arg_t, opmath of the input), then
# ReduceConfig (element_size_bytes first), the calculators and pointers as the base's ReduceLayout reads them.
# The identity is 1, whose bytes tell arg_t apart where the element size does not (double and complex<float>).


def prod_type(params: bytes) -> str:
    """The input dtype (arg_t too, for these types) of a ReduceJitOp of `prod`, from ident = 1 and
    config.element_size_bytes; half and bfloat16 (float arg_t, 2-byte elements) are refused, as are complex<half>."""
    for dtype in ("<f4", "<f8", "<c8", "<c16"):
        size = np.dtype(dtype).itemsize
        ident = np.frombuffer(params, dtype, 1)[0]
        element_size = struct.unpack_from("<i", params, base.align(size, 4))[0]
        if ident == 1 and element_size == size:
            return dtype
    raise ValueError("reduction_prod_kernel: an input type other than float, double, complex<float> or "
                     "complex<double> (the sim's twin reads no other)")


def multiply_rows(values: np.ndarray) -> np.ndarray:
    """Row products, in double precision (a GPU's order of partial products is not reproduced anyway)."""
    return values.astype(np.complex128 if values.dtype.kind == "c" else np.float64).prod(axis=1)


def jitted_prod(k: Launch) -> None:
    param = k.kernel.params[0]
    op_bytes = k.params[param.offset : param.offset + param.size]
    dtype = prod_type(op_bytes)
    kind = base.ReduceKind("", base.identity, multiply_rows, np.dtype(dtype), splits=False)
    base.reduction(kind, dtype)(Launch(k.kernel, k.grid, k.block, k.shared, op_bytes, k.memory))


register("reduction_prod_kernel")(jitted_prod)

# ----------------------------------------------------------------------------------------------- lstsq
# pow_tensor_scalar_kernel_impl<T, T>(iter, exp), float and double: exponents 2, 3 and -2 as products (lambdas 1-3,
# nothing captured), any other as pow(base, exp) (lambda 4, capturing exp as T); lstsq squares its residuals.
POW_NS = "ZNS0_51_GLOBAL__N__7b48bba2_12_PowKernel_cu_e5d96c45_5803729pow_tensor_scalar_kernel_implI{t}{t}EEvRNS_18" \
    "TensorIteratorBaseET0_EUl{t}E{discriminator}_"
POW_VECTORIZED = "_ZN2at6native29vectorized_elementwise_kernelILi{vec}E{functor}St5arrayIPcLm2EELb0EEEviS6_T1_"


def pow_ops(dtype: str) -> dict[str, ElementwiseOp]:
    """lambda discriminator -> op, for operands of `dtype`."""
    one = np.dtype(dtype).type(1)
    return {
        "": lambda functor, x: x[0] * x[0],
        "0": lambda functor, x: x[0] * x[0] * x[0],
        "1": lambda functor, x: one / (x[0] * x[0]),
        "2": lambda functor, x: np.power(x[0], np.frombuffer(functor, dtype, 1)[0]),
    }


for mangled, dtype in (("f", "<f4"), ("d", "<f8")):
    for discriminator, pow_op in pow_ops(dtype).items():
        pow_functor = POW_NS.format(t=mangled, discriminator=discriminator)
        register(base.STRIDED.format(unroll=2, functor=pow_functor, tail="S6_RKT_"))(base.strided(pow_op, 2, dtype))
        for vec in (2, 4, 8):
            register(POW_VECTORIZED.format(vec=vec, functor=pow_functor))(base.vectorized(pow_op, dtype))

# ------------------------------------------------------------------------------------------ complex types
# conj() (materialised before cuSOLVER reads a conjugated view, and by torch.linalg's adjoints), and a complex
# det's product times the sign (a complex multiply whose loader casts the int64 sign).
C64, C128 = "<c8", "<c16"
CONJ_F = "ZZZNS0_16conj_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE0_clEvENKUlvE{}_clEvEUlN3c107complexI{}EEE_"


def conj(functor: bytes, x: list[np.ndarray]) -> np.ndarray:
    return np.conj(x[0])


for conj_functor, dtype in ((CONJ_F.format(10, "f"), C64), (CONJ_F.format(9, "d"), C128)):
    for vec in (2, 4, 8):
        register(base.VECTORIZED.format(vec=vec, functor=conj_functor, n=2))(base.vectorized(conj, dtype))
    register(base.STRIDED.format(unroll=2, functor=conj_functor, tail="S4_RKT_"))(base.strided(conj, 2, dtype))

register(base.UNROLLED.format(
    "NS0_13BinaryFunctorIN3c107complexIfEES5_S5_NS0_15binary_internal10MulFunctorIS5_EEEESt5arrayIPcLm3EELi4E23Trivial"
    "OffsetCalculatorILi2EjESD_ILi1EjENS0_6memory12LoadWithCastILi2EEENSG_13StoreWithCastILi1EEE"))(
    base.unrolled(base.mul, (C64,) * 3))
for scalar, dtype in (("f", C64), ("d", C128)):  # a complex product of strided operands
    register(base.STRIDED.format(unroll=2, functor=f"NS0_13BinaryFunctorIN3c107complexI{scalar}EES6_S6_NS0_15binary_"
                                 "internal10MulFunctorIS6_EEEE", tail=base.ITER))(base.strided(base.mul, 3, dtype))

# ------------------------------------------------------------------------------------------ float64
# The double-precision kernels the same checks launch in float64: a strided copy (a matrix made column-major for
# the library), det's product times the int64 sign (a multiply that casts), the sum of lstsq's squared residuals.
# (triu/tril, the strided fill and pow have their double cases above.)
F64 = "<f8"
for unroll in (2, 4):
    register(base.STRIDED.format(unroll=unroll, functor=base.DIRECT_COPY_F.format(4, "d"), tail="S4_RKT_"))(
        base.strided(base.copy, 2, F64))
register(base.UNROLLED.format(
    "NS0_13BinaryFunctorIdddNS0_15binary_internal10MulFunctorIdEEEESt5arrayIPcLm3EELi4E23TrivialOffsetCalculatorILi2"
    "EjESA_ILi1EjENS0_6memory12LoadWithCastILi2EEENSD_13StoreWithCastILi1EEE"))(base.unrolled(base.mul, (F64,) * 3))
SUM_D = "NS0_14func_wrapper_tIdZNS0_11sum_functorIdddEclERNS_14TensorIteratorEEUlddE_EE"
for nt, vec in ((512, 1), (256, 2), (128, 4)):
    register(base.REDUCE.format(nt=nt, vec=vec, scalar="d", ops=SUM_D, out="d"))(base.reduction(base.SUM, F64))

# ---------------------------------------------------------------------------------------- complex128
# A strided copy, a complex det's product times the sign (cast), and conj() of 16-byte elements, which ATen runs
# unrolled rather than vectorized.
for unroll in (2, 4):
    register(base.STRIDED.format(unroll=unroll, functor=base.DIRECT_COPY_F.format(6, "N3c107complexIdEE"),
                                 tail="S4_RKT_"))(base.strided(base.copy, 2, C128))
register(base.UNROLLED.format(
    "NS0_13BinaryFunctorIN3c107complexIdEES5_S5_NS0_15binary_internal10MulFunctorIS5_EEEESt5arrayIPcLm3EELi4E23Trivial"
    "OffsetCalculatorILi2EjESD_ILi1EjENS0_6memory12LoadWithCastILi2EEENSG_13StoreWithCastILi1EEE"))(
    base.unrolled(base.mul, (C128,) * 3))
register(base.UNROLLED.format(
    CONJ_F.format(9, "d") + "St5arrayIPcLm2EELi4E23TrivialOffsetCalculatorILi1EjESE_NS0_6memory15LoadWithoutCastENSF_"
    "16StoreWithoutCastE"))(base.unrolled(conj, (C128, C128)))
