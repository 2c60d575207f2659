// The example run by `make demo`: the CUDA runtime API end to end, on whatever device
// xpu-run provides. On the sim device the kernel runs through the host implementation in
// sim_kernels.py (registered under the same name).
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void vector_add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e)); return 1; } } while (0)

int main() {
    const int n = 1 << 20;
    const size_t bytes = n * sizeof(float);
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("%d device(s); device 0: %s, sm_%d%d, %.1f GiB\n", count, prop.name, prop.major, prop.minor,
           prop.totalGlobalMem / 1073741824.0);
    float *a = (float *)malloc(bytes), *b = (float *)malloc(bytes), *c = (float *)malloc(bytes);
    for (int i = 0; i < n; i++) { a[i] = i; b[i] = 2.0f * i; }
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, bytes)); CHECK(cudaMalloc(&db, bytes)); CHECK(cudaMalloc(&dc, bytes));
    cudaStream_t s; cudaEvent_t start, stop;
    CHECK(cudaStreamCreate(&s)); CHECK(cudaEventCreate(&start)); CHECK(cudaEventCreate(&stop));
    CHECK(cudaEventRecord(start, s));
    CHECK(cudaMemcpyAsync(da, a, bytes, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyAsync(db, b, bytes, cudaMemcpyHostToDevice, s));
    vector_add<<<(n + 255) / 256, 256, 0, s>>>(da, db, dc, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(c, dc, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaEventRecord(stop, s));
    CHECK(cudaStreamSynchronize(s));
    float ms = 0; CHECK(cudaEventElapsedTime(&ms, start, stop));
    int bad = 0;
    for (int i = 0; i < n; i++) if (c[i] != 3.0f * i) bad++;
    printf("vector_add of %d floats: %s (%d wrong), %.3f ms on the device\n", n, bad ? "FAILED" : "correct", bad, ms);
    CHECK(cudaFree(da)); CHECK(cudaFree(db)); CHECK(cudaFree(dc));
    CHECK(cudaStreamDestroy(s)); CHECK(cudaEventDestroy(start)); CHECK(cudaEventDestroy(stop));
    free(a); free(b); free(c);
    return bad != 0;
}
