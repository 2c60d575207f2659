"""The call table: every driver entry point, what each parameter carries, and its cost class.

Everything about a call is said once, here. The C types (from the generated `cuda_api`)
give the defaults; the SPEC below adds only what types cannot say:

- the cost class of each function family (all versioned/per-thread variants share it):
  `local`  answered in the client, no message;
  `async`  queued and sent without waiting, errors surface at the next sync call;
  `shadow` creates something: the client makes up the handle, so it is async too;
  `sync`   needs the server's answer.
  A family with no row is exported all the same and answers CUDA_ERROR_NOT_SUPPORTED.
- parameter annotations, `name=dir[:count]`: `in`, `out` or `inout` for a buffer whose size in
  bytes is `count` (a parameter name, `a*b`, or a number; `each` is the size of one pointee,
  for arrays of structs: `count*each`); `str` for a NUL-terminated input
  string. Without one, `const T *` is one T in, `T *` one T out, and scalars are inputs; in a
  math library's row, a pointer that is not to a handle is a device address. A `?` after the
  direction (`out?`) says the driver accepts NULL there; any other NULL driver pointer that
  would carry bytes is refused with CUDA_ERROR_INVALID_VALUE. `device:EXTENT` on a CUdeviceptr
  says how many bytes from it the call touches: a count as above, or `pitch,width,height` for a
  pitched rectangle (the server checks that range against the client's own allocations).

The math libraries (cuBLAS, cuBLASLt, cuDNN; `protocol/mathlibs.py`) join the same table:
their functions are Calls too, with `library` naming them, their SPEC rows beside their
other facts, and `scalar` parameters (alpha, beta) that carry a value or a device address.

The shim, the client's marshalling, the server's dispatch and the perf model all read this.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from . import abi, mathlibs
from .cuda_api import FUNCTIONS, TYPES

CLASSES = ("local", "async", "shadow", "sync")

SPEC = """
# initialisation, versions, errors
cuInit                      local
cuDriverGetVersion          local
cuGetErrorName              local
cuGetErrorString            local
cuModuleGetLoadingMode      local
cuLogsRegisterCallback      local
cuLogsUnregisterCallback    local
# devices: inventory fetched once at connect
cuDeviceGet                 local
cuDeviceGetCount            local
cuDeviceGetName             local   name=out:len
cuDeviceGetUuid             local
cuDeviceTotalMem            local
cuDeviceGetAttribute        local
cuDeviceGetPCIBusId         local   pciBusId=out:len
cuDeviceGetByPCIBusId       local   pciBusId=str
cuDeviceComputeCapability   local
cuDeviceGetProperties       local
cuDeviceCanAccessPeer       local
cuDeviceGetP2PAttribute     local
cuCtxEnablePeerAccess       local
cuCtxDisablePeerAccess      local
cuDeviceGetDefaultMemPool   sync
cuDeviceGetTexture1DLinearMaxWidth sync
cuDeviceGetExecAffinitySupport local
# GPU coredump settings (client/coredump.py): kept by the client; those that would make a dump are refused
cuCoredumpGetAttribute      local
cuCoredumpGetAttributeGlobal local
cuCoredumpSetAttribute      local
cuCoredumpSetAttributeGlobal local
# primary contexts and contexts
cuDevicePrimaryCtxRetain    shadow
cuDevicePrimaryCtxRelease   async
cuDevicePrimaryCtxGetState  local
cuDevicePrimaryCtxSetFlags  local
cuDevicePrimaryCtxReset     async
cuCtxCreate                 shadow
cuCtxDestroy                async
cuCtxPushCurrent            local
cuCtxPopCurrent             local
cuCtxGetCurrent             local
cuCtxSetCurrent             local
cuCtxGetDevice              local
cuCtxGetFlags               local
cuCtxSetFlags               local
cuCtxGetId                  local
cuCtxGetApiVersion          local
cuCtxSynchronize            sync
cuCtxGetLimit               sync
cuCtxSetLimit               async
cuCtxGetCacheConfig         sync
cuCtxSetCacheConfig         async
cuCtxGetStreamPriorityRange sync    leastPriority=out? greatestPriority=out?
cuCtxResetPersistingL2Cache async
cuCtxGetExecAffinity        sync
# device resources and green contexts (client/green.py): a resource is a set of SMs the client describes, so
# asking, splitting and making descriptors are local; a green context is provisioned on the server with its
# SMs (xpuGreenCtxCreate, waited for: a driver may refuse them all); its handle, the client's, is also the CUcontext
# that stands for it
cuDeviceGetDevResource      local
cuCtxGetDevResource         local
cuGreenCtxGetDevResource    local
cuStreamGetDevResource      local
cuDevSmResourceSplitByCount local
cuDevSmResourceSplit        local
cuDevResourceGenerateDesc   local
cuGreenCtxCreate            sync
cuGreenCtxDestroy           async
cuCtxFromGreenCtx           local
cuGreenCtxGetId             local
cuGreenCtxStreamCreate      shadow
cuStreamGetGreenCtx         local
cuGreenCtxRecordEvent       async
cuGreenCtxWaitEvent         async
# memory
cuMemAlloc                  sync
cuMemAllocPitch             sync
cuMemFree                   async
cuMemGetInfo                sync
cuMemGetAddressRange        local
cuMemAllocHost              local
cuMemHostAlloc              local
cuMemFreeHost               local
cuMemHostRegister           local
cuMemHostUnregister         local
cuMemHostGetFlags           local
cuMemHostGetDevicePointer   local
cuPointerGetAttribute       local
cuPointerGetAttributes      local
cuMemcpy                    sync
cuMemcpyAsync               async
cuMemcpyHtoD                sync    srcHost=in:ByteCount dstDevice=device:ByteCount
cuMemcpyHtoDAsync           async   srcHost=in:ByteCount dstDevice=device:ByteCount
cuMemcpyDtoH                sync    dstHost=out:ByteCount srcDevice=device:ByteCount
cuMemcpyDtoHAsync           async   dstHost=out:ByteCount srcDevice=device:ByteCount
cuMemcpyDtoD                async   dstDevice=device:ByteCount srcDevice=device:ByteCount
cuMemcpyDtoDAsync           async   dstDevice=device:ByteCount srcDevice=device:ByteCount
cuMemcpyPeer                async   dstDevice=device:ByteCount srcDevice=device:ByteCount
cuMemcpyPeerAsync           async   dstDevice=device:ByteCount srcDevice=device:ByteCount
cuMemcpy2D                  sync
cuMemcpy2DUnaligned         sync
cuMemcpy2DAsync             sync
cuMemcpy3D                  sync
cuMemcpy3DAsync             sync
cuMemcpy3DPeer              sync
cuMemcpy3DPeerAsync         sync
# CUDA arrays (client/arrays.py): creation waits for the server's handle (arrays are device memory, so an
# allocation's failure is the call's), the client keeps each array's descriptor (descriptors are local);
# copies with an array side go as the xpuMemcpyArray* requests
cuArrayCreate               sync
cuArray3DCreate             sync
cuArrayDestroy              async
cuArrayGetDescriptor        local
cuArray3DGetDescriptor      local
cuMemcpyHtoA                sync    srcHost=in:ByteCount
cuMemcpyHtoAAsync           async   srcHost=in:ByteCount
cuMemcpyAtoH                sync    dstHost=out:ByteCount
cuMemcpyAtoHAsync           sync    dstHost=out:ByteCount
cuMemcpyAtoD                async   dstDevice=device:ByteCount
cuMemcpyDtoA                async   srcDevice=device:ByteCount
cuMemcpyAtoA                async
# texture and surface objects: kernels take their value, so creation waits for the server's; the client
# keeps the descriptors it gave (the Get*Desc questions are local)
cuTexObjectCreate           sync
cuTexObjectDestroy          async
cuTexObjectGetResourceDesc  local
cuTexObjectGetTextureDesc   local
cuTexObjectGetResourceViewDesc local
cuSurfObjectCreate          sync
cuSurfObjectDestroy         async
cuSurfObjectGetResourceDesc local
cuMemsetD8                  async   dstDevice=device:N
cuMemsetD16                 async   dstDevice=device:N*2
cuMemsetD32                 async   dstDevice=device:N*4
cuMemsetD8Async             async   dstDevice=device:N
cuMemsetD16Async            async   dstDevice=device:N*2
cuMemsetD32Async            async   dstDevice=device:N*4
cuMemsetD2D8                async   dstDevice=device:dstPitch,Width,Height
cuMemsetD2D16               async   dstDevice=device:dstPitch,Width*2,Height
cuMemsetD2D32               async   dstDevice=device:dstPitch,Width*4,Height
cuMemsetD2D8Async           async   dstDevice=device:dstPitch,Width,Height
cuMemsetD2D16Async          async   dstDevice=device:dstPitch,Width*2,Height
cuMemsetD2D32Async          async   dstDevice=device:dstPitch,Width*4,Height
# stream-ordered allocation (memory pools): the client places allocations in address ranges the server
# reserved for its pool (xpuMemPoolReserve) and sends them as xpuMemPoolAlloc, not waited for; in a stream
# capture (a graph's allocation) the address is the server's answer, so allocating waits. The client keeps
# each device's default and current pool, so cuDeviceGetMemPool is local. A pool
# attribute's value travels as 8 bytes (the client widens and narrows it: memprops.POOL_ATTRIBUTE_SIZES)
cuMemAllocAsync             sync
cuMemAllocFromPoolAsync     sync
cuMemFreeAsync              async
cuDeviceGetMemPool          local
cuDeviceSetMemPool          async
cuMemGetDefaultMemPool      local   location=in   # CUDA 13's forms by location: as the device's (sent as
cuMemGetMemPool             local   location=in   # cuDeviceSetMemPool), for device locations only
cuMemSetMemPool             local   location=in
cuMemPoolCreate             sync
cuMemPoolDestroy            async
cuMemPoolSetAttribute       async   value=in:8
cuMemPoolGetAttribute       sync    value=out:8
cuMemPoolTrimTo             async
cuMemPoolSetAccess          async   map=in:count*each
cuMemPoolGetAccess          sync    location=in
# virtual memory management: reserving addresses and creating physical memory wait for their answer;
# mapping, access, unmapping and releasing are queued (the client checks them against its answers)
cuMemAddressReserve         sync
cuMemAddressFree            async
cuMemCreate                 sync
cuMemRelease                async
cuMemMap                    async
cuMemUnmap                  async   ptr=device:size
cuMemSetAccess              async   ptr=device:size desc=in:count*each
cuMemGetAccess              sync    location=in
cuMemGetAllocationGranularity sync
cuMemGetAllocationPropertiesFromHandle sync
cuMemRetainAllocationHandle sync    addr=in:device
# modules and libraries: images are uploaded lazily, one entry for the server's GPU
cuModuleLoad                local   fname=str
cuModuleLoadData            local
cuModuleLoadDataEx          local
cuModuleLoadFatBinary       local
cuModuleUnload              local
cuModuleGetFunction         local   name=str
cuModuleGetGlobal           sync    name=str
cuModuleGetFunctionCount    local
cuLibraryLoadData           local
cuLibraryLoadFromFile       local   fileName=str
cuLibraryUnload             local
cuLibraryGetKernel          local   name=str
cuLibraryGetModule          local
cuLibraryGetGlobal          sync    name=str
cuLibraryGetKernelCount     local
cuKernelGetFunction         local
cuKernelGetName             local
cuKernelGetLibrary          local
cuKernelGetAttribute        sync
cuKernelSetAttribute        async
cuKernelSetCacheConfig      async
cuKernelGetParamInfo        local
cuFuncGetParamInfo          local
cuFuncGetAttribute          sync
cuFuncSetAttribute          async
cuFuncSetCacheConfig        async
cuFuncGetName               local
cuFuncGetModule             local
cuFuncIsLoaded              local
cuFuncLoad                  local
# launches: arguments packed client-side from the cached parameter layout
cuLaunchKernel              async
cuLaunchKernelEx            async
cuLaunchCooperativeKernel   async
cuLaunchHostFunc            async   fn=in:0 userData=in:0
# streams and events: client-made handles
cuStreamCreate              shadow
cuStreamCreateWithPriority  shadow
cuStreamDestroy             async
cuStreamQuery               sync
cuStreamSynchronize         sync
cuStreamWaitEvent           async
cuStreamGetFlags            local
cuStreamGetPriority         local
cuStreamGetCtx              local
cuStreamGetId               local
cuStreamGetDevice           local
cuStreamAddCallback         async   callback=in:0 userData=in:0
cuEventCreate               shadow
cuEventRecord               async
cuEventRecordWithFlags      async
cuEventQuery                sync
cuEventSynchronize          sync
cuEventDestroy              async
cuEventElapsedTime          sync
# stream capture and graphs: a capture happens on the server's driver; the client keeps each stream's
# capture state (client/graphs.py), so that the questions about it are local
cuStreamBeginCapture        async
cuStreamEndCapture          sync
cuStreamIsCapturing         local
cuStreamGetCaptureInfo      local
cuThreadExchangeStreamCaptureMode local
cuStreamUpdateCaptureDependencies async dependencies=in:numDependencies*each dependencyData=in?:numDependencies*each
cuGraphCreate               shadow
cuGraphDestroy              async
cuGraphAddEmptyNode         shadow  dependencies=in?:numDependencies*each
cuGraphAddKernelNode        shadow
cuGraphAddMemsetNode        shadow
cuGraphAddMemcpyNode        shadow
cuGraphAddDependencies      async   from=in:numDependencies*each to=in:numDependencies*each \
                                    edgeData=in?:numDependencies*each
