"""The math libraries xpuremote forwards at their own API: cuBLAS, cuBLASLt and cuDNN.

The application's calls into `libcublas.so.13`, `libcublasLt.so.13` and `libcudnn.so.9` reach
xpuremote's replacements of them (preloaded by xpu-run), whose entry points are generated from
NVIDIA's headers (`protocol/generate.py`) into the same call table as the driver's
(`protocol/calls.py`). The server calls the real library on its GPU (cuda backend) or does the
math with numpy (sim backend).

What the headers cannot say lives here, once: each library's file names, the headers that
declare it, its status codes, the opaque types that are handles, and its SPEC rows in the
driver's format. Two annotations are the libraries' own:

- `name=scalar` / `name=scalar:TYPE`: alpha, beta and the like. In host pointer mode the
  value travels (its size from the pointee type, or from the cudaDataType_t /
  cublasComputeType_t parameter TYPE); in device pointer mode the device address does.
  A handle as TYPE means the scale type of that descriptor: the one a cuBLASLt matmul
  descriptor was created with; for a cuDNN tensor descriptor, double for double data and
  float otherwise (cuDNN's scalars are always host values). A cudnnDataType_t as TYPE means
  one element of that type.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from types import ModuleType

from . import abi


@dataclass(frozen=True)
class Library:
    name: str  # module and file stem: cublas, cublasLt, cudnn
    soname: str  # also the ELF version node its symbols carry
    header: str  # the header that declares (or includes) all its functions
    prefix: str  # its functions' names start with this ...
    exclude: tuple[str, ...]  # ... and not with these
    status_type: str
    version_macros: tuple[str, str, str]  # major, minor, patch
    handles: tuple[str, ...]  # opaque types that the header does not declare as `struct X *`
    # generic outcome -> the library's status enumerator
    status: dict[str, str]
    spec: str
    # prefixes of enumerators named in mixed case (ncclSum, ncclFloat32), which the header's enums hold too
    enum_prefixes: tuple[str, ...] = ()
    # folders of other packages' libraries that import from this one (PyTorch's torch/lib imports NCCL), read
    # beside NVIDIA's wheels for what the replacement must export (protocol/linked.py): globs under site-packages
    importers: tuple[str, ...] = ()


CUBLAS_STATUS = {
    "success": "CUBLAS_STATUS_SUCCESS", "not_initialized": "CUBLAS_STATUS_NOT_INITIALIZED",
    "alloc_failed": "CUBLAS_STATUS_ALLOC_FAILED", "invalid_value": "CUBLAS_STATUS_INVALID_VALUE",
    "not_supported": "CUBLAS_STATUS_NOT_SUPPORTED", "execution_failed": "CUBLAS_STATUS_EXECUTION_FAILED",
    "internal": "CUBLAS_STATUS_INTERNAL_ERROR", "version_mismatch": "CUBLAS_STATUS_NOT_SUPPORTED",
}

CUBLAS = Library(
    name="cublas", soname="libcublas.so.13", header="cublas_v2.h", prefix="cublas",
    exclude=("cublasLt", "cublasXt"), status_type="cublasStatus_t",
    version_macros=("CUBLAS_VER_MAJOR", "CUBLAS_VER_MINOR", "CUBLAS_VER_PATCH"), handles=(),
    status=CUBLAS_STATUS,
    spec="""
# handles: client-made; the client also keeps what the local answers need
cublasCreate                shadow
cublasDestroy               async
cublasGetVersion            local   version=out
cublasGetProperty           local   value=out
cublasGetCudartVersion      local
cublasSetStream             async
cublasGetStream             local
cublasSetWorkspace          async
cublasSetMathMode           async
cublasGetMathMode           local   mode=out
cublasSetPointerMode        async
cublasGetPointerMode        local   mode=out
cublasSetAtomicsMode        async
cublasGetAtomicsMode        local   mode=out
cublasSetSmCountTarget      async
cublasGetSmCountTarget      local   smCountTarget=out
# GEMM: enqueued GPU work
cublasSgemm                 async   alpha=scalar beta=scalar
cublasDgemm                 async   alpha=scalar beta=scalar
cublasSgemmStridedBatched   async   alpha=scalar beta=scalar
cublasDgemmStridedBatched   async   alpha=scalar beta=scalar
cublasSgemmEx               async   alpha=scalar beta=scalar
cublasGemmEx                async   alpha=scalar:computeType beta=scalar:computeType
cublasGemmStridedBatchedEx  async   alpha=scalar:computeType beta=scalar:computeType
cublasSgemv                 async   alpha=scalar beta=scalar
cublasDgemv                 async   alpha=scalar beta=scalar
# the rest of what PyTorch's libtorch_cuda imports (the sim computes only the real GEMMs above;
# on a GPU all of these run): complex GEMMs, triangular solves, and dot products, whose result
# is a device address (PyTorch uses device pointer mode for them; host mode is refused)
cublasCgemm                 async   alpha=scalar beta=scalar
cublasZgemm                 async   alpha=scalar beta=scalar
cublasCgemmStridedBatched   async   alpha=scalar beta=scalar
cublasZgemmStridedBatched   async   alpha=scalar beta=scalar
cublasCgemv                 async   alpha=scalar beta=scalar
cublasZgemv                 async   alpha=scalar beta=scalar
cublasStrsm                 async   alpha=scalar
cublasDtrsm                 async   alpha=scalar
cublasCtrsm                 async   alpha=scalar
cublasZtrsm                 async   alpha=scalar
cublasSdot                  async
cublasDdot                  async
cublasCdotu                 async
cublasCdotc                 async
cublasZdotu                 async
cublasZdotc                 async
cublasDotEx                 async
# torch.linalg's batched solvers: arrays of device pointers; `info` is the caller's memory where
# cuBLAS documents a host pointer (getrs, geqrf, gels), so those wait for it
cublasSgetrfBatched         async
cublasDgetrfBatched         async
cublasCgetrfBatched         async
cublasZgetrfBatched         async
cublasSgetrsBatched         sync    info=out
cublasDgetrsBatched         sync    info=out
cublasCgetrsBatched         sync    info=out
cublasZgetrsBatched         sync    info=out
cublasSgeqrfBatched         sync    info=out
cublasDgeqrfBatched         sync    info=out
cublasCgeqrfBatched         sync    info=out
cublasZgeqrfBatched         sync    info=out
cublasSgelsBatched          sync    info=out
cublasDgelsBatched          sync    info=out
cublasCgelsBatched          sync    info=out
cublasZgelsBatched          sync    info=out
cublasStrsmBatched          async   alpha=scalar
cublasDtrsmBatched          async   alpha=scalar
cublasCtrsmBatched          async   alpha=scalar
cublasZtrsmBatched          async   alpha=scalar
""",
)

CUBLASLT = Library(
    name="cublasLt", soname="libcublasLt.so.13", header="cublasLt.h", prefix="cublasLt", exclude=(),
    status_type="cublasStatus_t",
    version_macros=("CUBLAS_VER_MAJOR", "CUBLAS_VER_MINOR", "CUBLAS_VER_PATCH"),
    handles=("cublasLtMatmulDesc_t", "cublasLtMatrixLayout_t", "cublasLtMatmulPreference_t",
             "cublasLtMatrixTransformDesc_t"),
    status=CUBLAS_STATUS,
    spec="""
