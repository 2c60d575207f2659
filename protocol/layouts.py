"""Byte layouts of the driver's structs that both ends read or write (x86-64)."""

import struct

# CUDA_MEMCPY2D, per side: size_t xInBytes, y; CUmemorytype type; host pointer; CUdeviceptr;
# CUarray; size_t pitch. Then size_t WidthInBytes, Height.
MEMCPY2D = struct.Struct("<QQI4xQQQQ QQI4xQQQQ QQ")
# CUDA_MEMCPY3D, per side: size_t xInBytes, y, z, lod; CUmemorytype; host pointer; CUdeviceptr;
# CUarray; reserved pointer; size_t pitch, height. Then size_t WidthInBytes, Height, Depth.
MEMCPY3D = struct.Struct("<QQQQI4xQQQ8xQQ QQQQI4xQQQ8xQQ QQQ")
# CUlaunchConfig: grid xyz, block xyz, sharedMemBytes, CUstream, CUlaunchAttribute *, numAttrs
LAUNCH_CONFIG = struct.Struct("<7I4xQQI")
# CUdevprop: 14 ints, from maxThreadsPerBlock to textureAlign
DEVPROP = struct.Struct("<14i")