cuGraphAddNode              shadow
cuGraphAddChildGraphNode    shadow  dependencies=in?:numDependencies*each
cuGraphAddEventRecordNode   shadow  dependencies=in?:numDependencies*each
cuGraphAddEventWaitNode     shadow  dependencies=in?:numDependencies*each
cuGraphAddMemFreeNode       shadow  dependencies=in?:numDependencies*each
cuGraphAddMemAllocNode      sync
cuGraphMemAllocNodeGetParams local
cuGraphKernelNodeGetParams  local
cuGraphEventRecordNodeGetEvent local
cuGraphEventWaitNodeGetEvent local
cuGraphEventRecordNodeSetEvent async
cuGraphEventWaitNodeSetEvent async
cuGraphExecEventRecordNodeSetEvent async
cuGraphExecEventWaitNodeSetEvent async
cuGraphNodeSetEnabled       async
cuGraphNodeGetEnabled       local
cuGraphMemFreeNodeGetParams local
cuGraphClone                shadow
cuGraphDestroyNode          async
cuGraphNodeGetType          sync
cuGraphKernelNodeSetParams  async
cuGraphMemsetNodeSetParams  async
cuGraphMemcpyNodeSetParams  async
cuGraphExecKernelNodeSetParams async
cuGraphExecMemsetNodeSetParams async
cuGraphExecMemcpyNodeSetParams async
cuGraphNodeSetParams        async   nodeParams=in:256
cuGraphExecNodeSetParams    async   nodeParams=in:256
cuGraphMemcpyNodeGetParams  local
cuGraphMemsetNodeGetParams  local
cuGraphNodeGetParams        local
cuGraphExecUpdate           sync
cuGraphGetNodes             sync
cuGraphGetRootNodes         sync
cuGraphNodeGetDependencies  sync
cuGraphNodeGetDependentNodes sync
cuGraphGetEdges             sync
cuGraphInstantiate          sync
cuGraphInstantiateWithFlags sync
cuGraphInstantiateWithParams sync
cuGraphUpload               async
cuGraphLaunch               async
cuGraphExecDestroy          async
cuGraphConditionalHandleCreate sync
cuGraphGetId                sync
cuGraphExecGetId            sync
cuGraphNodeGetLocalId       sync
cuGraphNodeGetToolsId       sync
cuGraphNodeGetContainingGraph sync
cuDeviceGetGraphMemAttribute sync   value=out:8
cuDeviceSetGraphMemAttribute async  value=in:8
cuDeviceGraphMemTrim        async
# profiling of the server's GPU
cuProfilerStart             sync
cuProfilerStop              sync
# occupancy
cuOccupancyMaxActiveBlocksPerMultiprocessor          sync
cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags sync
cuOccupancyMaxPotentialBlockSize                     local
cuOccupancyMaxPotentialBlockSizeWithFlags            local
cuOccupancyAvailableDynamicSMemPerBlock              sync
cuOccupancyMaxActiveClusters                         sync
"""

# The client's own requests, for what it answers locally but must still tell the server:
# lazily uploaded module images, kernel lookups, argument layouts, packed launches.
# Same format as SPEC, with the C declaration in front; a `*` count is sized by the server.
INTERNAL = """
xpuModuleLoad(CUmodule *module, const void *key, const void *image, size_t size)  shadow key=in:32 image=in:size
xpuModuleGetFunction(CUfunction *func, CUmodule module, const char *name)          shadow name=str
xpuFuncGetParams(CUfunction func, void *layout)                                    sync   layout=out:*
xpuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, \
  unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, \
  CUstream hStream, const void *params, size_t paramBytes, unsigned int flags)       async  params=in:paramBytes
