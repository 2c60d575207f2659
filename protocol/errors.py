"""CUresult codes: names, messages, and the exception that carries one across a boundary."""

from __future__ import annotations

import json
from pathlib import Path

from .cuda_api import ENUMS, ERROR_DOCS

# cuGetErrorString's texts as NVIDIA's driver answers them, recorded on a GPU (bench/driver_answers.py
# --error-strings writes the file); a code the record lacks gets cuda.h's doc comment instead
DRIVER_TEXTS: dict[str, str] = json.loads(Path(__file__).with_name("driver_error_strings.json").read_text())["strings"]

NAMES: dict[int, str] = {
    v: k for k, v in ENUMS.items() if k == "CUDA_SUCCESS" or k.startswith("CUDA_ERROR_")
}
CODES: dict[str, int] = {name: code for code, name in NAMES.items()}

SUCCESS = 0
INVALID_VALUE = CODES["CUDA_ERROR_INVALID_VALUE"]
OUT_OF_MEMORY = CODES["CUDA_ERROR_OUT_OF_MEMORY"]
NOT_INITIALIZED = CODES["CUDA_ERROR_NOT_INITIALIZED"]
DEINITIALIZED = CODES["CUDA_ERROR_DEINITIALIZED"]
NO_DEVICE = CODES["CUDA_ERROR_NO_DEVICE"]
INVALID_DEVICE = CODES["CUDA_ERROR_INVALID_DEVICE"]
INVALID_IMAGE = CODES["CUDA_ERROR_INVALID_IMAGE"]
INVALID_CONTEXT = CODES["CUDA_ERROR_INVALID_CONTEXT"]
NO_BINARY_FOR_GPU = CODES["CUDA_ERROR_NO_BINARY_FOR_GPU"]
INVALID_HANDLE = CODES["CUDA_ERROR_INVALID_HANDLE"]
NOT_FOUND = CODES["CUDA_ERROR_NOT_FOUND"]
NOT_READY = CODES["CUDA_ERROR_NOT_READY"]
ILLEGAL_ADDRESS = CODES["CUDA_ERROR_ILLEGAL_ADDRESS"]
LAUNCH_FAILED = CODES["CUDA_ERROR_LAUNCH_FAILED"]
NOT_SUPPORTED = CODES["CUDA_ERROR_NOT_SUPPORTED"]
NOT_PERMITTED = CODES["CUDA_ERROR_NOT_PERMITTED"]
INVALID_PTX = CODES["CUDA_ERROR_INVALID_PTX"]
UNSUPPORTED_PTX_VERSION = CODES["CUDA_ERROR_UNSUPPORTED_PTX_VERSION"]
SYSTEM_DRIVER_MISMATCH = CODES["CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"]
CONTEXT_IS_DESTROYED = CODES["CUDA_ERROR_CONTEXT_IS_DESTROYED"]
PRIMARY_CONTEXT_ACTIVE = CODES["CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE"]
PEER_ACCESS_UNSUPPORTED = CODES["CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"]
OPERATING_SYSTEM = CODES["CUDA_ERROR_OPERATING_SYSTEM"]
UNKNOWN = CODES["CUDA_ERROR_UNKNOWN"]
ILLEGAL_STATE = CODES["CUDA_ERROR_ILLEGAL_STATE"]
CAPTURE_UNSUPPORTED = CODES["CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"]
CAPTURE_INVALIDATED = CODES["CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"]
CAPTURE_UNMATCHED = CODES["CUDA_ERROR_STREAM_CAPTURE_UNMATCHED"]
CAPTURE_UNJOINED = CODES["CUDA_ERROR_STREAM_CAPTURE_UNJOINED"]
CAPTURE_ISOLATION = CODES["CUDA_ERROR_STREAM_CAPTURE_ISOLATION"]
CAPTURE_IMPLICIT = CODES["CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"]
CAPTURE_WRONG_THREAD = CODES["CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"]
INVALID_CLUSTER_SIZE = CODES["CUDA_ERROR_INVALID_CLUSTER_SIZE"]


def name(code: int) -> str:
    return NAMES.get(code, f"CUDA_ERROR_{code}")


def message(code: int) -> str:
    return DRIVER_TEXTS.get(name(code)) or ERROR_DOCS.get(name(code), f"unrecognized error code {code}")


class CudaError(Exception):
    """A call failed with `code`; `detail` says why, for the log. The code is a CUresult, or a
    status of the math library `library` names."""

    def __init__(self, code: int, detail: str = "", library: str = "cuda") -> None:
        super().__init__(f"{status_name(code, library)}: {detail or (message(code) if library == 'cuda' else '')}")
        self.code = code
        self.detail = detail
        self.library = library