cublasLtCreate                          shadow
cublasLtDestroy                         async
cublasLtGetVersion                      local
cublasLtGetCudartVersion                local
cublasLtGetProperty                     local   value=out
cublasLtMatmulDescCreate                shadow
cublasLtMatmulDescDestroy               async
cublasLtMatmulDescSetAttribute          async   buf=in:sizeInBytes
cublasLtMatmulDescGetAttribute          sync    buf=out:sizeInBytes sizeWritten=out
cublasLtMatrixLayoutCreate              shadow
cublasLtMatrixLayoutDestroy             async
cublasLtMatrixLayoutSetAttribute        async   buf=in:sizeInBytes
cublasLtMatrixLayoutGetAttribute        sync    buf=out:sizeInBytes sizeWritten=out
cublasLtMatmulPreferenceCreate          shadow
cublasLtMatmulPreferenceDestroy         async
cublasLtMatmulPreferenceSetAttribute    async   buf=in:sizeInBytes
cublasLtMatmulPreferenceGetAttribute    sync    buf=out:sizeInBytes sizeWritten=out
cublasLtMatmulAlgoGetHeuristic          sync    heuristicResultsArray=out:requestedAlgoCount*each returnAlgoCount=out
cublasLtMatmulAlgoInit                  sync    algo=out
cublasLtMatmulAlgoCheck                 sync    algo=in result=out
cublasLtMatmulAlgoConfigGetAttribute    sync    algo=in buf=out:sizeInBytes sizeWritten=out
cublasLtMatmulAlgoConfigSetAttribute    sync    algo=inout buf=in:sizeInBytes
cublasLtMatmul                          async   alpha=scalar:computeDesc beta=scalar:computeDesc algo=in
""",
)

CUDNN = Library(
    name="cudnn", soname="libcudnn.so.9", header="cudnn.h", prefix="cudnn", exclude=(),
    status_type="cudnnStatus_t", version_macros=("CUDNN_MAJOR", "CUDNN_MINOR", "CUDNN_PATCHLEVEL"),
    handles=("cudnnBackendDescriptor_t",),
    status={
        "success": "CUDNN_STATUS_SUCCESS", "not_initialized": "CUDNN_STATUS_NOT_INITIALIZED",
        "alloc_failed": "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
        "invalid_value": "CUDNN_STATUS_BAD_PARAM", "not_supported": "CUDNN_STATUS_NOT_SUPPORTED",
        "execution_failed": "CUDNN_STATUS_EXECUTION_FAILED", "internal": "CUDNN_STATUS_INTERNAL_ERROR",
        "version_mismatch": "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH",
    },
    spec="""
cudnnGetVersion             local
cudnnGetCudartVersion       local
cudnnGetProperty            local   value=out
cudnnGetLastErrorString     local   message=out:max_size
cudnnCreate                 shadow
cudnnDestroy                async
cudnnSetStream              async
cudnnGetStream              local
# the backend (graph) API: descriptors are client-made; finalizing can fail (that is how a
# caller learns an engine does not fit), so it waits for the answer
cudnnBackendCreateDescriptor    shadow
cudnnBackendDestroyDescriptor   async
cudnnBackendSetAttribute        async   arrayOfElements=in:*
cudnnBackendGetAttribute        sync    elementCount=out arrayOfElements=out:*
cudnnBackendFinalize            sync
cudnnBackendExecute             async
# the legacy API's descriptors and batch normalization (PyTorch's BatchNorm takes this path)
cudnnCreateTensorDescriptor         shadow
cudnnDestroyTensorDescriptor        async
cudnnSetTensorNdDescriptor          async   dimA=in:nbDims*4 strideA=in:nbDims*4
cudnnSetTensor4dDescriptor          async
cudnnSetTensor4dDescriptorEx        async
cudnnDeriveBNTensorDescriptor       async
cudnnCreateActivationDescriptor     shadow
cudnnDestroyActivationDescriptor    async
cudnnSetActivationDescriptor        async
cudnnBatchNormalizationForwardTrainingEx            async   alpha=scalar:xDesc beta=scalar:xDesc
cudnnBatchNormalizationBackwardEx   async   alphaDataDiff=scalar:xDesc betaDataDiff=scalar:xDesc \
                                            alphaParamDiff=scalar:xDesc betaParamDiff=scalar:xDesc
cudnnBatchNormalizationForwardInference             async   alpha=scalar:xDesc beta=scalar:xDesc
cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize    sync    sizeInBytes=out
cudnnGetBatchNormalizationTrainingExReserveSpaceSize        sync    sizeInBytes=out
cudnnGetBatchNormalizationBackwardExWorkspaceSize           sync    sizeInBytes=out
# the legacy convolutions (PyTorch's path with TORCH_CUDNN_V8_API_DISABLED=1)
cudnnCreateFilterDescriptor         shadow
cudnnDestroyFilterDescriptor        async
cudnnSetFilterNdDescriptor          async   filterDimA=in:nbDims*4
cudnnGetFilterNdDescriptor          sync    dataType=out format=out nbDims=out filterDimA=out:nbDimsRequested*4
cudnnGetTensorNdDescriptor          sync    dataType=out nbDims=out dimA=out:nbDimsRequested*4 \
                                            strideA=out:nbDimsRequested*4
cudnnCreateConvolutionDescriptor    shadow
cudnnDestroyConvolutionDescriptor   async
cudnnSetConvolutionNdDescriptor     async   padA=in:arrayLength*4 filterStrideA=in:arrayLength*4 \
                                            dilationA=in:arrayLength*4