xpuLaunchKernelEx(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, \
  unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, \
  CUstream hStream, const void *params, size_t paramBytes, const void *attrs, unsigned int numAttrs) \
                                                                                     async \
  params=in:paramBytes attrs=in:numAttrs*72
xpuOccupancyMaxActiveClusters(int *numClusters, CUfunction f, unsigned int gridDimX, unsigned int gridDimY, \
  unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, \
  unsigned int sharedMemBytes, const void *attrs, unsigned int numAttrs)              sync   attrs=in?:numAttrs*72
xpuHostFunc(CUstream hStream, unsigned long long token)                             async
xpuLane(const void *records, size_t bytes)                                          async  records=in:bytes
xpuMemcpy2DDevice(CUdeviceptr dst, size_t dstPitch, CUdeviceptr src, size_t srcPitch, size_t width, \
  size_t height, CUstream hStream)                                                   async  \
                                                                                     dst=device:dstPitch,width,height \
                                                                                     src=device:srcPitch,width,height
xpuMemcpy2DToHost(void *dst, CUdeviceptr src, size_t srcPitch, size_t width, size_t height, CUstream hStream) \
                                                                                     sync   dst=out:width*height \
                                                                                     src=device:srcPitch,width,height
xpuMemcpy2DFromHost(CUdeviceptr dst, size_t dstPitch, const void *src, size_t width, size_t height, \
  CUstream hStream)                                                                  async  src=in:width*height \
                                                                                     dst=device:dstPitch,width,height
xpuMemcpyArrayFromHost(CUarray dst, size_t dstX, size_t dstY, size_t dstZ, const void *src, size_t width, \
  size_t height, CUstream hStream)                                                   async  src=in:width*height
xpuMemcpyArrayToHost(void *dst, CUarray src, size_t srcX, size_t srcY, size_t srcZ, size_t width, size_t height, \
  CUstream hStream)                                                                  sync   dst=out:width*height
xpuMemcpyArrayFromDevice(CUarray dst, size_t dstX, size_t dstY, size_t dstZ, CUdeviceptr src, size_t srcPitch, \
  size_t width, size_t height, CUstream hStream)                                     async  \
                                                                                     src=device:srcPitch,width,height
xpuMemcpyArrayToDevice(CUdeviceptr dst, size_t dstPitch, CUarray src, size_t srcX, size_t srcY, size_t srcZ, \
  size_t width, size_t height, CUstream hStream)                                     async  \
                                                                                     dst=device:dstPitch,width,height
xpuMemcpyArrayToArray(CUarray dst, size_t dstX, size_t dstY, size_t dstZ, CUarray src, size_t srcX, size_t srcY, \
  size_t srcZ, size_t width, size_t height, CUstream hStream)                        async
xpuTexObjectCreate(unsigned long long *object, CUarray array, const void *resDesc, const void *texDesc, \
  const void *viewDesc)                                                              sync   resDesc=in:144 \
                                                                                     texDesc=in:104 viewDesc=in?:112
