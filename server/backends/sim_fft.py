"""cuFFT on the sim device: plans made and transforms run with numpy.fft over the sim's memory.

A plan is made by a cufftMakePlan* call (cufftPlan* arrive as cufftCreate and one of those): rank 1 to 3,
batched, c2c, r2c and c2r in single, double (z2z, d2z, z2d) and, through cufftXtMakePlanMany, half precision.
Layouts are cuFFT's:

- basic (inembed or onembed NULL; the strides and distances are then ignored): each side packed, its own logical
  shape (a complex side of r2c/c2r has n[-1] / 2 + 1 elements in its last dimension), one transform after the
  other; in place (the same input and output address), the real side's last dimension is padded to
  2 * (n[-1] / 2 + 1) elements, as cuFFT requires;
- advanced: element x of transform b at `b * dist + stride * (x[0] * embed[1] * ... * embed[r-1] + ... + x[r-1])`
  (embed[0] is not used).

The forward transform is exp(-2 pi i jk / n) (CUFFT_FORWARD, -1); the inverse (+1) is not normalised, as cuFFT's
is not. The input is read whole before the output is written, so in-place transforms work. Half precision data
is transformed in single precision and rounded once. The sim needs no work area: every size asked is 0.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xpuremote.protocol import mathlibs
from xpuremote.protocol.errors import CudaError

ENUMS = mathlibs.api(mathlibs.CUFFT).ENUMS
FORWARD, INVERSE = -1, 1  # CUFFT_FORWARD and CUFFT_INVERSE are macros, not enumerators
R_16F, C_16F, R_32F, C_32F, R_64F, C_64F = (ENUMS[f"CUDA_{t}"] for t in ("R_16F", "C_16F", "R_32F", "C_32F",
                                                                        "R_64F", "C_64F"))
# cudaDataType -> (one real component's storage, complex)
DATA = {R_16F: (np.dtype("<f2"), False), C_16F: (np.dtype("<f2"), True), R_32F: (np.dtype("<f4"), False),
        C_32F: (np.dtype("<f4"), True), R_64F: (np.dtype("<f8"), False), C_64F: (np.dtype("<f8"), True)}
# cudaDataType -> how its elements are read: the numpy type of one, or of one component (half complex, which numpy has
# no type for), and the components
STORAGE = {R_16F: (np.dtype("<f2"), 1), C_16F: (np.dtype("<f2"), 2), R_32F: (np.dtype("<f4"), 1),
           C_32F: (np.dtype("<c8"), 1), R_64F: (np.dtype("<f8"), 1), C_64F: (np.dtype("<c16"), 1)}
# cufftType -> (input, output) data types
TYPES = {ENUMS["CUFFT_C2C"]: (C_32F, C_32F), ENUMS["CUFFT_R2C"]: (R_32F, C_32F), ENUMS["CUFFT_C2R"]: (C_32F, R_32F),
         ENUMS["CUFFT_Z2Z"]: (C_64F, C_64F), ENUMS["CUFFT_D2Z"]: (R_64F, C_64F), ENUMS["CUFFT_Z2D"]: (C_64F, R_64F)}
PROPERTIES = (1, 2)  # cufftProperty: NVFFT_PLAN_PROPERTY_INT64_PATIENT_JIT, _MAX_NUM_HOST_THREADS (NVFFT_ names)
MAX_RANK = 3


def fft_error(status: str, detail: str) -> CudaError:
    """A failure as cuFFT reports it (CUFFT_INVALID_SIZE, ...)."""
    return CudaError(ENUMS[status], detail, "cufft")


@dataclass(frozen=True)
class Layout:
    """Where one side's elements lie: the storage sizes (outermost first), the element stride, the distance
    between transforms; all in elements of the side's data type."""

    embed: tuple[int, ...]
    stride: int
    dist: int


@functools.lru_cache(maxsize=4096)
def _dimension_strides(embed: tuple[int, ...], stride: int) -> tuple[int, ...]:
    """Element strides of each dimension of an advanced layout: dimension k steps stride * embed[k+1] * ..."""
    out = []
    for k in range(len(embed)):
        pitch = stride
        for size in embed[k + 1:]:
            pitch *= size
        out.append(pitch)
    return tuple(out)


