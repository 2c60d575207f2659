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