xpuSurfObjectCreate(unsigned long long *object, CUarray array, const void *resDesc) sync   resDesc=in:144
xpuGreenCtxCreate(CUgreenCtx *green, CUdevice dev, const void *sms, unsigned int flags) shadow sms=in:64
xpuStreamBeginCapture(CUgraph *graph, CUstream hStream, unsigned int mode)         shadow
xpuStreamEndCapture(CUstream hStream, unsigned long long graph)                     sync
xpuGraphCountNodes(CUgraph graph, unsigned int roots, size_t *count)                sync
xpuStreamGetCaptureDependencies(CUstream hStream, void *nodes)                      sync   nodes=out:*
xpuGraphNodeGetContainingGraph(CUgraphNode node, unsigned long long *graph)         sync
xpuGraphListNodes(CUgraph graph, unsigned int roots, void *nodes)                   sync   nodes=out:*
xpuGraphNodeListEdges(CUgraphNode node, unsigned int dependents, void *nodes)       sync   nodes=out:*
xpuGraphListEdges(CUgraph graph, void *edges)                                       sync   edges=out:*
xpuGraphAddKernelNode(CUgraphNode *node, CUgraph graph, const void *dependencies, size_t numDependencies, \
  CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, \
  unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, const void *params, \
  size_t paramBytes)                                                                 shadow \
  dependencies=in?:numDependencies*8 params=in:paramBytes
xpuGraphAddMemsetNode(CUgraphNode *node, CUgraph graph, const void *dependencies, size_t numDependencies, \
  CUdeviceptr dst, size_t pitch, unsigned int value, unsigned int elementSize, size_t width, size_t height) \
                                                                                     shadow \
  dependencies=in?:numDependencies*8 dst=device:pitch,width*elementSize,height
xpuGraphAddMemcpyNode(CUgraphNode *node, CUgraph graph, const void *dependencies, size_t numDependencies, \
  CUdeviceptr dst, size_t dstPitch, CUdeviceptr src, size_t srcPitch, size_t width, size_t height) \
                                                                                     shadow \
  dependencies=in?:numDependencies*8 dst=device:dstPitch,width,height src=device:srcPitch,width,height
xpuGraphAddConditionalNode(CUgraphNode *node, CUgraph graph, const void *dependencies, size_t numDependencies, \
  unsigned long long handle, unsigned int type, unsigned int size, void *bodies)     sync \
  dependencies=in?:numDependencies*8 bodies=out:*
xpuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const void *dependencies, size_t numDependencies, \
  const void *poolProps, const void *accessDescs, size_t accessDescCount, size_t bytesize, CUdeviceptr *dptr) \
                                                                                     sync \
  dependencies=in?:numDependencies*8 poolProps=in:88 accessDescs=in?:accessDescCount*12
xpuGraphNodeSetKernel(CUgraphExec exec, CUgraphNode node, CUfunction f, unsigned int gridDimX, \
  unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, \
  unsigned int blockDimZ, unsigned int sharedMemBytes, const void *params, size_t paramBytes) \
                                                                                     async  params=in:paramBytes
xpuGraphNodeSetMemset(CUgraphExec exec, CUgraphNode node, CUdeviceptr dst, size_t pitch, unsigned int value, \
  unsigned int elementSize, size_t width, size_t height)                              async \
  dst=device:pitch,width*elementSize,height
xpuGraphNodeSetMemcpy(CUgraphExec exec, CUgraphNode node, CUdeviceptr dst, size_t dstPitch, CUdeviceptr src, \
  size_t srcPitch, size_t width, size_t height)                                      async \
  dst=device:dstPitch,width,height src=device:srcPitch,width,height
xpuGraphExecUpdate(CUgraphExec exec, CUgraph graph, unsigned int *result)           sync
xpuMemPoolReserve(CUdeviceptr *base, CUmemoryPool pool, size_t size)             sync
xpuMemPoolAlloc(CUmemoryPool pool, CUdeviceptr dptr, size_t bytesize, CUstream hStream) async
xpuDeviceStatus(unsigned int index, void *status)                                   sync   status=out:*
xpuLibraryVersion(const char *library, void *version)                               sync   library=str version=out:*
xpuCudnnGetDescriptors(unsigned long long descriptor, unsigned int attributeName, size_t requested, \
  const void *handles, unsigned long long *count)                                    sync   handles=in:requested*8
xpuCudnnSetDataPointers(unsigned long long descriptor, size_t count, const void *pointers, const void *byValue, \
  const void *scalars)                                                               async \
  pointers=in:count*8 byValue=in:count scalars=in:count*8
xpuCudnnExecute(unsigned long long handle, unsigned long long plan, size_t count, unsigned long long workspace, \
  const void *pack)                                                                  async  pack=in:count*25