cudnnSetConvolutionGroupCount       async
cudnnSetConvolutionMathType         async
cudnnGetConvolutionForwardAlgorithm             sync    returnedAlgoCount=out perfResults=out:requestedAlgoCount*each
cudnnGetConvolutionBackwardDataAlgorithm        sync    returnedAlgoCount=out perfResults=out:requestedAlgoCount*each
cudnnGetConvolutionBackwardFilterAlgorithm      sync    returnedAlgoCount=out perfResults=out:requestedAlgoCount*each
cudnnFindConvolutionForwardAlgorithmEx          sync    returnedAlgoCount=out perfResults=out:requestedAlgoCount*each
cudnnFindConvolutionBackwardDataAlgorithmEx     sync    returnedAlgoCount=out perfResults=out:requestedAlgoCount*each
cudnnFindConvolutionBackwardFilterAlgorithmEx   sync    returnedAlgoCount=out perfResults=out:requestedAlgoCount*each
cudnnGetConvolutionForwardWorkspaceSize         sync    sizeInBytes=out
cudnnGetConvolutionBackwardDataWorkspaceSize    sync    sizeInBytes=out
cudnnGetConvolutionBackwardFilterWorkspaceSize  sync    sizeInBytes=out
cudnnConvolutionForward             async   alpha=scalar:xDesc beta=scalar:xDesc
cudnnConvolutionBackwardData        async   alpha=scalar:dyDesc beta=scalar:dyDesc
cudnnConvolutionBackwardFilter      async   alpha=scalar:xDesc beta=scalar:xDesc
cudnnConvolutionBackwardBias        async   alpha=scalar:dyDesc beta=scalar:dyDesc
cudnnConvolutionBiasActivationForward   async   alpha1=scalar:xDesc alpha2=scalar:xDesc
# RNNs, dropout, pooling, CTC loss (the _v8 form, whose arrays are on the device) and the spatial
# transformer: forwarded for a GPU server; the sim computes none of them
cudnnCreateRNNDescriptor            shadow
cudnnDestroyRNNDescriptor           async
cudnnSetRNNDescriptor               async
cudnnCreateRNNDataDescriptor        shadow
cudnnDestroyRNNDataDescriptor       async
cudnnSetRNNDataDescriptor           async   seqLengthArray=in:batchSize*4 paddingFill=scalar:dataType
cudnnGetRNNTempSpaceSizes           sync    workSpaceSize=out reserveSpaceSize=out
cudnnGetRNNWeightSpaceSize          sync    weightSpaceSize=out
cudnnGetRNNWeightParams             sync    mAddr=out bAddr=out
cudnnRNNForward                     async
cudnnRNNBackwardData                async
cudnnRNNBackwardWeights             async
cudnnCreateDropoutDescriptor        shadow
cudnnDestroyDropoutDescriptor       async
cudnnDropoutGetStatesSize           sync    sizeInBytes=out
cudnnSetDropoutDescriptor           async
cudnnRestoreDropoutDescriptor       async
cudnnCreatePoolingDescriptor        shadow
cudnnDestroyPoolingDescriptor       async
cudnnSetPooling2dDescriptor         async
cudnnPoolingForward                 async   alpha=scalar:xDesc beta=scalar:xDesc
cudnnCreateCTCLossDescriptor        shadow
cudnnDestroyCTCLossDescriptor       async
cudnnSetCTCLossDescriptorEx         async
cudnnSetCTCLossDescriptor           async
cudnnGetCTCLossWorkspaceSize        sync    sizeInBytes=out
cudnnCTCLoss                        async
cudnnCreateSpatialTransformerDescriptor     shadow
cudnnDestroySpatialTransformerDescriptor    async
cudnnSetSpatialTransformerNdDescriptor      async   dimA=in:nbDims*4
cudnnSpatialTfGridGeneratorForward  async
cudnnSpatialTfGridGeneratorBackward async
cudnnSpatialTfSamplerForward        async   alpha=scalar:xDesc beta=scalar:xDesc
cudnnSpatialTfSamplerBackward       async   alpha=scalar:xDesc beta=scalar:xDesc alphaDgrid=scalar:xDesc \
                                            betaDgrid=scalar:xDesc
""",
)

# cuSPARSE: the generic API's handles and descriptors are client-made; a descriptor's creation carries the device
# addresses and sizes it names (the server keeps them: the sim computes from them). alpha/beta follow the handle's
# pointer mode; buffer-size queries wait for the answer; the operations are queued on the handle's stream.
CUSPARSE = Library(
    name="cusparse", soname="libcusparse.so.12", header="cusparse.h", prefix="cusparse", exclude=("cusparseLt",),
    status_type="cusparseStatus_t",
    version_macros=("CUSPARSE_VER_MAJOR", "CUSPARSE_VER_MINOR", "CUSPARSE_VER_PATCH"),
    # the const descriptors (`struct X const *`), which the handle pattern does not read
    handles=("cusparseConstSpVecDescr_t", "cusparseConstDnVecDescr_t", "cusparseConstSpMatDescr_t",
             "cusparseConstDnMatDescr_t"),
    status={
        "success": "CUSPARSE_STATUS_SUCCESS", "not_initialized": "CUSPARSE_STATUS_NOT_INITIALIZED",
        "alloc_failed": "CUSPARSE_STATUS_ALLOC_FAILED", "invalid_value": "CUSPARSE_STATUS_INVALID_VALUE",
        "not_supported": "CUSPARSE_STATUS_NOT_SUPPORTED", "execution_failed": "CUSPARSE_STATUS_EXECUTION_FAILED",
        "internal": "CUSPARSE_STATUS_INTERNAL_ERROR", "version_mismatch": "CUSPARSE_STATUS_NOT_SUPPORTED",
    },
    spec="""
