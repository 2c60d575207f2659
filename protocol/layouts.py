"""Byte layouts of the driver's structs that both ends read or write (x86-64)."""

import struct

# CUDA_MEMCPY2D, per side: size_t xInBytes, y; CUmemorytype type; host pointer; CUdeviceptr;
# CUarray; size_t pitch. Then size_t WidthInBytes, Height.
MEMCPY2D = struct.Struct("<QQI4xQQQQ QQI4xQQQQ QQ")
# CUDA_MEMCPY3D, per side: size_t xInBytes, y, z, lod; CUmemorytype; host pointer; CUdeviceptr;
# CUarray; reserved pointer; size_t pitch, height. Then size_t WidthInBytes, Height, Depth.
MEMCPY3D = struct.Struct("<QQQQI4xQQQ8xQQ QQQQI4xQQQ8xQQ QQQ")
# CUlaunchConfig: grid xyz, block xyz, sharedMemBytes, CUstream, CUlaunchAttribute *, numAttrs
LAUNCH_CONFIG = struct.Struct("<7I4xQQI4x")
# CUlaunchAttribute: its id, then a 64-byte union of values; the ids whose value starts with a CUevent
LAUNCH_ATTRIBUTE = struct.Struct("<I4x64s")
EVENT_ATTRIBUTES = (7, 12)  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT, _LAUNCH_COMPLETION_EVENT
CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: unsigned x, y, z
# CUDA_KERNEL_NODE_PARAMS: CUfunction, grid xyz, block xyz, sharedMemBytes, kernelParams, extra;
# the _v2 form (CUDA 12 on) adds CUkernel kern, CUcontext ctx
KERNEL_NODE = struct.Struct("<Q7I4xQQ")
KERNEL_NODE_V2 = struct.Struct("<Q7I4xQQQQ")
# CUDA_MEMSET_NODE_PARAMS: dst, pitch, value, elementSize, width, height
MEMSET_NODE = struct.Struct("<QQIIQQ")
# CUDA_GRAPH_INSTANTIATE_PARAMS: flags, hUploadStream, hErrNode_out, result_out
INSTANTIATE_PARAMS = struct.Struct("<QQQI4x")
# CUdevprop: 14 ints, from maxThreadsPerBlock to textureAlign
DEVPROP = struct.Struct("<14i")
# CUDA_ARRAY_DESCRIPTOR: size_t Width, Height; CUarray_format Format; unsigned NumChannels
ARRAY_DESCRIPTOR = struct.Struct("<QQII")
# CUDA_ARRAY3D_DESCRIPTOR: size_t Width, Height, Depth; Format; NumChannels; unsigned Flags
ARRAY3D_DESCRIPTOR = struct.Struct("<QQQIII4x")
# bytes of one channel of each CUarray_format an array may have here (the classic ones)
ARRAY_FORMAT_BYTES = {0x01: 1, 0x02: 2, 0x03: 4, 0x08: 1, 0x09: 2, 0x0A: 4, 0x10: 2, 0x20: 4}
# CUDA_RESOURCE_DESC: CUresourcetype, then a 128-byte union, then unsigned flags. The union's start:
# array / mipmapped array: the handle; linear: devPtr, format, channels, sizeInBytes; pitch2D: devPtr,
# format, channels, width, height, pitchInBytes
RESOURCE_DESC = struct.Struct("<I4x128sI4x")
RESOURCE_LINEAR = struct.Struct("<QIIQ")
RESOURCE_PITCH2D = struct.Struct("<QIIQQQ")
RESOURCE_ARRAY, RESOURCE_MIPMAPPED, RESOURCE_LINEAR_TYPE, RESOURCE_PITCH2D_TYPE = 0, 1, 2, 3
TEXTURE_DESC_SIZE, RESOURCE_VIEW_DESC_SIZE = 104, 112
# CUdevResource: CUdevResourceType, 92 bytes the driver keeps for itself, a 40-byte union (for SMs:
# smCount, minSmPartitionSize, smCoscheduledAlignment, flags, localityDomainId), the nextResource pointer
DEV_RESOURCE = struct.Struct("<I92s40sQ")
SM_RESOURCE = struct.Struct("<5I20x")
# CU_DEV_SM_RESOURCE_GROUP_PARAMS: smCount, coscheduledSmCount, preferredCoscheduledSmCount, flags,
# localityDomainId, 11 reserved
SM_GROUP_PARAMS = struct.Struct("<5I44x")
SM_MASK_BYTES = 64  # a set of SMs on the wire (xpuGreenCtxCreate): one bit an SM, SM 0 the lowest bit
# CUDA_MEM_ALLOC_NODE_PARAMS after its CUmemPoolProps (memprops.POOL_PROPS, 88 bytes): const CUmemAccessDesc
# *accessDescs, size_t accessDescCount, size_t bytesize, CUdeviceptr dptr (the driver's answer)
MEM_ALLOC_NODE = struct.Struct("<QQQQ")
# CUDA_CONDITIONAL_NODE_PARAMS: the condition's handle, CUgraphConditionalNodeType, size (bodies), the bodies'
# array (CUgraph *, the driver's), CUcontext
CONDITIONAL_NODE = struct.Struct("<QIIQQ")
# the most body graphs of an IF, WHILE and SWITCH node (CUgraphConditionalNodeType 0, 1, 2): cuda.h's, and our
# bound for SWITCH, which cuda.h leaves open
CONDITIONAL_BODIES = {0: 2, 1: 1, 2: 1 << 12}
COND_ASSIGN_DEFAULT = 0x1  # cuGraphConditionalHandleCreate's flag (a #define in cuda.h): the default at each launch