"""

# Stream handles that are not handles: NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD.
DEFAULT_STREAMS = (0, 1, 2)
DEVICE_POINTERS = ("CUdeviceptr", "CUdeviceptr_v1")

# What the client library (client/) sends instead of a call it implements with others: family -> the one symbol of
# it that it does send, None for none. Unified copies go as HtoD/DtoH/DtoD, 2D/3D copies as the xpuMemcpy2D* halves
# (their structs hold host pointers), launches as xpuLaunchKernel (with launch attributes: xpuLaunchKernelEx),
# cluster occupancy as xpuOccupancyMaxActiveClusters, host functions as xpuHostFunc, global lookups as
# cuModuleGetGlobal_v2, captures' ends and beginnings as xpuStream*Capture, every graph instantiation as
# cuGraphInstantiateWithFlags, node counts as xpuGraphCountNodes, node lists and edges as xpuGraphListNodes,
# xpuGraphNodeListEdges and xpuGraphListEdges, a node's graph as xpuGraphNodeGetContainingGraph (the client's handle
# of it), kernel, memset and memcpy nodes as xpuGraphAdd*Node (their structs hold host pointers or a kernel's
# argument pointers; cuGraphAddNode goes as the call of its node's type; new parameters of those nodes, in a graph
# or an instantiation, as xpuGraphNodeSet*, and so do the polymorphic cuGraphNodeSetParams and
# cuGraphExecNodeSetParams; an instantiation's update as xpuGraphExecUpdate; a conditional node as
# xpuGraphAddConditionalNode, whose body graphs the server names; an allocation node as xpuGraphAddMemAllocNode, its
# properties' ordinals the server's and its access descriptions read), 3D peer copies as 3D copies, green contexts
# as xpuGreenCtxCreate (with the SMs their descriptor gives: descriptors are the client's); the older CTC loss forms
# read host arrays and are refused, cuFFT's cufftPlan* go as cufftCreate and a cufftMakePlan* (client/fft.py). A
# server accepts only calls the client sends (`Call.sent`).
SENT_INSTEAD: dict[str, str | None] = {
    "cuMemcpy": None, "cuMemcpyAsync": None, "cuMemcpy2D": None, "cuMemcpy2DUnaligned": None,
    "cuMemcpy2DAsync": None, "cuMemcpy3D": None, "cuMemcpy3DAsync": None,
    "cuMemcpy3DPeer": None, "cuMemcpy3DPeerAsync": None,
    "cuLaunchKernel": None, "cuLaunchKernelEx": None, "cuLaunchCooperativeKernel": None,
    "cuLaunchHostFunc": None, "cuStreamAddCallback": None, "cuDevicePrimaryCtxRelease": None,
    "cuModuleGetGlobal": "cuModuleGetGlobal_v2", "cuLibraryGetGlobal": None, "cuCtxCreate": "cuCtxCreate_v2",
    "cuStreamBeginCapture": None, "cuStreamEndCapture": None, "cuGraphGetNodes": None, "cuGraphGetRootNodes": None,
    "cuGraphInstantiate": None, "cuGraphInstantiateWithParams": None, "cuGraphAddKernelNode": None,
    "cuGraphAddMemsetNode": None, "cuGraphAddMemcpyNode": None, "cuOccupancyMaxActiveClusters": None,
    "cuGraphNodeGetContainingGraph": None, "cuGraphNodeGetDependencies": None, "cuGraphNodeGetDependentNodes": None,
    "cuGraphAddNode": None, "cuGraphKernelNodeSetParams": None, "cuGraphMemsetNodeSetParams": None,
    "cuGraphMemcpyNodeSetParams": None, "cuGraphExecKernelNodeSetParams": None, "cuGraphExecMemsetNodeSetParams": None,
    "cuGraphExecMemcpyNodeSetParams": None, "cuGraphExecUpdate": None, "cuGraphGetEdges": None,
    "cuGraphNodeSetParams": None, "cuGraphExecNodeSetParams": None, "cuGraphAddMemAllocNode": None,
    "cuMemcpyHtoA": None, "cuMemcpyHtoAAsync": None, "cuMemcpyAtoH": None, "cuMemcpyAtoHAsync": None,
    "cuMemcpyAtoD": None, "cuMemcpyDtoA": None, "cuMemcpyAtoA": None, "cuArrayCreate": "cuArrayCreate_v2",
    "cuArray3DCreate": "cuArray3DCreate_v2", "cuTexObjectCreate": None, "cuSurfObjectCreate": None,
    "cuGreenCtxCreate": None,
    "cudnnCTCLoss": "cudnnCTCLoss_v8", "cudnnGetCTCLossWorkspaceSize": "cudnnGetCTCLossWorkspaceSize_v8",
    "cufftPlan1d": None, "cufftPlan2d": None, "cufftPlan3d": None, "cufftPlanMany": None,
}
# Releases whose first argument is not a handle (see Call.releases; destroys are releases too).
RELEASES = ("cuMemFree", "cuMemFreeAsync", "cuMemFreeHost", "cuMemHostUnregister", "cuMemRelease", "cuMemUnmap",
            "cuMemAddressFree", "cuDevicePrimaryCtxRelease", "cuTexObjectDestroy", "cuSurfObjectDestroy")
SENT_LOCAL = ("cuCtxSetCurrent", "cuModuleUnload")  # answered locally, and still told to the server

# Calls the shim may queue itself, in C, without entering the client (interpose/lane.h, docs/design.md "The
# fast lane"): family -> how. `args`: the arguments as they are; `launch`: packed as xpuLaunchKernel with the
# kernel's argument bytes, once the client knows the kernel's layout; `known`: the arguments as they are, once
# the client has let the first one take the lane (a graph instantiation without host copies, whose launch
# needs nothing of the client). A batch carries them as one xpuLane call of records, which the server runs as
# the calls they name: those with a `lane` here, and xpuLaunchKernel.
LANE = {
    "cuMemsetD8Async": "args", "cuMemsetD16Async": "args", "cuMemsetD32Async": "args",
    "cuMemsetD2D8Async": "args", "cuMemsetD2D16Async": "args", "cuMemsetD2D32Async": "args",
    "cuEventRecord": "args", "cuEventRecordWithFlags": "args", "cuStreamWaitEvent": "args",
    "cuMemcpyDtoDAsync": "args", "cuLaunchKernel": "launch", "cuGraphLaunch": "known",
}
LANE_LAUNCH = "xpuLaunchKernel"
# What interpose/kept.h queues in the lane from the descriptors it keeps: a variant pack's execution, and a
# server's matmul descriptor moved to a GEMM's new bias or scale address ahead of the GEMM.
KEPT_LANE = ("xpuCudnnExecute", "cublasLtMatmulDescSetAttribute")

# Copies whose host buffer may travel on the session's data connection (server/data.py) instead of in their
# message, when the client waits for them (a sync call, or an async one from or into pageable memory).
BY_DATA_CONNECTION = ("cuMemcpyHtoD", "cuMemcpyHtoDAsync", "cuMemcpyDtoH", "cuMemcpyDtoHAsync")

VARIANT_SUFFIX = re.compile(r"(_v\d+)?(_ptds|_ptsz)?$")


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str
    kind: str  # int | float | handle | struct (by value) | ptr
    size: int  # bytes of the value itself
    signed: bool
    pointee: str  # for ptr: int | float | handle | struct | ptr | void | opaque
    pointee_size: int
    direction: str  # in | out | inout
    count: str | None  # bytes behind a pointer: a parameter name, `a*b`, a number; None = one pointee;
    # `str`; `*` (sized by the server); `scalar[:TYPE]` (a library's alpha/beta); `device` (an address
    # in the GPU's memory: the value travels, as a CUdeviceptr does); `ref` (a pointer to a caller's struct that
    # holds a client handle, cuSPARSELt's: the handle travels)
    optional: bool = False  # the driver accepts NULL here (`out?` in SPEC)
    extent: str | None = None  # of a CUdeviceptr: the bytes from it that the call touches (`device:`)

    @property
    def is_string(self) -> bool:
        return self.count == "str"

    @property
    def by_reference(self) -> bool:
        """A handle the caller's struct holds (cuSPARSELt's): the pointer is to it, the handle in it travels."""
        return self.count == "ref"

    @property
    def is_scalar(self) -> bool:
        return self.count is not None and self.count.startswith("scalar")

    @property
    def is_address(self) -> bool:
        """The pointer's value is what travels (a device address), never what it points at."""
        return self.count == "device"

    @property
    def is_device(self) -> bool:
        """An input whose value is an address in the GPU's memory (a library scalar may be one too,
        in device pointer mode)."""
        return self.direction == "in" and (self.ctype in DEVICE_POINTERS or self.is_address)

    def byte_count(self, values: dict[str, Any]) -> int | None:
        """Bytes behind this pointer, given the call's scalar arguments by name; None when the
        size is not fixed by them (a string, a library scalar, or an output the server sizes)."""
        if self.count is None:  # one pointee; a struct passed by value travels as its own bytes (ncclUniqueId)
            return self.size if self.kind == "struct" else self.pointee_size
        factors = self.factors
        if factors is None:
            return None
        total = factors[0]
        for name in factors[1]:
            total *= int(values[name])
        return total

    @cached_property
    def factors(self) -> tuple[int, tuple[str, ...]] | None:
        """`count` as `a*b*4` parsed once (byte_count runs on every call that carries bytes): the constant
        (`each`: the size of one pointee) and the arguments it multiplies; None where no count sizes it."""
        if self.count in ("str", "*", "device", "ref") or self.is_scalar:
            return None
        constant, names = 1, []
        for part in (p.strip() for p in self.count.split("*")):
            if part.isdigit():
                constant *= int(part)
            elif part == "each":
                constant *= self.pointee_size
            else:
                names.append(part)
        return constant, tuple(names)