cusparseCreate                  shadow
cusparseDestroy                 async
cusparseGetVersion              local   version=out
cusparseGetProperty             local   value=out
cusparseSetStream               async
cusparseGetStream               local
cusparseSetPointerMode          async
cusparseGetPointerMode          local   mode=out
# the generic API's descriptors: made with the device addresses and sizes they name
cusparseCreateCsr               shadow
cusparseCreateConstCsr          shadow
cusparseCreateCsc               shadow
cusparseCreateConstCsc          shadow
cusparseCreateCoo               shadow
cusparseCreateConstCoo          shadow
cusparseDestroySpMat            async
cusparseCsrSetPointers          async
cusparseCscSetPointers          async
cusparseCooSetPointers          async
cusparseCsrSetStridedBatch      async
cusparseCooSetStridedBatch      async
cusparseSpMatSetAttribute       async   data=in:dataSize
cusparseSpMatGetSize            sync    rows=out cols=out nnz=out
cusparseCreateDnMat             shadow
cusparseCreateConstDnMat        shadow
cusparseDestroyDnMat            async
cusparseDnMatSetStridedBatch    async
cusparseCreateDnVec             shadow
cusparseCreateConstDnVec        shadow
cusparseDestroyDnVec            async
# the operations: sizes wait, the work is queued on the handle's stream
cusparseSpMM_bufferSize         sync    alpha=scalar:computeType beta=scalar:computeType bufferSize=out
cusparseSpMM_preprocess         async   alpha=scalar:computeType beta=scalar:computeType
cusparseSpMM                    async   alpha=scalar:computeType beta=scalar:computeType
cusparseSpMV_bufferSize         sync    alpha=scalar:computeType beta=scalar:computeType bufferSize=out
cusparseSpMV                    async   alpha=scalar:computeType beta=scalar:computeType
cusparseSDDMM_bufferSize        sync    alpha=scalar:computeType beta=scalar:computeType bufferSize=out
cusparseSDDMM_preprocess        async   alpha=scalar:computeType beta=scalar:computeType
cusparseSDDMM                   async   alpha=scalar:computeType beta=scalar:computeType
# sparse times sparse: each step's buffer size is asked with a NULL buffer, then given with it (in and out)
cusparseSpGEMM_createDescr      shadow
cusparseSpGEMM_destroyDescr     async
cusparseSpGEMM_workEstimation   sync    alpha=scalar:computeType beta=scalar:computeType bufferSize1=inout
cusparseSpGEMM_compute          sync    alpha=scalar:computeType beta=scalar:computeType bufferSize2=inout
cusparseSpGEMM_copy             async   alpha=scalar:computeType beta=scalar:computeType
# triangular solves (torch.linalg.solve_triangular of a sparse CSR matrix)
cusparseSpSV_createDescr        shadow
cusparseSpSV_destroyDescr       async
cusparseSpSV_bufferSize         sync    alpha=scalar:computeType bufferSize=out
cusparseSpSV_analysis           async   alpha=scalar:computeType
cusparseSpSV_solve              async   alpha=scalar:computeType
cusparseSpSM_createDescr        shadow
cusparseSpSM_destroyDescr       async
cusparseSpSM_bufferSize         sync    alpha=scalar:computeType bufferSize=out
cusparseSpSM_analysis           async   alpha=scalar:computeType
cusparseSpSM_solve              async   alpha=scalar:computeType
# the legacy API PyTorch still calls: BSR products and solves, CSR addition, index conversion and sorting. Typed
# scalars are host values in host pointer mode; an `int *` result that the pointer mode places is answered in
# host mode only (client/mathlibs.py). Forwarded for a GPU server; the sim computes only Xcoo2csr.
cusparseCreateMatDescr          shadow
cusparseDestroyMatDescr         async
cusparseSetMatType              async
cusparseSetMatFillMode          async
cusparseSetMatDiagType          async
cusparseSetMatIndexBase         async
cusparseXcoo2csr                async
cusparseCreateIdentityPermutation   async
cusparseXcoosort_bufferSizeExt  sync    pBufferSizeInBytes=out
cusparseXcoosortByRow           async
cusparseXcsrsort_bufferSizeExt  sync    pBufferSizeInBytes=out
cusparseXcsrsort                async
cusparseScsrgeam2_bufferSizeExt sync    alpha=scalar beta=scalar pBufferSizeInBytes=out
cusparseDcsrgeam2_bufferSizeExt sync    alpha=scalar beta=scalar pBufferSizeInBytes=out
cusparseCcsrgeam2_bufferSizeExt sync    alpha=scalar beta=scalar pBufferSizeInBytes=out
cusparseZcsrgeam2_bufferSizeExt sync    alpha=scalar beta=scalar pBufferSizeInBytes=out
cusparseXcsrgeam2Nnz            sync    nnzTotalDevHostPtr=out
cusparseScsrgeam2               async   alpha=scalar beta=scalar
cusparseDcsrgeam2               async   alpha=scalar beta=scalar
cusparseCcsrgeam2               async   alpha=scalar beta=scalar
cusparseZcsrgeam2               async   alpha=scalar beta=scalar
cusparseSbsrmm                  async   alpha=scalar beta=scalar
cusparseDbsrmm                  async   alpha=scalar beta=scalar
cusparseCbsrmm                  async   alpha=scalar beta=scalar
cusparseZbsrmm                  async   alpha=scalar beta=scalar
cusparseSbsrmv                  async   alpha=scalar beta=scalar
cusparseDbsrmv                  async   alpha=scalar beta=scalar
cusparseCbsrmv                  async   alpha=scalar beta=scalar
cusparseZbsrmv                  async   alpha=scalar beta=scalar
cusparseCreateBsrsv2Info        shadow
cusparseDestroyBsrsv2Info       async
cusparseCreateBsrsm2Info        shadow
cusparseDestroyBsrsm2Info       async
cusparseSbsrsv2_bufferSize      sync    pBufferSizeInBytes=out
cusparseDbsrsv2_bufferSize      sync    pBufferSizeInBytes=out
cusparseCbsrsv2_bufferSize      sync    pBufferSizeInBytes=out
cusparseZbsrsv2_bufferSize      sync    pBufferSizeInBytes=out
cusparseSbsrsv2_analysis        async
cusparseDbsrsv2_analysis        async
cusparseCbsrsv2_analysis        async
cusparseZbsrsv2_analysis        async
cusparseSbsrsv2_solve           async   alpha=scalar
cusparseDbsrsv2_solve           async   alpha=scalar
cusparseCbsrsv2_solve           async   alpha=scalar
cusparseZbsrsv2_solve           async   alpha=scalar
cusparseXbsrsv2_zeroPivot       sync    position=out
cusparseSbsrsm2_bufferSize      sync    pBufferSizeInBytes=out
cusparseDbsrsm2_bufferSize      sync    pBufferSizeInBytes=out
cusparseCbsrsm2_bufferSize      sync    pBufferSizeInBytes=out
cusparseZbsrsm2_bufferSize      sync    pBufferSizeInBytes=out
cusparseSbsrsm2_analysis        async
cusparseDbsrsm2_analysis        async
cusparseCbsrsm2_analysis        async
cusparseZbsrsm2_analysis        async
cusparseSbsrsm2_solve           async   alpha=scalar
cusparseDbsrsm2_solve           async   alpha=scalar
cusparseCbsrsm2_solve           async   alpha=scalar
cusparseZbsrsm2_solve           async   alpha=scalar
cusparseXbsrsm2_zeroPivot       sync    position=out
""",
)

# cuSPARSE's const descriptors are its descriptors: a handle made as one is named as the other
CUSPARSE_HANDLE_FAMILIES = {f"cusparseConst{kind}Descr_t": f"cusparse{kind}Descr_t"
                            for kind in ("SpVec", "DnVec", "SpMat", "DnMat")}

# cuSOLVER (dense): the handle, the 64-bit API's parameters and the Jacobi methods' settings are client-made.
# Workspace-size queries wait for the answer (the client keeps each, keyed by the arguments' content); the
# factorizations are queued on the handle's stream and write their `info` into device memory, as the library
# does. The generic API's host workspace is the caller's scratch memory: its bytes travel with the call (none,
# for what PyTorch calls) and the server gives the library a writable copy.
def _each_type(rows: str) -> str:
    """`rows` once per data type: {T} -> S, D, C, Z; {sy}/{or} -> he/un for the complex types."""
    out = []
    for t in "SDCZ":
        complex_ = t in "CZ"
        out.append(rows.replace("{T}", t).replace("{sy}", "he" if complex_ else "sy")
                   .replace("{or}", "un" if complex_ else "or"))
    return "\n".join(out)


_HOST_WORKSPACE = "bufferOnHost=in?:workspaceInBytesOnHost"
_SIZES_64 = "workspaceInBytesOnDevice=out workspaceInBytesOnHost=out"

CUSOLVER = Library(
    name="cusolver", soname="libcusolver.so.12", header="cusolverDn.h", prefix="cusolver",
    exclude=("cusolverSp", "cusolverRf", "cusolverMg"), status_type="cusolverStatus_t",
    version_macros=("CUSOLVER_VER_MAJOR", "CUSOLVER_VER_MINOR", "CUSOLVER_VER_PATCH"), handles=(),
    status={
        "success": "CUSOLVER_STATUS_SUCCESS", "not_initialized": "CUSOLVER_STATUS_NOT_INITIALIZED",
        "alloc_failed": "CUSOLVER_STATUS_ALLOC_FAILED", "invalid_value": "CUSOLVER_STATUS_INVALID_VALUE",
        "not_supported": "CUSOLVER_STATUS_NOT_SUPPORTED", "execution_failed": "CUSOLVER_STATUS_EXECUTION_FAILED",
        "internal": "CUSOLVER_STATUS_INTERNAL_ERROR", "version_mismatch": "CUSOLVER_STATUS_NOT_SUPPORTED",
    },
    spec=f"""
