// The CUDA driver API end to end, for tests/test_programs.py. No runtime: the host program is
// built with -cudart none and linked against libcuda.so.1 (the shim, at run time).
//
// The same file holds the kernels: compiled with -DKERNELS_ONLY (and --fatbin or --cubin) it
// is the module image the host program loads from a file.
//
//   driver_api all            MODULE.fatbin MODULE.cubin   the whole tour; prints "driver_api: all correct"
//   driver_api load           MODULE                       cuModuleLoadData only; prints "load: <CUresult>"
//   driver_api unregistered   MODULE                       launches a kernel with no sim implementation
#ifdef KERNELS_ONLY

extern "C" __global__ void saxpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

// C++ linkage on purpose: the module knows it by its mangled name only
__global__ void fill_index(unsigned *out, unsigned base, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = base + i;
}

extern "C" __global__ void unregistered_kernel(int *p) { p[threadIdx.x] = 42; }

#else

#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CHECK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { const char *n_ = "?"; \
    cuGetErrorName(r_, &n_); fprintf(stderr, "%s:%d: %s failed: %d %s\n", __FILE__, __LINE__, #call, \
    (int)r_, n_); exit(1); } } while (0)
#define EXPECT(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
    exit(1); } } while (0)

static std::vector<char> read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    std::vector<char> data;
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) data.insert(data.end(), chunk, chunk + n);
    fclose(f);
    return data;
}

static CUcontext setup(void) {
    CHECK(cuInit(0));
    int count = 0;
    CHECK(cuDeviceGetCount(&count));
    EXPECT(count >= 1);
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    char name[256];
    CHECK(cuDeviceGetName(name, sizeof name, dev));
    int major = 0, minor = 0;
    CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CHECK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    printf("device 0: %s, sm_%d%d\n", name, major, minor);
    CUcontext ctx;
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));  // CUDA 13: cuCtxCreate_v4 with optional CUctxCreateParams
    return ctx;
}

// y = 2x + y with kernelParams, then fill_index with `extra`, then cuMemsetD32.
static void kernels(CUmodule module) {
    CUfunction saxpy, fill_index;
    CHECK(cuModuleGetFunction(&saxpy, module, "saxpy"));
    CHECK(cuModuleGetFunction(&fill_index, module, "_Z10fill_indexPjji"));
    EXPECT(cuModuleGetFunction(&fill_index, module, "no_such_kernel") == CUDA_ERROR_NOT_FOUND);
    CHECK(cuModuleGetFunction(&fill_index, module, "_Z10fill_indexPjji"));

    const int n = 100000;
    const size_t bytes = n * sizeof(float);
    std::vector<float> x(n), y(n), out(n);
    for (int i = 0; i < n; i++) { x[i] = (float)i; y[i] = 0.5f * i; }
    CUdeviceptr dx, dy;
    CHECK(cuMemAlloc(&dx, bytes));
    CHECK(cuMemAlloc(&dy, bytes));
    CHECK(cuMemcpyHtoD(dx, x.data(), bytes));
    CHECK(cuMemcpyHtoD(dy, y.data(), bytes));
    float a = 2.0f;
    int count = n;
    void *params[] = {&a, &dx, &dy, &count};
    CHECK(cuLaunchKernel(saxpy, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH(out.data(), dy, bytes));
    for (int i = 0; i < n; i++) EXPECT(out[i] == 2.0f * i + 0.5f * i);
    printf("saxpy (kernelParams): correct\n");

    // fill_index(unsigned *out, unsigned base, int n) through one packed buffer
    struct { CUdeviceptr out; unsigned base; int n; } args = {dx, 1000u, n - 5};
    size_t args_size = sizeof args;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &args, CU_LAUNCH_PARAM_BUFFER_SIZE, &args_size,
                     CU_LAUNCH_PARAM_END};
    CHECK(cuMemsetD32(dx, 0xDEADBEEF, n));
    CHECK(cuLaunchKernel(fill_index, (n + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, NULL, extra));
    std::vector<unsigned> idx(n);
    CHECK(cuMemcpyDtoH(idx.data(), dx, bytes));
    for (int i = 0; i < n - 5; i++) EXPECT(idx[i] == 1000u + i);
    for (int i = n - 5; i < n; i++) EXPECT(idx[i] == 0xDEADBEEFu);  // left as cuMemsetD32 set them
    printf("fill_index (extra) and cuMemsetD32: correct\n");
    CHECK(cuMemFree(dx));
    CHECK(cuMemFree(dy));
}

// host (pitch 100, from x=4, y=1) -> device (pitch 128) -> host (pitch 80), 60 x 7 bytes
static void copy_2d(void) {
    const size_t width = 60, height = 7, hpitch = 100, dpitch = 128, opitch = 80;
    std::vector<unsigned char> src(hpitch * (height + 1)), dst(opitch * height, 0xEE);
    for (size_t i = 0; i < src.size(); i++) src[i] = (unsigned char)(i * 7 + 3);
    CUdeviceptr dev;
    CHECK(cuMemAlloc(&dev, dpitch * height));
    CUDA_MEMCPY2D up;
    memset(&up, 0, sizeof up);
    up.srcMemoryType = CU_MEMORYTYPE_HOST;
    up.srcHost = src.data();
    up.srcPitch = hpitch;
    up.srcXInBytes = 4;
    up.srcY = 1;
    up.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    up.dstDevice = dev;
    up.dstPitch = dpitch;
    up.WidthInBytes = width;
    up.Height = height;
    CHECK(cuMemcpy2D(&up));
    CUDA_MEMCPY2D down;
    memset(&down, 0, sizeof down);
    down.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    down.srcDevice = dev;
    down.srcPitch = dpitch;
    down.dstMemoryType = CU_MEMORYTYPE_HOST;
    down.dstHost = dst.data();
    down.dstPitch = opitch;
    down.WidthInBytes = width;
    down.Height = height;
    CHECK(cuMemcpy2D(&down));
    for (size_t r = 0; r < height; r++)
        for (size_t c = 0; c < opitch; c++)
            EXPECT(dst[r * opitch + c] == (c < width ? src[(r + 1) * hpitch + 4 + c] : 0xEE));
    CHECK(cuMemFree(dev));
    printf("cuMemcpy2D with pitches: correct\n");
}

static void streams_and_events(void) {
    CUstream stream;
    CUevent start, stop;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&stop, CU_EVENT_DEFAULT));
    const size_t bytes = 1 << 20;
    std::vector<unsigned char> host(bytes), back(bytes);
    for (size_t i = 0; i < bytes; i++) host[i] = (unsigned char)(i ^ (i >> 8));
    CUdeviceptr dev;
    CHECK(cuMemAlloc(&dev, bytes));
    CHECK(cuEventRecord(start, stream));
    CHECK(cuMemcpyHtoDAsync(dev, host.data(), bytes, stream));
    CHECK(cuMemcpyDtoHAsync(back.data(), dev, bytes, stream));
    CHECK(cuEventRecord(stop, stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuEventSynchronize(stop));
    float ms = -1;
    CHECK(cuEventElapsedTime(&ms, start, stop));
    EXPECT(ms >= 0);
    EXPECT(memcmp(host.data(), back.data(), bytes) == 0);
    CHECK(cuMemFree(dev));
    CHECK(cuEventDestroy(start));
    CHECK(cuEventDestroy(stop));
    CHECK(cuStreamDestroy(stream));
    printf("stream and events: correct (%.3f ms)\n", ms);
}