@dataclass(frozen=True)
class Extent:
    """A device pointer's `device:` extent, compiled: each comma-separated part is a constant times some
    of the call's arguments (by index); one part is a length, three are pitch, width and height."""
    parts: tuple[tuple[int, tuple[int, ...]], ...] = ()

    @staticmethod
    def of(expression: str | None, names: tuple[str, ...]) -> Extent:
        if expression is None:
            return Extent()
        parts = []
        for part in expression.split(","):
            constant, indices = 1, []
            for factor in (f.strip() for f in part.split("*")):
                if factor.isdigit():
                    constant *= int(factor)
                else:
                    indices.append(names.index(factor))
            parts.append((constant, tuple(indices)))
        return Extent(tuple(parts))

    @cached_property
    def length(self) -> tuple[int, int] | None:
        """(constant, argument index) when the extent is a constant times one argument; else None."""
        if len(self.parts) == 1 and len(self.parts[0][1]) == 1:
            return self.parts[0][0], self.parts[0][1][0]
        return None

    def size(self, args: Sequence[Any]) -> int:
        """Bytes touched, at least 1 (the first byte where the table does not say); TypeError/ValueError
        where an argument it multiplies is not a number."""
        if self.length is not None:  # a constant times one argument: most calls
            constant, i = self.length
            return max(constant * int(args[i]), 1)
        sizes = []
        for constant, indices in self.parts:
            for i in indices:
                constant *= int(args[i])
            sizes.append(constant)
        if len(sizes) < 3:
            return max(sizes[0], 1) if sizes else 1
        pitch, width, height = sizes  # rows closer than their width overlap: counted as if they did not
        return max(max(pitch, width) * (height - 1) + width if width and height else 0, 1)