cusolverGetProperty             local   value=out
cusolverGetVersion              local   version=out
cusolverDnCreate                shadow
cusolverDnDestroy               async
cusolverDnSetStream             async
cusolverDnGetStream             local
cusolverDnCreateParams          shadow
cusolverDnDestroyParams         async
cusolverDnSetAdvOptions         async
cusolverDnCreateSyevjInfo       shadow
cusolverDnDestroySyevjInfo      async
cusolverDnXsyevjSetTolerance    async
cusolverDnXsyevjSetMaxSweeps    async
cusolverDnXsyevjSetSortEig      async
cusolverDnXsyevjGetResidual     sync    residual=out
cusolverDnXsyevjGetSweeps       sync    executed_sweeps=out
cusolverDnCreateGesvdjInfo      shadow
cusolverDnDestroyGesvdjInfo     async
cusolverDnXgesvdjSetTolerance   async
cusolverDnXgesvdjSetMaxSweeps   async
cusolverDnXgesvdjSetSortEig     async
cusolverDnXgesvdjGetResidual    sync    residual=out
cusolverDnXgesvdjGetSweeps      sync    executed_sweeps=out
# the 64-bit generic API: data types as cudaDataType_t; device and host workspaces
cusolverDnXgetrf_bufferSize     sync    {_SIZES_64}
cusolverDnXgetrf                async   {_HOST_WORKSPACE}
cusolverDnXgetrs                async
cusolverDnXpotrf_bufferSize     sync    {_SIZES_64}
cusolverDnXpotrf                async   {_HOST_WORKSPACE}
cusolverDnXpotrs                async
cusolverDnXgeqrf_bufferSize     sync    {_SIZES_64}
cusolverDnXgeqrf                async   {_HOST_WORKSPACE}
cusolverDnXsyevd_bufferSize     sync    {_SIZES_64}
cusolverDnXsyevd                async   {_HOST_WORKSPACE}
cusolverDnXsyevBatched_bufferSize   sync    {_SIZES_64}
cusolverDnXsyevBatched          async   {_HOST_WORKSPACE}
cusolverDnXgesvd_bufferSize     sync    {_SIZES_64}
cusolverDnXgesvd                async   {_HOST_WORKSPACE}
cusolverDnXgeev_bufferSize      sync    {_SIZES_64}
cusolverDnXgeev                 async   {_HOST_WORKSPACE}
cusolverDnXsytrs_bufferSize     sync    {_SIZES_64}
cusolverDnXsytrs                async   {_HOST_WORKSPACE}
# the typed (legacy) API that PyTorch imports, for each data type; gesvdaStridedBatched's residual norms are
# the caller's host memory, so it waits
""" + _each_type("""
cusolverDn{T}getrf_bufferSize       sync    Lwork=out
cusolverDn{T}getrf                  async
cusolverDn{T}getrs                  async
cusolverDn{T}potrf_bufferSize       sync    Lwork=out
cusolverDn{T}potrf                  async
cusolverDn{T}potrs                  async
cusolverDn{T}potrfBatched           async
cusolverDn{T}potrsBatched           async
cusolverDn{T}potri_bufferSize       sync    lwork=out
cusolverDn{T}potri                  async
cusolverDn{T}geqrf_bufferSize       sync    lwork=out
cusolverDn{T}geqrf                  async
cusolverDn{T}{or}gqr_bufferSize     sync    lwork=out
cusolverDn{T}{or}gqr                async
cusolverDn{T}{or}mqr_bufferSize     sync    lwork=out
cusolverDn{T}{or}mqr                async
cusolverDn{T}{sy}evd_bufferSize     sync    lwork=out
cusolverDn{T}{sy}evd                async
cusolverDn{T}{sy}evjBatched_bufferSize  sync    lwork=out
cusolverDn{T}{sy}evjBatched         async
cusolverDn{T}gesvd_bufferSize       sync    lwork=out
cusolverDn{T}gesvd                  async
cusolverDn{T}gesvdj_bufferSize      sync    lwork=out
cusolverDn{T}gesvdj                 async
cusolverDn{T}gesvdjBatched_bufferSize   sync    lwork=out
cusolverDn{T}gesvdjBatched          async
cusolverDn{T}gesvdaStridedBatched_bufferSize    sync    lwork=out
cusolverDn{T}gesvdaStridedBatched   sync    h_R_nrmF=out?:batchSize*8
cusolverDn{T}sytrf_bufferSize       sync    lwork=out
cusolverDn{T}sytrf                  async
"""),
)

CUFFT = Library(
    name="cufft", soname="libcufft.so.12", header="cufftXt.h", prefix="cufft", exclude=(),
    status_type="cufftResult", version_macros=("CUFFT_VER_MAJOR", "CUFFT_VER_MINOR", "CUFFT_VER_PATCH"),
    handles=("cufftHandle",),  # an int: the client makes it, as it makes pointer handles (shadow)
    status={
        "success": "CUFFT_SUCCESS", "not_initialized": "CUFFT_SETUP_FAILED", "alloc_failed": "CUFFT_ALLOC_FAILED",
        "invalid_value": "CUFFT_INVALID_VALUE", "not_supported": "CUFFT_NOT_SUPPORTED",
        "execution_failed": "CUFFT_EXEC_FAILED", "internal": "CUFFT_INTERNAL_ERROR",
        "version_mismatch": "CUFFT_NOT_SUPPORTED",
    },
    spec="""
