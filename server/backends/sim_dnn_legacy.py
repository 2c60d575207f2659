"""cuDNN's legacy (descriptor) API on the sim device: tensor descriptors and batch normalization.

PyTorch's BatchNorm takes this path (the *Ex calls, plain batch norm without fused activation).
Statistics are per channel over N and the spatial dimensions (the spatial modes) or over N
alone (per activation); the running variance is the unbiased one, the saved inverse standard
deviation the biased one, as cuDNN documents.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from .sim_dnn import E, Tensor, fail

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

    def _no_workspace(self, *args: Any) -> tuple[int]:
        return (0,)

    cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize = _no_workspace
    cudnnGetBatchNormalizationTrainingExReserveSpaceSize = _no_workspace
    cudnnGetBatchNormalizationBackwardExWorkspaceSize = _no_workspace

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