@dataclass(frozen=True)
class Call:
    symbol: str
    family: str
    cls: str  # local | async | shadow | sync | unsupported
    params: tuple[Param, ...]
    per_thread: bool  # a _ptds/_ptsz variant: stream 0 means the per-thread stream
    library: str = "cuda"  # or the math library (protocol/mathlibs.py) it belongs to

    @cached_property
    def opcode(self) -> int:
        """Stable across releases and declaration order: a hash of the symbol."""
        return zlib.crc32(self.symbol.encode()) & 0x7FFFFFFF

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @cached_property
    def has_pointers(self) -> bool:
        return any(p.kind == "ptr" for p in self.params)

    @cached_property
    def address_extents(self) -> tuple[tuple[int, Param, Extent], ...]:
        """Each parameter that may hold a device address: (index, parameter, the bytes from it the call
        touches, compiled against this call's arguments)."""
        return tuple((i, p, Extent.of(p.extent, self.names)) for i, p in enumerate(self.params)
                     if p.is_device or p.is_scalar)

    @cached_property
    def outputs(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.direction != "in")

    @cached_property
    def destroys(self) -> bool:
        """Ends the life of the handle in its first argument (cuStreamDestroy, cudnnDestroy...Descriptor,
        cusparseSpGEMM_destroyDescr)."""
        return ("destroy" in self.family.lower() or self.family.endswith("Unload")) and bool(self.params) \
            and (self.params[0].kind == "handle" or self.params[0].by_reference)

    @cached_property
    def releases(self) -> bool:
        """Only gives something back: once the session has ended (a program's teardown at exit) the server
        has released everything, so the shim answers it with success (interpose/shim.c)."""
        return self.library == "cuda" and (self.destroys or self.family in RELEASES)

    @cached_property
    def lane(self) -> str | None:
        """How the shim queues this call in C (LANE), or None."""
        return LANE.get(self.family) if self.library == "cuda" and self.cls == "async" else None

    @cached_property
    def in_lane(self) -> bool:
        """A lane record may name this call (the server runs no other from a lane)."""
        return (self.lane in ("args", "known") and self.sent) or self.symbol in (LANE_LAUNCH, *KEPT_LANE) \
            or self.blas_lane is not None or self.lt_lane is not None or self.dnn_lane is not None \
            or self.handle_lane is not None

    @cached_property
    def blas_lane(self) -> tuple[int, int, int] | None:
        """How the shim queues this cuBLAS call in the lane (interpose/kept.h), or None: (a bit per argument that is
        a host scalar, the argument naming the scalars' type or -1, their fixed size). Calls of the handle first,
        then integers, streams, device pointers and host scalars of one type, each by value in a record."""
        if not self._queued_in_c("cublas", "cublasHandle_t"):
            return None
        scalars, type_arg, size = 0, -1, 0
        for i, p in enumerate(self.params[1:], 1):
            if p.is_scalar and p.direction == "in":
                kind = p.count.partition(":")[2]
                at = self.names.index(kind) if kind in self.names else -1
                if (kind and (at < 0 or self.params[at].kind != "int" or type_arg not in (-1, at))) \
                        or (not kind and (p.pointee_size > 8 or size not in (0, p.pointee_size))):
                    return None
                type_arg, size = (at, size) if kind else (type_arg, p.pointee_size)
                scalars |= 1 << i
            elif not _travels_as_is(p):
                return None
        return None if type_arg >= 0 and size else (scalars, type_arg, size)

    @cached_property
    def lt_lane(self) -> tuple[int, int, int, int, int] | None:
        """How the shim queues this cuBLASLt call in the lane (interpose/kept.h), or None: (a bit per kept
        descriptor argument, a bit per host scalar, the descriptor whose scale type sizes them, the argument whose
        bytes travel as the record's blob or -1, their size). Calls of the handle first, then kept descriptors,
        integers, streams, device pointers, host scalars of a descriptor's scale type and one input struct."""
        if not self._queued_in_c("cublasLt", "cublasLtHandle_t"):
            return None
        descriptors, scalars, scale_from, blob, blob_size = 0, 0, -1, -1, 0
        for i, p in enumerate(self.params[1:], 1):
            kind = (p.count or "").partition(":")[2]
            if p.ctype in ("cublasLtMatmulDesc_t", "cublasLtMatrixLayout_t"):
                descriptors |= 1 << i
            elif p.is_scalar and p.direction == "in" and kind in self.names \
                    and scale_from in (-1, self.names.index(kind)):
                scalars, scale_from = scalars | 1 << i, self.names.index(kind)
            elif p.kind == "ptr" and not p.is_device and p.count is None and p.direction == "in" and blob < 0:
                blob, blob_size = i, p.pointee_size
            elif not _travels_as_is(p):
                return None
        return descriptors, scalars, scale_from, blob, blob_size

    @cached_property
    def dnn_lane(self) -> tuple[int, int, int] | None:
        """How the shim queues this cuDNN call in the lane (interpose/kept.h), or None: (a bit per descriptor
        argument, a bit per host scalar, the tensor descriptor whose data type sizes them or -1). Calls of the
        handle first, then descriptors (at the call, a tensor descriptor C keeps is named by the server's
        descriptor for its setting and any other must be NULL), integers, floats, streams, device pointers and host
        scalars of one tensor's type: a batch norm."""
        if not self._queued_in_c("cudnn", "cudnnHandle_t"):
            return None
        descriptors, scalars, scale_from = 0, 0, -1
        for i, p in enumerate(self.params[1:], 1):
            kind = (p.count or "").partition(":")[2]
            at = self.names.index(kind) if kind in self.names else -1
            if p.kind == "handle":
                descriptors |= 1 << i
            elif p.is_scalar and p.direction == "in" and at >= 0 and scale_from in (-1, at) \
                    and self.params[at].ctype == "cudnnTensorDescriptor_t":
                scalars, scale_from = scalars | 1 << i, at
            elif not _travels_as_is(p):
                return None
        return descriptors, scalars, scale_from

    @cached_property
    def handle_lane(self) -> int | None:
        """How the shim queues this call of a client-made handle in the lane (interpose/kept.h's HANDLE_CALL, once the
        client let the handle take it: mathlibs.HANDLE_LANE), or None: the argument that must be a multiple of what
        the client said, or (handle_scalars) the type argument that sizes the host scalars, or -1. Calls of the handle
        first, then integers, floats, streams and device pointers, each by value in a record: cuFFT's transforms (and
        a plan's stream and work area), cuRAND's generations, cuSOLVER's typed factorizations and solves, cuSPARSE's
        descriptor setters and index conversions; and host scalars of that type argument, their bytes in the record's
        slots, with other handles (the server checks them, as off the lane): cuSPARSE's SpMV, SpMM and SDDMM."""
        if self.symbol not in mathlibs.HANDLE_LANE or not self.params \
                or not self._queued_in_c(self.library, self.params[0].ctype):
            return None
        named = mathlibs.HANDLE_LANE[self.symbol]
        at = self.names.index(named) if named is not None else -1
        for i, p in enumerate(self.params[1:], 1):
            scalar = self.handle_scalars >> i & 1
            if not (scalar or _travels_as_is(p) or (self.handle_scalars and p.kind == "handle")):
                return None
        return at

    @cached_property
    def handle_scalars(self) -> int:
        """A bit per host scalar a HANDLE_CALL record carries in its slot (handle_lane): those sized by the type
        argument mathlibs.HANDLE_LANE names."""
        named = mathlibs.HANDLE_LANE.get(self.symbol)
        return sum(1 << i for i, p in enumerate(self.params) if named and p.is_scalar and p.direction == "in"
                   and p.count == f"scalar:{named}")

    def _queued_in_c(self, library: str, handle: str) -> bool:
        """An async call of `library` sent as it is, of its handle first and at most LANE_ARGS_MAX arguments, and
        no destroy (the client's): what blas_lane, lt_lane, dnn_lane and handle_lane consider."""
        return self.library == library and self.cls == "async" and self.sent and not self.destroys \
            and 0 < len(self.params) <= abi.LANE_ARGS_MAX and self.params[0].ctype == handle

    @cached_property
    def from_slots(self) -> Callable[[Sequence[int]], list[Any]]:
        """What turns the shim's uint64_t slots of this call (an entry point's, a lane record's) into its values:
        signed integers from two's complement, floats from their bits; handles and pointers as they are."""
        convs = [_float if p.kind == "float" and p.size == 4 else _double if p.kind == "float"
                 else _signed if p.kind == "int" and p.signed else None for p in self.params]
        n = len(convs)
        if not any(convs):
            return lambda slots: [slots[i] for i in range(n)]
        return lambda slots: [c(slots[i]) if c else slots[i] for i, c in enumerate(convs)]

    @cached_property
    def by_data(self) -> bool:
        """Its host buffer may travel on the data connection (BY_DATA_CONNECTION)."""
        return self.library == "cuda" and self.family in BY_DATA_CONNECTION

    @cached_property
    def sent(self) -> bool:
        """The client library sends this call as it is (see SENT_INSTEAD): a server takes no other."""
        if self.family in SENT_INSTEAD:
            return self.symbol == SENT_INSTEAD[self.family]
        return self.cls in ("sync", "async", "shadow") or self.family in SENT_LOCAL


def _signed(v: int) -> int:
    return v - (1 << 64) if v >> 63 else v


def _float(v: int) -> float:
    return struct.unpack("<f", (v & 0xFFFFFFFF).to_bytes(4, "little"))[0]


def _double(v: int) -> float:
    return struct.unpack("<d", v.to_bytes(8, "little"))[0]


def _travels_as_is(p: Param) -> bool:
    """An argument a lane record carries as its value: an integer, a float's bits, a stream, a device address."""
    return p.kind in ("int", "float") or p.ctype == "cudaStream_t" or p.is_device


class TableError(ValueError):
    pass


def family_of(symbol: str) -> str:
    return VARIANT_SUFFIX.sub("", symbol)


Note = tuple[str, "str | None", bool]  # a parameter's direction, count and whether NULL is allowed