cufftGetVersion             local   version=out
cufftGetProperty            local   value=out
# plans: client-made; cufftPlan* are made by the client as cufftCreate and the matching cufftMakePlan*
cufftCreate                 shadow
cufftPlan1d                 shadow
cufftPlan2d                 shadow
cufftPlan3d                 shadow
cufftPlanMany               shadow  n=in:rank*4 inembed=in:rank*4 onembed=in:rank*4
cufftDestroy                async
cufftSetStream              async
cufftSetAutoAllocation      async
cufftSetWorkArea            async
cufftSetPlanPropertyInt64   async
cufftResetPlanProperty      async
cufftGetPlanPropertyInt64   sync    returnPtrValue=out
# making a plan can fail (a size or layout the library refuses) and says the work area's size: it waits
cufftMakePlan1d             sync    workSize=out
cufftMakePlan2d             sync    workSize=out
cufftMakePlan3d             sync    workSize=out
cufftMakePlanMany           sync    n=in:rank*4 inembed=in:rank*4 onembed=in:rank*4 workSize=out
cufftMakePlanMany64         sync    n=in:rank*8 inembed=in:rank*8 onembed=in:rank*8 workSize=out
cufftXtMakePlanMany         sync    n=in:rank*8 inembed=in:rank*8 onembed=in:rank*8 workSize=out
cufftGetSize                sync    workSize=out
cufftGetSize1d              sync    workSize=out
cufftGetSize2d              sync    workSize=out
cufftGetSize3d              sync    workSize=out
cufftGetSizeMany            sync    n=in:rank*4 inembed=in:rank*4 onembed=in:rank*4 workArea=out
cufftGetSizeMany64          sync    n=in:rank*8 inembed=in:rank*8 onembed=in:rank*8 workSize=out
cufftXtGetSizeMany          sync    n=in:rank*8 inembed=in:rank*8 onembed=in:rank*8 workSize=out
cufftEstimate1d             sync    workSize=out
cufftEstimate2d             sync    workSize=out
cufftEstimate3d             sync    workSize=out
cufftEstimateMany           sync    n=in:rank*4 inembed=in:rank*4 onembed=in:rank*4 workSize=out
# transforms: enqueued GPU work on device memory
cufftXtExec                 async
cufftExecC2C                async
cufftExecR2C                async
cufftExecC2R                async
cufftExecZ2Z                async
cufftExecD2Z                async
cufftExecZ2D                async
""",
)

# NCCL: communicators live on the server, so collective traffic goes between the servers' GPUs, never over the
# client's link (docs/distributed.md). ncclGetUniqueId is made there; its 128 bytes travel as the application
# passes them. Initialising a communicator waits for its peers (the server times out a rank whose peers never
# come); collectives are queued on the stream like kernels, their errors surface at the next wait. A call with
# no row here is refused with ncclInvalidUsage, named once on stderr.
NCCL = Library(
    name="nccl", soname="libnccl.so.2", header="nccl.h", prefix="nccl", exclude=(), status_type="ncclResult_t",
    version_macros=("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"), handles=(),
    status={
        "success": "ncclSuccess", "not_initialized": "ncclUnhandledCudaError", "alloc_failed": "ncclSystemError",
        "invalid_value": "ncclInvalidArgument", "not_supported": "ncclInvalidUsage",
        "execution_failed": "ncclUnhandledCudaError", "internal": "ncclInternalError",
        "version_mismatch": "ncclInvalidUsage", "remote": "ncclRemoteError", "timeout": "ncclTimeout",
    },
    enum_prefixes=("nccl",),
    importers=("torch/lib",),
    spec="""
ncclGetVersion              local   version=out
ncclGetUniqueId             sync    uniqueId=out
# the unique id is passed by value: the client sends its bytes; the config's host strings are not sent
ncclCommInitRank            sync
ncclCommInitRankConfig      sync    config=in
ncclCommFinalize            sync
ncclCommDestroy             sync
ncclCommAbort               sync
# a split waits for the parent's ranks, as a creation waits for its peers (color NCCL_SPLIT_NOCOLOR: no new one)
ncclCommSplit               sync    config=in
# answered by the client from what it learnt at the communicator's creation (asked once of a split's)
ncclCommGetAsyncError       local   asyncError=out
ncclCommCount               sync    count=out
ncclCommCuDevice            sync    device=out
ncclCommUserRank            sync    rank=out
# buffer registration (PyTorch registers each segment of its allocator): the server's handle travels back
ncclCommRegister            sync    handle=out
ncclCommDeregister          async
# collectives and point-to-point: queued on the stream, as kernels are
ncclGroupStart              async
ncclGroupEnd                async
ncclAllReduce               async
ncclBroadcast               async
ncclBcast                   async
ncclReduce                  async
ncclAllGather               async
ncclReduceScatter           async
ncclAlltoAll                async
ncclGather                  async
ncclScatter                 async
ncclSend                    async
ncclRecv                    async
""",
)

# cuRAND (the host API): a generator is client-made, its settings and generations are queued on the generator's
# stream and write device memory. The client keeps each generator's type and answers what cuRAND refuses at once
# (a normal count that is odd, a type's wrong call: client/curand.py). Host generators (curandCreateGeneratorHost)
# write host memory the server cannot reach, and the discrete distributions are device memory for the device API's
# kernels: neither is forwarded (no row), each refused with CURAND_STATUS_ARCH_MISMATCH, said once.
CURAND = Library(
    name="curand", soname="libcurand.so.10", header="curand.h", prefix="curand", exclude=(),
    status_type="curandStatus_t", version_macros=("CURAND_VER_MAJOR", "CURAND_VER_MINOR", "CURAND_VER_PATCH"),
    handles=(),
    status={
        "success": "CURAND_STATUS_SUCCESS", "not_initialized": "CURAND_STATUS_NOT_INITIALIZED",
        "alloc_failed": "CURAND_STATUS_ALLOCATION_FAILED", "invalid_value": "CURAND_STATUS_OUT_OF_RANGE",
        "not_supported": "CURAND_STATUS_ARCH_MISMATCH", "execution_failed": "CURAND_STATUS_LAUNCH_FAILURE",
        "internal": "CURAND_STATUS_INTERNAL_ERROR", "version_mismatch": "CURAND_STATUS_VERSION_MISMATCH",
        "type_error": "CURAND_STATUS_TYPE_ERROR", "length_not_multiple": "CURAND_STATUS_LENGTH_NOT_MULTIPLE",
        "initialization_failed": "CURAND_STATUS_INITIALIZATION_FAILED",
    },
    spec="""