// A primary context, retained and made current, and a module loaded from the cubin's path.
static void primary_context(const char *cubin) {
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    CUcontext primary;
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxSetCurrent(primary));
    CUcontext current;
    CHECK(cuCtxGetCurrent(&current));
    EXPECT(current == primary);
    CUmodule module;
    CHECK(cuModuleLoad(&module, cubin));
    CUfunction fill_index;
    CHECK(cuModuleGetFunction(&fill_index, module, "_Z10fill_indexPjji"));
    CUdeviceptr out;
    CHECK(cuMemAlloc(&out, 64 * sizeof(unsigned)));
    unsigned base = 7;
    int n = 64;
    void *params[] = {&out, &base, &n};
    CHECK(cuLaunchKernel(fill_index, 1, 1, 1, 64, 1, 1, 0, NULL, params, NULL));
    unsigned got[64];
    CHECK(cuMemcpyDtoH(got, out, sizeof got));
    for (int i = 0; i < 64; i++) EXPECT(got[i] == 7u + i);
    CHECK(cuMemFree(out));
    CHECK(cuModuleUnload(module));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("primary context and cuModuleLoad: correct\n");
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s all|load|unregistered MODULE [CUBIN]\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    std::vector<char> image = read_file(argv[2]);
    CUcontext ctx = setup();
    CUmodule module;
    if (strcmp(mode, "load") == 0) {
        CUresult r = cuModuleLoadData(&module, image.data());
        printf("load: %d\n", (int)r);
        return 0;
    }
    CHECK(cuModuleLoadData(&module, image.data()));
    if (strcmp(mode, "unregistered") == 0) {
        CUfunction f;
        CHECK(cuModuleGetFunction(&f, module, "unregistered_kernel"));
        CUdeviceptr p;
        CHECK(cuMemAlloc(&p, 32 * sizeof(int)));
        void *params[] = {&p};
        CUresult launch = cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
        CUresult sync = cuCtxSynchronize();  // a launch's failure surfaces here at the latest
        printf("unregistered: launch %d sync %d\n", (int)launch, (int)sync);
        return launch == CUDA_SUCCESS && sync == CUDA_SUCCESS ? 1 : 0;
    }
    if (argc < 4) return 2;
    kernels(module);
    copy_2d();
    streams_and_events();
    CHECK(cuModuleUnload(module));
    CHECK(cuCtxDestroy(ctx));
    primary_context(argv[3]);
    printf("driver_api: all correct\n");
    return 0;
}

#endif