def _parse_spec(text: str) -> dict[str, tuple[str, dict[str, Note]]]:
    rows: dict[str, tuple[str, dict[str, Note]]] = {}
    for lineno, raw in enumerate(text.replace("\\\n", " ").splitlines(), 1):  # a trailing \ continues a row
        line = raw.split("#", 1)[0].split()
        if not line:
            continue
        if len(line) < 2:
            raise TableError(f"SPEC line {lineno}: {line[0]} has no class (one of {CLASSES})")
        family, cls, *notes = line
        if cls not in CLASSES:
            raise TableError(f"SPEC line {lineno}: class {cls!r} of {family} is not one of {CLASSES}")
        if family in rows:
            raise TableError(f"SPEC line {lineno}: {family} is listed twice")
        annotations = {}
        for note in notes:
            name, _, rest = note.partition("=")
            direction, _, count = rest.partition(":")
            optional = direction.endswith("?")
            direction = direction.rstrip("?")
            if direction in ("str", "scalar"):
                direction, count = "in", direction + (f":{count}" if count else "")
            if direction not in ("in", "out", "inout", "device"):
                raise TableError(f"SPEC line {lineno}: {note!r}: direction must be in, out, inout, str, scalar "
                                 "or device")
            annotations[name] = (direction, count or None, optional)
        rows[family] = (cls, annotations)
    return rows


def _param(ctype: str, name: str, note: Note | None, types: dict[str, tuple], library: str) -> Param:
    kind, size, signed, pointee, pointee_size = types[ctype]
    if note and note[0] == "device":
        if ctype not in DEVICE_POINTERS:
            raise TableError(f"SPEC: {name} is annotated device but is a {ctype}")
        return Param(name, ctype, kind, size, bool(signed), pointee, pointee_size, "in", None, extent=note[1])
    optional = False
    if note:
        direction, count, optional = note
    elif kind != "ptr":
        direction, count = "in", None
    elif library != "cuda" and pointee != "handle":
        direction, count = "in", "device"  # a library's data pointers are the GPU's; host buffers are annotated
    else:
        direction, count = ("in" if ctype.startswith("const ") else "out"), None
    if pointee == "handle" and pointee_size > 8 and direction == "in":  # a struct of the caller's holds the handle
        count = "ref"
    return Param(name, ctype, kind, size, bool(signed), pointee, pointee_size, direction, count, optional)


def _internal_functions(text: str) -> tuple[dict[str, tuple], str]:
    """INTERNAL -> (declarations like FUNCTIONS, rows in SPEC format)."""
    functions, rows = {}, []
    for decl in text.replace("\\\n", " ").strip().splitlines():
        m = re.match(r"\s*(\w+)\((.*?)\)\s+(.*)$", decl)
        if not m:
            raise TableError(f"INTERNAL: cannot read {decl!r}")
        params = []
        for part in m.group(2).split(","):
            ctype, name = part.strip().rsplit(" ", 1)
            stars = len(name) - len(name.lstrip("*"))
            params.append(((ctype + " " + "*" * stars).strip(), name.lstrip("*")))
        functions[m.group(1)] = tuple(params)
        rows.append(f"{m.group(1)} {m.group(3)}")
    return functions, "\n".join(rows)


INTERNAL_FUNCTIONS, _INTERNAL_SPEC = _internal_functions(INTERNAL)
ALL_FUNCTIONS = {**FUNCTIONS, **INTERNAL_FUNCTIONS}


def _build(spec: str, functions: dict[str, tuple] | None = None, types: dict[str, tuple] | None = None,
           library: str = "cuda") -> dict[str, Call]:
    """The calls of `functions` (the driver's and the client's own by default), classed by `spec`."""
    functions, types = functions or ALL_FUNCTIONS, types or TYPES
    rows = _parse_spec(spec)
    table: dict[str, Call] = {}
    for symbol, params in functions.items():
        family = family_of(symbol)
        cls, notes = rows.get(family, ("unsupported", {}))
        names = {n for _, n in params}
        table[symbol] = Call(
            symbol=symbol,
            family=family,
            cls=cls,
            params=tuple(_param(t, n, notes.get(n), types, library) for t, n in params),
            per_thread=symbol.endswith(("_ptds", "_ptsz")),
            library=library,
        )
        for n, (_, count, _) in notes.items():
            if n not in names and any(n in {p for _, p in functions[s]} for s in functions
                                      if family_of(s) == family):
                continue  # the annotation names a parameter that only another variant has
            if n not in names:
                raise TableError(f"SPEC: {family} has no parameter {n!r} (has {sorted(names)})")
            for ref in re.findall(r"[A-Za-z_]\w*", count or ""):
                if ref not in ("str", "scalar", "each", "device") and ref not in names:
                    raise TableError(f"SPEC: {family}.{n} counts by {ref!r}, not a parameter of {symbol}")
    families = {c.family for c in table.values()}
    for family in rows:
        if family not in families:
            kind = "driver" if library == "cuda" else library
            raise TableError(f"SPEC: {family} is not a {kind} function (check its spelling)")
    _validate(table)
    return table


def _validate(table: dict[str, Call]) -> None:
    seen: dict[int, str] = {}
    for call in table.values():
        if call.opcode in seen:
            raise TableError(f"opcode clash between {seen[call.opcode]} and {call.symbol}: rename one")
        seen[call.opcode] = call.symbol
        outputs = any(p.direction != "in" and p.pointee != "handle" for p in call.params)
        if call.cls == "async" and outputs and call.family not in ASYNC_WITH_OUTPUTS:
            # an async call cannot return data; its outputs would never arrive
            raise TableError(f"{call.symbol} is async but has outputs: make it sync or shadow")


# Async calls with pointer outputs: launches (the client packs them itself, no answer needed)
# and device-to-host copies, whose answer is written into the application's memory when it
# arrives, before any later sync call returns.
ASYNC_WITH_OUTPUTS = {"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuMemcpyDtoHAsync"}

CALLS: dict[str, Call] = _build(SPEC + _INTERNAL_SPEC)
for _lib in mathlibs.LIBRARIES:
    _api = mathlibs.api(_lib)
    CALLS.update(_build(_lib.spec, _api.FUNCTIONS, {**TYPES, **_api.TYPES}, _lib.name))
_validate(CALLS)  # opcodes unique across the libraries too
BY_OPCODE: dict[int, Call] = {c.opcode: c for c in CALLS.values()}
# The generator writes FUNCTIONS in the order its entry points number the ops (protocol/generate.py, `op_order`):
SYMBOLS: tuple[str, ...] = tuple(FUNCTIONS)  # index = the shim's op number
# each library's symbols; index = the op number its replacement library's entry points use
LIBRARY_SYMBOLS: dict[str, tuple[str, ...]] = {
    lib.name: tuple(mathlibs.api(lib).FUNCTIONS) for lib in mathlibs.LIBRARIES}
if len(SYMBOLS) != abi.DRIVER_OPS or {n: len(s) for n, s in LIBRARY_SYMBOLS.items()} != abi.LIBRARY_OPS:
    raise TableError("protocol/abi.py and the *_api.py modules come from different generator runs: re-run it")
for _family, _symbol in SENT_INSTEAD.items():
    if not any(c.family == _family for c in CALLS.values()) or (_symbol is not None and _symbol not in CALLS):
        raise TableError(f"SENT_INSTEAD: {_family} -> {_symbol} names no call of the table")