# ---- the math libraries' status codes --------------------------------------------------------
# What a CUresult means to a library caller, and what a library's failure means to a driver
# caller (an asynchronous GEMM that failed surfaces at a later synchronous driver call).
_OUTCOME_OF_CUDA = {OUT_OF_MEMORY: "alloc_failed", INVALID_VALUE: "invalid_value", INVALID_HANDLE: "invalid_value",
                    NOT_SUPPORTED: "not_supported", NOT_INITIALIZED: "not_initialized",
                    DEINITIALIZED: "not_initialized", UNKNOWN: "internal"}
# the CUresult that says the same as a library's outcome: a kernel that failed is the only LAUNCH_FAILED
_CUDA_OF_OUTCOME = {"not_supported": NOT_SUPPORTED, "invalid_value": INVALID_VALUE, "alloc_failed": OUT_OF_MEMORY,
                    "execution_failed": LAUNCH_FAILED, "not_initialized": NOT_INITIALIZED, "internal": UNKNOWN}
# a status named under several outcomes (cuBLAS's NOT_SUPPORTED is its version_mismatch too, NCCL's
# ncclUnhandledCudaError two) is read as the first of these it stands for
_OUTCOMES = ("not_supported", "invalid_value", "alloc_failed", "execution_failed", "not_initialized", "internal")
# what another call's failure is to a library call: what the library says when a CUDA call under it fails
_FOREIGN = {"not_supported": "not_supported", "alloc_failed": "alloc_failed", "not_initialized": "not_initialized"}


def status_name(code: int, library: str = "cuda") -> str:
    """CUDA_ERROR_NOT_SUPPORTED, CUBLAS_STATUS_NOT_SUPPORTED, ...: the enumerator's own name."""
    if library == "cuda":
        return name(code)
    from . import mathlibs

    lib = mathlibs.BY_NAME[library]
    found = mathlibs.api(lib).STATUSES.get(code)  # the status type's own enumerators (cuFFT's CUFFT_ has others)
    return found or f"{lib.status['success'].removesuffix('SUCCESS')}{code}"


def outcome_of(code: int, library: str) -> str:
    """The generic outcome (`not_supported`, `execution_failed`, ...) that `code` of `library` stands for."""
    if library == "cuda":
        return _OUTCOME_OF_CUDA.get(code, "execution_failed")
    from . import mathlibs

    lib = mathlibs.BY_NAME[library]
    return next((o for o in _OUTCOMES if o in lib.status and mathlibs.status_code(lib, o) == code), "internal")


def _same_status(library: str, other: str) -> bool:
    """Whether the two share one status type (cuBLAS and cuBLASLt share cublasStatus_t)."""
    if library == other:
        return True
    if "cuda" in (library, other):
        return False
    from . import mathlibs

    return mathlibs.BY_NAME[library].status is mathlibs.BY_NAME[other].status


def status_for(exc: CudaError, library: str) -> int:
    """`exc`, a failure of the call itself, as a status of `library` ("cuda" for a CUresult)."""
    if _same_status(exc.library, library):
        return exc.code
    if library == "cuda":
        return _CUDA_OF_OUTCOME[outcome_of(exc.code, exc.library)]
    from . import mathlibs

    outcome = _OUTCOME_OF_CUDA.get(exc.code, "execution_failed") if exc.library == "cuda" else "execution_failed"
    return mathlibs.status_code(mathlibs.BY_NAME[library], outcome)


def deferred_status(code: int, failed: str, library: str) -> int:
    """A failure of an earlier asynchronous call (`code`, a status of the library `failed`) as a later call of
    `library` reports it: a driver call gets the CUresult that says what happened, a call of the same library the
    status itself, a call of another library what it says when a CUDA call under it fails (NOT_SUPPORTED, an
    allocation that failed, else EXECUTION_FAILED): another call's bad argument is not this call's."""
    if _same_status(failed, library):
        return code
    outcome = outcome_of(code, failed)
    if library == "cuda":
        return _CUDA_OF_OUTCOME[outcome]
    from . import mathlibs

    return mathlibs.status_code(mathlibs.BY_NAME[library], _FOREIGN.get(outcome, "execution_failed"))


def library_error(library: str, outcome: str, detail: str) -> CudaError:
    """A failure in a library's own terms, e.g. library_error("cublas", "not_supported", why)."""
    from . import mathlibs

    return CudaError(mathlibs.status_code(mathlibs.BY_NAME[library], outcome), detail, library)