@dataclass(frozen=True)
class Shape:
    """What a made plan transforms."""

    n: tuple[int, ...]
    batch: int
    input_type: int  # cudaDataType
    output_type: int
    input_layout: tuple[tuple[int, ...], int, int] | None  # (embed, stride, dist); None: the basic layout
    output_layout: tuple[tuple[int, ...], int, int] | None

    @property
    def kind(self) -> str:
        """c2c, r2c or c2r."""
        return {(True, True): "c2c", (False, True): "r2c", (True, False): "c2r"}[
            (DATA[self.input_type][1], DATA[self.output_type][1])]

    def logical(self, complex_side: bool) -> tuple[int, ...]:
        """The elements of one transform of a side: the complex side of r2c/c2r holds n[-1] / 2 + 1 in its last."""
        if self.kind != "c2c" and complex_side:
            return (*self.n[:-1], self.n[-1] // 2 + 1)
        return self.n


@dataclass
class Plan:
    stream: Any = None
    auto_allocation: int = 1
    work_area: int = 0
    shape: Shape | None = None
    properties: dict[int, int] = field(default_factory=dict)


class SimFft:
    """The cuFFT families the call table forwards, over the sim's `memory`."""

    def __init__(self, memory: Any) -> None:
        self.memory = memory

    # ---- plans ----------------------------------------------------------------------------------
    def cufftCreate(self) -> tuple[Plan]:
        return (Plan(),)

    def cufftDestroy(self, plan: Plan) -> None:
        pass

    def cufftSetStream(self, plan: Plan, stream: Any) -> None:
        plan.stream = stream

    def cufftSetAutoAllocation(self, plan: Plan, auto: int) -> None:
        plan.auto_allocation = auto

    def cufftSetWorkArea(self, plan: Plan, area: int) -> None:
        plan.work_area = area

    def cufftSetPlanPropertyInt64(self, plan: Plan, prop: int, value: int) -> None:
        plan.properties[_property(prop)] = value

    def cufftGetPlanPropertyInt64(self, plan: Plan, prop: int) -> tuple[int]:
        return (plan.properties.get(_property(prop), 0),)

    def cufftResetPlanProperty(self, plan: Plan, prop: int) -> None:
        plan.properties.pop(_property(prop), None)

    def cufftMakePlan1d(self, plan: Plan, nx: int, kind: int, batch: int) -> tuple[int]:
        return self.make(plan, (nx,), None, 0, 0, None, 0, 0, *_types(kind), batch)

    def cufftMakePlan2d(self, plan: Plan, nx: int, ny: int, kind: int) -> tuple[int]:
        return self.make(plan, (nx, ny), None, 0, 0, None, 0, 0, *_types(kind), 1)

    def cufftMakePlan3d(self, plan: Plan, nx: int, ny: int, nz: int, kind: int) -> tuple[int]:
        return self.make(plan, (nx, ny, nz), None, 0, 0, None, 0, 0, *_types(kind), 1)

    def cufftMakePlanMany(self, plan: Plan, rank: int, n: bytes, inembed: bytes | None, istride: int, idist: int,
                          onembed: bytes | None, ostride: int, odist: int, kind: int, batch: int) -> tuple[int]:
        return self.make(plan, _sizes(n, rank, "i"), _ints(inembed, rank, "i"), istride, idist,
                         _ints(onembed, rank, "i"), ostride, odist, *_types(kind), batch)

    def cufftMakePlanMany64(self, plan: Plan, rank: int, n: bytes, inembed: bytes | None, istride: int, idist: int,
                            onembed: bytes | None, ostride: int, odist: int, kind: int, batch: int) -> tuple[int]:
        return self.make(plan, _sizes(n, rank, "q"), _ints(inembed, rank, "q"), istride, idist,
                         _ints(onembed, rank, "q"), ostride, odist, *_types(kind), batch)

    def cufftXtMakePlanMany(self, plan: Plan, rank: int, n: bytes, inembed: bytes | None, istride: int, idist: int,
                            input_type: int, onembed: bytes | None, ostride: int, odist: int, output_type: int,
                            batch: int, execution_type: int) -> tuple[int]:
        _check_execution_type(input_type, output_type, execution_type)
        return self.make(plan, _sizes(n, rank, "q"), _ints(inembed, rank, "q"), istride, idist,
                         _ints(onembed, rank, "q"), ostride, odist, input_type, output_type, batch)

    def make(self, plan: Plan, n: tuple[int, ...], inembed: tuple[int, ...] | None, istride: int, idist: int,
             onembed: tuple[int, ...] | None, ostride: int, odist: int, input_type: int, output_type: int,
             batch: int) -> tuple[int]:
        """A plan made (any earlier making replaced); its work area's size, none on the sim."""
        shape = _shape(n, inembed, istride, idist, onembed, ostride, odist, input_type, output_type, batch)
        plan.shape = shape
        return (0,)

    # ---- sizes: the sim needs no work area ----------------------------------------------------------
    def cufftGetSize(self, plan: Plan) -> tuple[int]:
        if plan.shape is None:
            raise fft_error("CUFFT_INVALID_PLAN", "cufftGetSize of a plan not made")
        return (0,)

    def cufftGetSize1d(self, plan: Plan, nx: int, kind: int, batch: int) -> tuple[int]:
        _shape((nx,), None, 0, 0, None, 0, 0, *_types(kind), batch)
        return (0,)

    def cufftGetSize2d(self, plan: Plan, nx: int, ny: int, kind: int) -> tuple[int]:
        _shape((nx, ny), None, 0, 0, None, 0, 0, *_types(kind), 1)
        return (0,)

    def cufftGetSize3d(self, plan: Plan, nx: int, ny: int, nz: int, kind: int) -> tuple[int]:
        _shape((nx, ny, nz), None, 0, 0, None, 0, 0, *_types(kind), 1)
        return (0,)

    def cufftGetSizeMany(self, plan: Plan, rank: int, n: bytes, inembed: bytes | None, istride: int, idist: int,
                         onembed: bytes | None, ostride: int, odist: int, kind: int, batch: int) -> tuple[int]:
        _shape(_sizes(n, rank, "i"), _ints(inembed, rank, "i"), istride, idist, _ints(onembed, rank, "i"), ostride,
               odist, *_types(kind), batch)
        return (0,)

    def cufftGetSizeMany64(self, plan: Plan, rank: int, n: bytes, inembed: bytes | None, istride: int, idist: int,
                           onembed: bytes | None, ostride: int, odist: int, kind: int, batch: int) -> tuple[int]:
        _shape(_sizes(n, rank, "q"), _ints(inembed, rank, "q"), istride, idist, _ints(onembed, rank, "q"), ostride,
               odist, *_types(kind), batch)
        return (0,)

    def cufftXtGetSizeMany(self, plan: Plan, rank: int, n: bytes, inembed: bytes | None, istride: int, idist: int,
                           input_type: int, onembed: bytes | None, ostride: int, odist: int, output_type: int,
                           batch: int, execution_type: int) -> tuple[int]:
        _check_execution_type(input_type, output_type, execution_type)
        _shape(_sizes(n, rank, "q"), _ints(inembed, rank, "q"), istride, idist, _ints(onembed, rank, "q"), ostride,
               odist, input_type, output_type, batch)
        return (0,)

    def cufftEstimate1d(self, nx: int, kind: int, batch: int) -> tuple[int]:
        return self.cufftGetSize1d(Plan(), nx, kind, batch)

    def cufftEstimate2d(self, nx: int, ny: int, kind: int) -> tuple[int]:
        return self.cufftGetSize2d(Plan(), nx, ny, kind)

    def cufftEstimate3d(self, nx: int, ny: int, nz: int, kind: int) -> tuple[int]:
        return self.cufftGetSize3d(Plan(), nx, ny, nz, kind)

    def cufftEstimateMany(self, rank: int, n: bytes, inembed: bytes | None, istride: int, idist: int,
                          onembed: bytes | None, ostride: int, odist: int, kind: int, batch: int) -> tuple[int]:
        return self.cufftGetSizeMany(Plan(), rank, n, inembed, istride, idist, onembed, ostride, odist, kind, batch)

    # ---- transforms -------------------------------------------------------------------------------
    def cufftXtExec(self, plan: Plan, idata: int, odata: int, direction: int) -> None:
        self.execute(plan, idata, odata, direction)

    def cufftExecC2C(self, plan: Plan, idata: int, odata: int, direction: int) -> None:
        self.typed("CUFFT_C2C", plan, idata, odata, direction)

    def cufftExecZ2Z(self, plan: Plan, idata: int, odata: int, direction: int) -> None:
        self.typed("CUFFT_Z2Z", plan, idata, odata, direction)

    def cufftExecR2C(self, plan: Plan, idata: int, odata: int) -> None:
        self.typed("CUFFT_R2C", plan, idata, odata, FORWARD)

    def cufftExecD2Z(self, plan: Plan, idata: int, odata: int) -> None:
        self.typed("CUFFT_D2Z", plan, idata, odata, FORWARD)

    def cufftExecC2R(self, plan: Plan, idata: int, odata: int) -> None:
        self.typed("CUFFT_C2R", plan, idata, odata, INVERSE)

    def cufftExecZ2D(self, plan: Plan, idata: int, odata: int) -> None:
        self.typed("CUFFT_Z2D", plan, idata, odata, INVERSE)

    def typed(self, kind: str, plan: Plan, idata: int, odata: int, direction: int) -> None:
        """cufftExec<type>: the plan must be of that type (cufftXtExec takes any)."""
        shape = _made(plan)
        if (shape.input_type, shape.output_type) != TYPES[ENUMS[kind]]:
            raise fft_error("CUFFT_INVALID_VALUE", f"a {kind} execution of a plan made for another transform type")
        self.execute(plan, idata, odata, direction)

    def execute(self, plan: Plan, idata: int, odata: int, direction: int) -> None:
        shape = _made(plan)
        if shape.kind == "c2c" and direction not in (FORWARD, INVERSE):
            raise fft_error("CUFFT_INVALID_VALUE", f"direction {direction}: CUFFT_FORWARD (-1) or CUFFT_INVERSE (1)")
        if not idata or not odata:
            raise fft_error("CUFFT_INVALID_VALUE", "a NULL input or output")
        in_place = idata == odata
        values = self.load(idata, shape.input_type, shape.logical(DATA[shape.input_type][1]),
                           _layout(shape, True, in_place), shape.batch)
        self.store(odata, shape.output_type, transform(values, shape, direction), _layout(shape, False, in_place))

    # ---- memory as batches of transforms ------------------------------------------------------------
    def elements(self, address: int, data_type: int, logical: tuple[int, ...], layout: Layout, batch: int,
                 writable: bool = False) -> np.ndarray:
        """(batch, *logical) view of the elements (half complex ones as (..., 2) components)."""
        storage, comps = STORAGE[data_type]
        pitches = _dimension_strides(layout.embed, layout.stride)
        last = (batch - 1) * layout.dist + sum((size - 1) * p for size, p in zip(logical, pitches))
        item = storage.itemsize * comps
        memory = self.memory.view(address, (last + 1) * item)
        shape, strides = (batch, *logical), (layout.dist * item, *(p * item for p in pitches))
        if comps == 2:
            shape, strides = (*shape, 2), (*strides, storage.itemsize)
        view = np.ndarray(shape, storage, memory, 0, strides)  # as_strided's work, without its cost per call
        view.flags.writeable = writable
        return view

    def load(self, address: int, data_type: int, logical: tuple[int, ...], layout: Layout, batch: int) -> np.ndarray:
        """The elements in single or double precision (half precision widened). A view where no widening is needed:
        numpy.fft returns a new array, so an in-place transform reads its input whole before the output is written."""
        raw = self.elements(address, data_type, logical, layout, batch)
        if STORAGE[data_type][1] == 2:
            return raw[..., 0].astype(np.float32) + 1j * raw[..., 1].astype(np.float32)
        return raw.astype(np.float32) if raw.dtype.itemsize == 2 else raw

    def store(self, address: int, data_type: int, values: np.ndarray, layout: Layout) -> None:
        out = self.elements(address, data_type, values.shape[1:], layout, values.shape[0], writable=True)
        storage, comps = STORAGE[data_type]
        if comps == 2:
            out[..., 0], out[..., 1] = values.real.astype(storage), values.imag.astype(storage)
        else:
            out[...] = values.astype(storage, copy=False)


def transform(values: np.ndarray, shape: Shape, direction: int) -> np.ndarray:
    """One batch of transforms over all but the first axis: forward exp(-2 pi i jk / n), inverse not normalised."""
    if values.ndim == 2:  # one dimension: numpy's 1-D functions cost less per call
        if shape.kind == "r2c":
            return np.fft.rfft(values)
        if shape.kind == "c2r":
            return np.fft.irfft(values, shape.n[0], norm="forward")
        return np.fft.fft(values) if direction == FORWARD else np.fft.ifft(values, norm="forward")
    axes = tuple(range(1, values.ndim))
    if shape.kind == "r2c":
        return np.fft.rfftn(values, axes=axes)
    if shape.kind == "c2r":
        return np.fft.irfftn(values, s=shape.n, axes=axes, norm="forward")
    if direction == FORWARD:
        return np.fft.fftn(values, axes=axes)
    return np.fft.ifftn(values, axes=axes, norm="forward")


@functools.lru_cache(maxsize=4096)
def _layout(shape: Shape, input_side: bool, in_place: bool) -> Layout:
    """A side's layout as given, or the basic one (a real side in place padded as cuFFT requires)."""
    given = shape.input_layout if input_side else shape.output_layout
    if given is not None:
        return Layout(*given)
    data_type = shape.input_type if input_side else shape.output_type
    storage = shape.logical(DATA[data_type][1])
    if in_place and shape.kind != "c2c" and not DATA[data_type][1]:
        storage = (*shape.n[:-1], 2 * (shape.n[-1] // 2 + 1))
    return Layout(storage, 1, math.prod(storage))


def _shape(n: tuple[int, ...], inembed: tuple[int, ...] | None, istride: int, idist: int,
           onembed: tuple[int, ...] | None, ostride: int, odist: int, input_type: int, output_type: int,
           batch: int) -> Shape:
    """A plan's transforms, checked as cuFFT checks them."""
    if not 1 <= len(n) <= MAX_RANK:
        raise fft_error("CUFFT_INVALID_SIZE", f"rank {len(n)}: 1 to {MAX_RANK}")
    if min(n) < 1 or batch < 1:
        raise fft_error("CUFFT_INVALID_SIZE", f"sizes {n}, batch {batch}")
    if DATA[input_type][0].itemsize == 2 and any(size & (size - 1) for size in n):
        raise fft_error("CUFFT_NOT_SUPPORTED", f"half precision sizes {n}: powers of 2 only")
    if inembed is None or onembed is None:  # either NULL: the basic layout for both, strides ignored
        return Shape(n, batch, input_type, output_type, None, None)
    layouts = []
    for embed, stride, dist in ((inembed, istride, idist), (onembed, ostride, odist)):
        if min(embed[1:], default=1) < 1 or stride < 1 or dist < 0:
            raise fft_error("CUFFT_INVALID_VALUE", f"layout embed {embed}, stride {stride}, distance {dist}")
        layouts.append((embed, stride, dist))
    return Shape(n, batch, input_type, output_type, *layouts)


def _types(kind: int) -> tuple[int, int]:
    if kind not in TYPES:
        raise fft_error("CUFFT_INVALID_TYPE", f"cufftType {kind:#x}")
    return TYPES[kind]


def _check_execution_type(input_type: int, output_type: int, execution_type: int) -> None:
    """cufftXtMakePlanMany's types: complex or real of one precision on each side, not both real, and the
    execution type the complex one of that precision."""
    sides = [DATA.get(input_type), DATA.get(output_type)]
    execution = DATA.get(execution_type)
    if None in sides or execution is None or not (sides[0][1] or sides[1][1]) \
            or sides[0][0] != sides[1][0] or execution != (sides[0][0], True):
        raise fft_error("CUFFT_INVALID_TYPE", f"input, output and execution types {input_type}, {output_type}, "
                        f"{execution_type}")


def _sizes(data: bytes | None, rank: int, fmt: str) -> tuple[int, ...]:
    """The transform's sizes: `n`, which may not be NULL."""
    if data is None:
        raise fft_error("CUFFT_INVALID_VALUE", "n is NULL")
    return _ints(data, rank, fmt)


def _ints(data: bytes | None, rank: int, fmt: str) -> Any:
    """An array of `rank` ints (`i`) or long longs (`q`) as the call sent it, or None for NULL."""
    if data is None:
        return None
    if not 1 <= rank <= MAX_RANK:
        raise fft_error("CUFFT_INVALID_SIZE", f"rank {rank}: 1 to {MAX_RANK}")
    return struct.unpack(f"<{rank}{fmt}", bytes(data))


def _made(plan: Plan) -> Shape:
    if plan.shape is None:
        raise fft_error("CUFFT_INVALID_PLAN", "a plan not made (cufftCreate without a cufftMakePlan*)")
    return plan.shape


def _property(prop: int) -> int:
    if prop not in PROPERTIES:
        raise fft_error("CUFFT_INVALID_VALUE", f"plan property {prop}")
    return prop
