"""Host implementations (numpy) of the ATen CUDA kernels that torch.linalg launches around cuSOLVER's and cuBLAS's
calls in tests/programs/torch_linalg_check.py: triu/tril (Cholesky's and QR's factors), the strided fill of an
identity's diagonal (inv), and the any() of the `info` results PyTorch checks.

Loaded beside tests/torch_sim_kernels.py (XPU_SIM_KERNELS=...,torch_sim_kernels.py,torch_sim_kernels_linalg.py),
whose decoders it uses: it loads its own copy of that file (the sim enters neither in sys.modules).
"""

import importlib.util
import struct
from pathlib import Path

import numpy as np

from xpuremote.server.backends.sim_kernels import Launch, register

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


TRIU_TRIL = "_ZN2at6native16triu_tril_kernelI{scalar}{index}Lb{upper}ELi2ELb{inplace}EEEvNS_4cuda6detail10TensorInfo" \
    "IT_T0_EENS4_IKS5_S6_EEllS6_"
for upper in (0, 1):
    for inplace in (0, 1):
        register(TRIU_TRIL.format(scalar="f", index="i", upper=upper, inplace=inplace))(
            triu_tril("<f4", "i", bool(upper), bool(inplace)))

# ----------------------------------------------------------------------------------- fill of a diagonal


def fill_strided(k: Launch) -> None:
    """elementwise_kernel<128, 2>(N, lambda{OffsetCalculator<1>, data, FillFunctor<float>{value}}): a strided
    fill (inv's identity: its diagonal set to 1)."""
    count_param, lambda_param = k.kernel.params
    count = struct.unpack_from("<i", k.params, count_param.offset)[0]
    offsets = base.OffsetCalculator.decode(k.params, lambda_param.offset, 1).offsets(count)[0]
    data_at = lambda_param.offset + base.align(base.OffsetCalculator.nbytes(1), 8)
    out = struct.unpack_from("<Q", k.params, data_at)[0]
    value = struct.unpack_from("<f", k.params, data_at + 8)[0]
    base.scatter(k, out, offsets, np.full(count, value, "<f4"))


register("_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastINS0_11FillFunctorIfEEEEvRNS_18"
         "TensorIteratorBaseERKT_EUliE_EEviT1_")(fill_strided)

# ------------------------------------------------------------------------------------ any() of the infos
# reduce_kernel of or_kernel_cuda over int32 `info` results, to bool (PyTorch's check that all succeeded)
ANY_INT_OPS = "NS0_14func_wrapper_tIbZZZNS0_14or_kernel_cudaERNS_14TensorIteratorEENKUlvE_clEvENKUlvE1_clEvEUlbiE_EE"
# its accumulator (the lambda's first argument) is a bool, which places the ReduceOp's fields
ANY_INT = base.ReduceKind("x", base.identity, lambda values: values.any(axis=1), np.dtype(base.BOOL), splits=False)
for nt, vec in ((512, 1), (256, 2), (128, 4)):
    register(base.REDUCE.format(nt=nt, vec=vec, scalar="i", ops=ANY_INT_OPS, out="b"))(
        base.reduction(ANY_INT, "<i4", base.BOOL))