curandGetVersion                        local   version=out
curandGetProperty                       local   value=out
curandCreateGenerator                   shadow
curandDestroyGenerator                  async
curandSetStream                         async
curandSetPseudoRandomGeneratorSeed      async
curandSetGeneratorOffset                async
curandSetGeneratorOrdering              async
curandSetQuasiRandomGeneratorDimensions async
curandGenerateSeeds                     async
# generations: queued on the generator's stream, into device memory
curandGenerate                          async
curandGenerateLongLong                  async
curandGenerateUniform                   async
curandGenerateUniformDouble             async
curandGenerateNormal                    async
curandGenerateNormalDouble              async
curandGenerateLogNormal                 async
curandGenerateLogNormalDouble           async
curandGeneratePoisson                   async
curandGenerateBinomial                  async
""",
)

# cuSPARSELt: its handle, matrix descriptors, algorithm selections and plans are structs of 512 bytes the caller
# allocates (`cusparseLtHandle_t` is no pointer), passed by address. Each Init writes into the caller's struct the
# client's handle of the object it makes on the server; every other call reads the handle from the struct it is
# given (a pointer to one of these types is a handle by reference: protocol/calls.py), so a copy of the struct
# names the same object. The server keeps one 512-byte struct of NVIDIA's per object (client/cusparselt.py says
# how a struct initialised again is handled: its object is replaced, not leaked). Sizes wait; pruning, compression
# and the products are queued on the stream they name (alpha and beta are host floats).
CUSPARSELT = Library(
    name="cusparseLt", soname="libcusparseLt.so.0", header="cusparseLt.h", prefix="cusparseLt", exclude=(),
    status_type="cusparseStatus_t",
    version_macros=("CUSPARSELT_VER_MAJOR", "CUSPARSELT_VER_MINOR", "CUSPARSELT_VER_PATCH"),
    handles=("cusparseLtHandle_t", "cusparseLtMatDescriptor_t", "cusparseLtMatmulDescriptor_t",
             "cusparseLtMatmulAlgSelection_t", "cusparseLtMatmulPlan_t"),
    status=CUSPARSE.status,
    enum_prefixes=("CUSPARSE_",),  # cuSPARSE's orders and operations, and cuSPARSELt's compute types
    spec="""
