"""cuDNN's legacy (descriptor) API on the sim device: descriptors, convolutions, batch norm.

PyTorch's BatchNorm takes this path (the *Ex calls, plain batch norm without fused activation),
and its convolutions do with TORCH_CUDNN_V8_API_DISABLED=1 (the math is the backend API's).
Statistics are per channel over N and the spatial dimensions (the spatial modes) or over N
alone (per activation); the running variance is the unbiased one, the saved inverse standard
deviation the biased one, as cuDNN documents.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from .sim_dnn import Convolution, E, GraphDnn, Tensor, fail

PER_ACTIVATION = E["CUDNN_BATCHNORM_PER_ACTIVATION"]
BN_ONLY = E["CUDNN_BATCHNORM_OPS_BN"]


@dataclass
class TensorDescriptor:
    dtype: int = E["CUDNN_DATA_FLOAT"]
    dims: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()

    def at(self, address: int, memory: Any) -> Tensor:
        if not self.dims:
            raise fail("invalid_value", "the tensor descriptor has not been set")
        return Tensor(list(self.dims), list(self.strides), self.dtype, address, memory)


@dataclass
class FilterDescriptor:
    dtype: int = E["CUDNN_DATA_FLOAT"]
    layout: int = E["CUDNN_TENSOR_NCHW"]
    dims: tuple[int, ...] = ()  # K, C, spatial... whatever the layout

    def at(self, address: int, memory: Any) -> Tensor:
        if not self.dims:
            raise fail("invalid_value", "the filter descriptor has not been set")
        if self.layout == E["CUDNN_TENSOR_NHWC"]:  # K, spatial..., C in memory
            k, c, *spatial = self.dims
            inner = packed_strides((k, *spatial, c))
            strides = (inner[0], 1, *inner[1:-1])
        else:
            strides = packed_strides(self.dims)
        return Tensor(list(self.dims), list(strides), self.dtype, address, memory)


@dataclass
class ConvolutionDescriptor:
    pad: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    mode: int = E["CUDNN_CROSS_CORRELATION"]
    groups: int = 1
    math: int = E["CUDNN_DEFAULT_MATH"]

    def convolution(self, w: FilterDescriptor) -> Convolution:
        if not self.pad:
            raise fail("invalid_value", "the convolution descriptor has not been set")
        return Convolution(list(self.stride), list(self.pad), list(self.dilation), self.mode == E["CUDNN_CONVOLUTION"],
                           w.dims[1])


# cudnnConvolution*AlgoPerf_t: algo, status, time, memory, determinism, math type, reserved; 48 bytes, as C pads it
# to its size_t's alignment (the client takes an array of them only in whole elements)
ALGO_PERF = struct.Struct("<iif4xQii12x4x")


def packed_strides(dims: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(dims):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


class LegacyDnn:
    """The legacy families of SimDnn; `self.memory` is the sim's."""

    memory: Any

    def cudnnCreateTensorDescriptor(self) -> tuple[TensorDescriptor]:
        return (TensorDescriptor(),)

    def cudnnDestroyTensorDescriptor(self, desc: TensorDescriptor) -> None:
        pass

    def cudnnSetTensorNdDescriptor(self, desc: TensorDescriptor, dtype: int, count: int, dims: bytes,
                                   strides: bytes) -> None:
        if not 0 < count <= 8:
            raise fail("invalid_value", f"{count} dimensions")
        desc.dtype, desc.dims = dtype, struct.unpack(f"<{count}i", dims)
        desc.strides = struct.unpack(f"<{count}i", strides)

    def cudnnSetTensor4dDescriptor(self, desc: TensorDescriptor, layout: int, dtype: int, n: int, c: int, h: int,
                                   w: int) -> None:
        nchw = packed_strides((n, c, h, w))
        nhwc = (h * w * c, 1, w * c, c)
        desc.dtype, desc.dims = dtype, (n, c, h, w)
        desc.strides = nhwc if layout == E["CUDNN_TENSOR_NHWC"] else nchw

    def cudnnSetTensor4dDescriptorEx(self, desc: TensorDescriptor, dtype: int, n: int, c: int, h: int, w: int,
                                     ns: int, cs: int, hs: int, ws: int) -> None:
        desc.dtype, desc.dims, desc.strides = dtype, (n, c, h, w), (ns, cs, hs, ws)

    def cudnnDeriveBNTensorDescriptor(self, derived: TensorDescriptor, x: TensorDescriptor, mode: int) -> None:
        """Per channel (or per activation): fp32 statistics for half and bfloat16 data, as cuDNN has."""
        dims = (1, x.dims[1], *(x.dims[2:] if mode == PER_ACTIVATION else [1] * (len(x.dims) - 2)))
        derived.dims, derived.strides = dims, packed_strides(dims)
        derived.dtype = x.dtype if x.dtype == E["CUDNN_DATA_DOUBLE"] else E["CUDNN_DATA_FLOAT"]

    def cudnnCreateActivationDescriptor(self) -> tuple[dict[str, Any]]:
        return ({},)

    def cudnnDestroyActivationDescriptor(self, desc: dict[str, Any]) -> None:
        pass

    def cudnnSetActivationDescriptor(self, desc: dict[str, Any], mode: int, nan: int, coef: float) -> None:
        desc.update(mode=mode, nan=nan, coef=coef)

    def cudnnGetTensorNdDescriptor(self, desc: TensorDescriptor, requested: int) -> tuple[int, int, bytes, bytes]:
        shown = max(min(requested, len(desc.dims)), 0)
        return (desc.dtype, len(desc.dims), struct.pack(f"<{shown}i", *desc.dims[:shown]),
                struct.pack(f"<{shown}i", *desc.strides[:shown]))

    def _no_workspace(self, *args: Any) -> tuple[int]:
        return (0,)

    cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize = _no_workspace
    cudnnGetBatchNormalizationTrainingExReserveSpaceSize = _no_workspace
    cudnnGetBatchNormalizationBackwardExWorkspaceSize = _no_workspace
    cudnnGetConvolutionForwardWorkspaceSize = _no_workspace
    cudnnGetConvolutionBackwardDataWorkspaceSize = _no_workspace
    cudnnGetConvolutionBackwardFilterWorkspaceSize = _no_workspace

    # ---- convolutions ----------------------------------------------------------------------------
    def cudnnCreateFilterDescriptor(self) -> tuple[FilterDescriptor]:
        return (FilterDescriptor(),)

    def cudnnSetFilterNdDescriptor(self, desc: FilterDescriptor, dtype: int, layout: int, count: int,
                                   dims: bytes) -> None:
        if not 3 <= count <= 8:
            raise fail("invalid_value", f"a filter of {count} dimensions")
        desc.dtype, desc.layout, desc.dims = dtype, layout, struct.unpack(f"<{count}i", dims)

    def cudnnGetFilterNdDescriptor(self, desc: FilterDescriptor, requested: int) -> tuple[int, int, int, bytes]:
        shown = max(min(requested, len(desc.dims)), 0)
        return desc.dtype, desc.layout, len(desc.dims), struct.pack(f"<{shown}i", *desc.dims[:shown])

    def cudnnCreateConvolutionDescriptor(self) -> tuple[ConvolutionDescriptor]:
        return (ConvolutionDescriptor(),)

    def _destroy(self, desc: Any) -> None:
        pass

    cudnnDestroyFilterDescriptor = cudnnDestroyConvolutionDescriptor = _destroy

    def cudnnSetConvolutionNdDescriptor(self, desc: ConvolutionDescriptor, count: int, pad: bytes, stride: bytes,
                                        dilation: bytes, mode: int, compute: int) -> None:
        if not 1 <= count <= 6:
            raise fail("invalid_value", f"a convolution of {count} spatial dimensions")
        desc.pad, desc.stride, desc.dilation = (struct.unpack(f"<{count}i", b) for b in (pad, stride, dilation))
        desc.mode = mode

    def cudnnSetConvolutionGroupCount(self, desc: ConvolutionDescriptor, groups: int) -> None:
        desc.groups = groups

    def cudnnSetConvolutionMathType(self, desc: ConvolutionDescriptor, math: int) -> None:
        desc.math = math

    def _algorithms(self, conv: ConvolutionDescriptor, requested: int) -> tuple[int, bytes]:
        """One algorithm, deterministic, needing no workspace: the sim has one way to convolve."""
        if requested < 1:
            raise fail("invalid_value", "requestedAlgoCount < 1")
        return 1, ALGO_PERF.pack(0, 0, 0.0, 0, E["CUDNN_DETERMINISTIC"], conv.math)

    def cudnnGetConvolutionForwardAlgorithm(self, handle: Any, x: Any, w: Any, conv: ConvolutionDescriptor,
                                            y: Any, requested: int) -> tuple[int, bytes]:
        return self._algorithms(conv, requested)

    def cudnnGetConvolutionBackwardDataAlgorithm(self, handle: Any, w: Any, dy: Any, conv: ConvolutionDescriptor,
                                                 dx: Any, requested: int) -> tuple[int, bytes]:
        return self._algorithms(conv, requested)

    def cudnnGetConvolutionBackwardFilterAlgorithm(self, handle: Any, x: Any, dy: Any, conv: ConvolutionDescriptor,
                                                   dw: Any, requested: int) -> tuple[int, bytes]:
        return self._algorithms(conv, requested)

    def cudnnFindConvolutionForwardAlgorithmEx(self, handle: Any, x: Any, x_ptr: int, w: Any, w_ptr: int,
                                               conv: ConvolutionDescriptor, y: Any, y_ptr: int, requested: int,
                                               workspace: int, workspace_bytes: int) -> tuple[int, bytes]:
        return self._algorithms(conv, requested)

    def cudnnFindConvolutionBackwardDataAlgorithmEx(self, handle: Any, w: Any, w_ptr: int, dy: Any, dy_ptr: int,
                                                    conv: ConvolutionDescriptor, dx: Any, dx_ptr: int, requested: int,
                                                    workspace: int, workspace_bytes: int) -> tuple[int, bytes]:
        return self._algorithms(conv, requested)

    def cudnnFindConvolutionBackwardFilterAlgorithmEx(self, handle: Any, x: Any, x_ptr: int, dy: Any, dy_ptr: int,
                                                      conv: ConvolutionDescriptor, dw: Any, dw_ptr: int,
                                                      requested: int, workspace: int,
                                                      workspace_bytes: int) -> tuple[int, bytes]:
        return self._algorithms(conv, requested)

    def cudnnConvolutionForward(self, handle: Any, alpha: bytes, x: TensorDescriptor, x_ptr: int,
                                w: FilterDescriptor, w_ptr: int, conv: ConvolutionDescriptor, algo: int,
                                workspace: int, workspace_bytes: int, beta: bytes, y: TensorDescriptor,
                                y_ptr: int) -> None:
        result = conv.convolution(w).forward(x.at(x_ptr, self.memory).load(), w.at(w_ptr, self.memory).load())
        self._blend(y.at(y_ptr, self.memory), result, alpha, beta)

    def cudnnConvolutionBackwardData(self, handle: Any, alpha: bytes, w: FilterDescriptor, w_ptr: int,
                                     dy: TensorDescriptor, dy_ptr: int, conv: ConvolutionDescriptor, algo: int,
                                     workspace: int, workspace_bytes: int, beta: bytes, dx: TensorDescriptor,
                                     dx_ptr: int) -> None:
        grad = conv.convolution(w).data_grad(dy.at(dy_ptr, self.memory).load(), w.at(w_ptr, self.memory).load(),
                                             list(dx.dims))
        self._blend(dx.at(dx_ptr, self.memory), grad, alpha, beta)

    def cudnnConvolutionBackwardFilter(self, handle: Any, alpha: bytes, x: TensorDescriptor, x_ptr: int,
                                       dy: TensorDescriptor, dy_ptr: int, conv: ConvolutionDescriptor, algo: int,
                                       workspace: int, workspace_bytes: int, beta: bytes, dw: FilterDescriptor,
                                       dw_ptr: int) -> None:
        grad = conv.convolution(dw).filter_grad(x.at(x_ptr, self.memory).load(), dy.at(dy_ptr, self.memory).load(),
                                                list(dw.dims))
        self._blend(dw.at(dw_ptr, self.memory), grad, alpha, beta)

    def cudnnConvolutionBackwardBias(self, handle: Any, alpha: bytes, dy: TensorDescriptor, dy_ptr: int, beta: bytes,
                                     db: TensorDescriptor, db_ptr: int) -> None:
        grad = dy.at(dy_ptr, self.memory).load()
        self._blend(db.at(db_ptr, self.memory), grad.sum(axis=(0, *range(2, grad.ndim)), keepdims=True), alpha, beta)

    # ---- batch normalization ---------------------------------------------------------------------
    def _param(self, desc: TensorDescriptor, address: int) -> Tensor:
        return desc.at(address, self.memory)

    @staticmethod
    def _axes(x: np.ndarray, mode: int) -> tuple[int, ...]:
        return (0,) if mode == PER_ACTIVATION else (0, *range(2, x.ndim))

    @staticmethod
    def _scalar(value: bytes) -> float:
        return struct.unpack("<d" if len(value) == 8 else "<f", bytes(value))[0]

    def _blend(self, out: Tensor, value: np.ndarray, alpha: bytes, beta: bytes) -> None:
        a, b = self._scalar(alpha), self._scalar(beta)
        out.store(a * value + (b * out.load() if b else 0))

    def cudnnBatchNormalizationForwardTrainingEx(
            self, handle: Any, mode: int, ops: int, alpha: bytes, beta: bytes, x_desc: TensorDescriptor, x_ptr: int,
            z_desc: Any, z_ptr: int, y_desc: TensorDescriptor, y_ptr: int, bn_desc: TensorDescriptor, scale: int,
            bias: int, factor: float, running_mean: int, running_var: int, eps: float, save_mean: int,
            save_inv_std: int, activation: Any, workspace: int, workspace_bytes: int, reserve: int,
            reserve_bytes: int) -> None:
        if ops != BN_ONLY:
            raise fail("not_supported", "batch normalization fused with activations on the sim device")
        x = x_desc.at(x_ptr, self.memory).load()
        axes = self._axes(x, mode)
        mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
        inv_std = 1.0 / np.sqrt(var + eps)
        gamma, beta_ = (self._param(bn_desc, p).load() for p in (scale, bias))
        self._blend(y_desc.at(y_ptr, self.memory), gamma * (x - mean) * inv_std + beta_, alpha, beta)
        count = x.size // mean.size
        unbiased = var * count / max(count - 1, 1)
        for address, value in ((running_mean, mean), (running_var, unbiased)):
            if address:
                running = self._param(bn_desc, address)
                running.store((1 - factor) * running.load() + factor * value.reshape(running.dims))
        for address, value in ((save_mean, mean), (save_inv_std, inv_std)):
            if address:
                self._param(bn_desc, address).store(value.reshape(bn_desc.dims))

    def cudnnBatchNormalizationForwardInference(
            self, handle: Any, mode: int, alpha: bytes, beta: bytes, x_desc: TensorDescriptor, x_ptr: int,
            y_desc: TensorDescriptor, y_ptr: int, bn_desc: TensorDescriptor, scale: int, bias: int, mean: int,
            var: int, eps: float) -> None:
        x = x_desc.at(x_ptr, self.memory).load()
        gamma, beta_, mu, sigma2 = (self._param(bn_desc, p).load() for p in (scale, bias, mean, var))
        self._blend(y_desc.at(y_ptr, self.memory), gamma * (x - mu) / np.sqrt(sigma2 + eps) + beta_, alpha, beta)

    def cudnnBatchNormalizationBackwardEx(
            self, handle: Any, mode: int, ops: int, alpha_data: bytes, beta_data: bytes, alpha_param: bytes,
            beta_param: bytes, x_desc: TensorDescriptor, x_ptr: int, y_desc: Any, y_ptr: int,
            dy_desc: TensorDescriptor, dy_ptr: int, dz_desc: Any, dz_ptr: int, dx_desc: TensorDescriptor,
            dx_ptr: int, bn_desc: TensorDescriptor, scale: int, bias: int, d_scale: int, d_bias: int, eps: float,
            saved_mean: int, saved_inv_std: int, activation: Any, workspace: int, workspace_bytes: int,
            reserve: int, reserve_bytes: int) -> None:
        if ops != BN_ONLY:
            raise fail("not_supported", "batch normalization fused with activations on the sim device")
        x, dy = x_desc.at(x_ptr, self.memory).load(), dy_desc.at(dy_ptr, self.memory).load()
        axes = self._axes(x, mode)
        if saved_mean and saved_inv_std:
            mean, inv_std = (self._param(bn_desc, p).load() for p in (saved_mean, saved_inv_std))
        else:
            mean = x.mean(axis=axes, keepdims=True)
            inv_std = 1.0 / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
        gamma = self._param(bn_desc, scale).load()
        x_hat = (x - mean) * inv_std
        count = x.size // mean.size
        g_bias = dy.sum(axis=axes, keepdims=True)
        g_scale = (dy * x_hat).sum(axis=axes, keepdims=True)
        dx = gamma * inv_std / count * (count * dy - g_bias - x_hat * g_scale)
        self._blend(dx_desc.at(dx_ptr, self.memory), dx, alpha_data, beta_data)
        for address, value in ((d_scale, g_scale), (d_bias, g_bias)):
            self._blend(self._param(bn_desc, address), value.reshape(bn_desc.dims), alpha_param, beta_param)


class SimDnn(GraphDnn, LegacyDnn):
    """cuDNN on the sim device: the backend (graph) API and the legacy descriptor API."""