cusparseLtInit                      shadow
cusparseLtDestroy                   async
cusparseLtGetVersion                local   version=out
cusparseLtGetProperty               local   value=out
# matrix descriptors (dense and 2:4 structured) and their batch settings
cusparseLtDenseDescriptorInit       shadow
cusparseLtStructuredDescriptorInit  shadow
cusparseLtMatDescriptorDestroy      async
cusparseLtMatDescSetAttribute       async   matmulDescr=in data=in:dataSize
cusparseLtMatDescGetAttribute       sync    data=out:dataSize
# the product's descriptor (cuSPARSELt has no destroy for it), its algorithm and its plan
cusparseLtMatmulDescriptorInit      shadow
cusparseLtMatmulDescSetAttribute    async   matmulDescr=in data=in:dataSize
cusparseLtMatmulDescGetAttribute    sync    data=out:dataSize
cusparseLtMatmulAlgSelectionInit    shadow
cusparseLtMatmulAlgSelectionDestroy async
cusparseLtMatmulAlgSetAttribute     async   algSelection=in data=in:dataSize
cusparseLtMatmulAlgGetAttribute     sync    data=out:dataSize
cusparseLtMatmulPlanInit            shadow
cusparseLtMatmulPlanDestroy         async
cusparseLtMatmulGetWorkspace        sync    workspaceSize=out
# the product: queued on the streams it names (an array of them); the search runs it and settles the plan's
# algorithm, so it waits
cusparseLtMatmul                    async   alpha=in:4 beta=in:4 streams=in?:numStreams*8
cusparseLtMatmulSearch              sync    plan=in alpha=in:4 beta=in:4 streams=in?:numStreams*8
# pruning (a check writes its verdict into device memory) and compression, queued on their stream
cusparseLtSpMMAPrune                async
cusparseLtSpMMAPruneCheck           async
cusparseLtSpMMAPrune2               async
cusparseLtSpMMAPruneCheck2          async
cusparseLtSpMMACompressedSize       sync    compressedSize=out compressedBufferSize=out
cusparseLtSpMMACompressedSize2      sync    compressedSize=out compressedBufferSize=out
cusparseLtSpMMACompress             async
cusparseLtSpMMACompress2            async
""",
)

# cuSPARSELt's enumerators that its header leaves implicit (counted from 0 in the header's order), which the
# generated ENUMS, read from `NAME = value`, do not hold
CUSPARSELT_IMPLICIT = {
    "CUSPARSELT_SPARSITY_50_PERCENT": 0, "CUSPARSELT_MAT_NUM_BATCHES": 0, "CUSPARSELT_MAT_BATCH_STRIDE": 1,
    "CUSPARSE_COMPUTE_32I": 0, "CUSPARSE_COMPUTE_16F": 1, "CUSPARSE_COMPUTE_32F": 2,
    **{f"CUSPARSELT_MATMUL_{name}": i for i, name in enumerate((
        "ACTIVATION_RELU", "ACTIVATION_RELU_UPPERBOUND", "ACTIVATION_RELU_THRESHOLD", "ACTIVATION_GELU",
        "ACTIVATION_GELU_SCALING", "ALPHA_VECTOR_SCALING", "BETA_VECTOR_SCALING", "BIAS_STRIDE", "BIAS_POINTER",
        "SPARSE_MAT_POINTER"))},
    "CUSPARSELT_MATMUL_ALG_DEFAULT": 0,
    **{f"CUSPARSELT_MATMUL_{name}": i for i, name in enumerate((
        "ALG_CONFIG_ID", "ALG_CONFIG_MAX_ID", "SEARCH_ITERATIONS", "SPLIT_K", "SPLIT_K_MODE", "SPLIT_K_BUFFERS"))},
}

LIBRARIES: tuple[Library, ...] = (CUBLAS, CUBLASLT, CUDNN, CUSOLVER, CUSPARSE, CUFFT, CURAND, NCCL, CUSPARSELT)
BY_NAME = {lib.name: lib for lib in LIBRARIES}

# cudnnBackendAttributeType_t -> struct format of one element (the C type each names); a type not
# listed is an enum (4 bytes). Descriptors and the cuDNN handle travel as client handles.
CUDNN_TYPE_FORMATS = {
    "CUDNN_TYPE_HANDLE": "Q", "CUDNN_TYPE_BACKEND_DESCRIPTOR": "Q", "CUDNN_TYPE_VOID_PTR": "Q",
    "CUDNN_TYPE_INT64": "q", "CUDNN_TYPE_INT32": "i", "CUDNN_TYPE_FLOAT": "f", "CUDNN_TYPE_DOUBLE": "d",
    "CUDNN_TYPE_BOOLEAN": "?", "CUDNN_TYPE_CHAR": "c", "CUDNN_TYPE_FRACTION": "qq",
}


@functools.cache
def cudnn_format(attribute_type: int) -> str:
    """The struct format of one element of a cuDNN backend attribute of this type. Cached: every attribute
    a cuDNN program sets or gets asks (built afresh each time from cuDNN's ~1,000 enumerators, it cost
    60 µs of the client's CPU per cudnnBackendSetAttribute)."""
    names = {v: k for k, v in api(CUDNN).ENUMS.items() if k.startswith("CUDNN_TYPE_")}
    return CUDNN_TYPE_FORMATS.get(names.get(attribute_type, ""), "i")


# Calls of a client-made handle that the shim queues in the fast lane itself (interpose/kept.h's HANDLE_CALL), once
# the client has let that handle take the lane for that call (client/fft.py, client/curand.py: after a first call
# of it through the client, which forgets the handle at its destroy or a change of what its checks read): symbol ->
# the argument that must be a multiple of what the client said (a generation's count), or None. cuFFT's transforms
# (a plan's checks are the server's), cuRAND's generations whose checks the client makes from the generator and the
# count alone; curandGeneratePoisson's lambda is checked at every call, by the client. PyTorch sets a plan's stream
# and work area before each transform: those too. cuSOLVER's typed factorizations and solves (client/cusolver.py),
# of a handle, numbers and device memory, which the client does not look into; the 64-bit API's (cusolverDnXgetrf...)
# stay with the client: they name a cusolverDnParams_t, which PyTorch makes anew for each call (a let would never be
# used again), and most carry a host workspace's bytes. cuSPARSE's calls of numbers and device memory only
# (client/cusparse.py): a descriptor's new pointers or batch stride, a legacy descriptor's settings, Xcoo2csr, which
# PyTorch calls for each product of a COO matrix; and SpMV, SpMM and SDDMM of a handle in host pointer mode: -> the
# argument whose type sizes alpha and beta (their bytes in the record, up to 8; a C_64F's 16 go through the client),
# their descriptors as they are (the client does not look into them; the server checks them). cusparseLtMatmul stays
# with the client (its handle and plan are read from the caller's structs, its array of streams is host memory, its
# plan's scaling is checked at each call).
HANDLE_LANE: dict[str, str | None] = {
    **{f"cufftExec{kind}": None for kind in ("C2C", "R2C", "C2R", "Z2Z", "D2Z", "Z2D")}, "cufftXtExec": None,
    "cufftSetStream": None, "cufftSetWorkArea": None,
    **{f"curandGenerate{kind}": "num" for kind in ("", "LongLong", "Uniform", "UniformDouble")},
    **{f"curandGenerate{kind}": "n" for kind in ("Normal", "NormalDouble", "LogNormal", "LogNormalDouble")},
    **{f"cusolverDn{t}{function}": None for t in "SDCZ"
       for function in ("getrf", "getrs", "potrf", "potrs", "potrfBatched", "potrsBatched", "potri", "geqrf", "gesvd",
                        "sytrf", *(("orgqr", "ormqr", "syevd") if t in "SD" else ("ungqr", "unmqr", "heevd")))},
    **dict.fromkeys(("cusparseCsrSetPointers", "cusparseCscSetPointers", "cusparseCooSetPointers",
                     "cusparseCsrSetStridedBatch", "cusparseCooSetStridedBatch", "cusparseDnMatSetStridedBatch",
                     "cusparseSetMatType", "cusparseSetMatFillMode", "cusparseSetMatDiagType",
                     "cusparseSetMatIndexBase", "cusparseXcoo2csr", "cusparseXcoosortByRow",
                     "cusparseCreateIdentityPermutation")),
    **dict.fromkeys(("cusparseSpMV", "cusparseSpMM", "cusparseSDDMM"), "computeType"),
}


# Bytes of one value of a cudaDataType_t (CUDA_R_*/CUDA_C_*) or cublasComputeType_t, by the
# enumerator's name: what a `scalar:TYPE` parameter's value holds.
SCALAR_BYTES = {
    "CUDA_R_16F": 2, "CUDA_R_16BF": 2, "CUDA_R_32F": 4, "CUDA_R_64F": 8, "CUDA_C_32F": 8, "CUDA_C_64F": 16,
    "CUDA_R_32I": 4, "CUDA_R_8I": 4, "CUDA_C_16F": 4, "CUDA_C_16BF": 4,
    "CUBLAS_COMPUTE_16F": 2, "CUBLAS_COMPUTE_16F_PEDANTIC": 2, "CUBLAS_COMPUTE_32F": 4,
    "CUBLAS_COMPUTE_32F_PEDANTIC": 4, "CUBLAS_COMPUTE_32F_FAST_16F": 4, "CUBLAS_COMPUTE_32F_FAST_16BF": 4,
    "CUBLAS_COMPUTE_32F_FAST_TF32": 4, "CUBLAS_COMPUTE_64F": 8, "CUBLAS_COMPUTE_64F_PEDANTIC": 8,
    "CUBLAS_COMPUTE_32I": 4, "CUBLAS_COMPUTE_32I_PEDANTIC": 4,
}


def api(lib: Library) -> ModuleType:
    """The generated description of `lib` (protocol/<name>_api.py)."""
    return importlib.import_module(f"xpuremote.protocol.{lib.name}_api")


# A cuDNN variant pack's data pointers as cudnnBackendSetAttribute names them (attribute, element type): device
# addresses, or by-value scalars' host addresses, whose bytes xpuCudnnSetDataPointers carries instead.
CUDNN_DATA_POINTERS = api(CUDNN).ENUMS["CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS"]
CUDNN_VOID_PTR = api(CUDNN).ENUMS["CUDNN_TYPE_VOID_PTR"]
# The variant pack the client keeps and sends with its execution (xpuCudnnExecute): its descriptor type, and the
# attributes it may hold with their element types: data pointers, as many unique ids, a workspace.
CUDNN_VARIANT_PACK = api(CUDNN).ENUMS["CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR"]
CUDNN_UNIQUE_IDS = api(CUDNN).ENUMS["CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS"]
CUDNN_WORKSPACE = api(CUDNN).ENUMS["CUDNN_ATTR_VARIANT_PACK_WORKSPACE"]
CUDNN_INT64 = api(CUDNN).ENUMS["CUDNN_TYPE_INT64"]
CUDNN_PACK_ATTRIBUTES = {CUDNN_DATA_POINTERS: CUDNN_VOID_PTR, CUDNN_UNIQUE_IDS: CUDNN_INT64,
                         CUDNN_WORKSPACE: CUDNN_VOID_PTR}


def execute_pack(pointers: bytes, uids: bytes, scalars: bytes, by_value: bytes) -> bytes:
    """xpuCudnnExecute's `pack` (abi.EXECUTE_PART_*'s order, as kept.h writes it)."""
    parts = {abi.EXECUTE_PART_POINTERS: pointers, abi.EXECUTE_PART_UNIQUE_IDS: uids,
             abi.EXECUTE_PART_SCALARS: scalars, abi.EXECUTE_PART_BY_VALUE: by_value}
    return b"".join(parts[p] for p in sorted(parts))


def execute_parts(count: int, pack: bytes) -> tuple[bytes, bytes, bytes, bytes]:
    """xpuCudnnExecute's `pack` of `count` elements as (pointers, unique ids, by-value scalars, by-value flags)."""
    part = 8 * count
    at = [part * p for p in (abi.EXECUTE_PART_POINTERS, abi.EXECUTE_PART_UNIQUE_IDS, abi.EXECUTE_PART_SCALARS,
                             abi.EXECUTE_PART_BY_VALUE)]
    view = bytes(pack)
    return view[at[0]:at[0] + part], view[at[1]:at[1] + part], view[at[2]:at[2] + part], view[at[3]:at[3] + count]


def status_code(lib: Library, outcome: str) -> int:
    """The library's status for a generic outcome (`success`, `not_supported`, ...)."""
    return api(lib).ENUMS[lib.status[outcome]]
