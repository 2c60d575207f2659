// Three applications with different mixes of driver traffic, for validating xpu-perf's model:
//   workloads sync  N   round-trip bound: small synchronous copies around each kernel
//   workloads async N   launch bound: many kernel launches and memsets per synchronisation
//   workloads bytes N   bandwidth bound: large copies each way
// Each iteration also does some work of its own on the host, as applications do.
// On the sim device the kernel runs through examples/sim_kernels.py.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

__global__ void vector_add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e)); exit(1); } } while (0)

// Host work between GPU calls: a fixed amount of arithmetic, not a sleep (no scheduler noise).
static volatile double sink;
static void host_work(int units) {
    double x = 1.0;
    for (int i = 0; i < units * 1000; i++) x = x * 1.0000001 + 1e-9;
    sink = x;
}

static void sync_mix(int iters, float *a, float *b, float *c, float *host, int n) {
    for (int i = 0; i < iters; i++) {
        CHECK(cudaMemcpy(a, host, n * sizeof(float), cudaMemcpyHostToDevice));
        vector_add<<<(n + 255) / 256, 256>>>(a, b, c, n);
        CHECK(cudaMemcpy(host, c, n * sizeof(float), cudaMemcpyDeviceToHost));
        host_work(20);
    }
}

static void async_mix(int iters, float *a, float *b, float *c, int n, cudaStream_t s) {
    for (int i = 0; i < iters; i++) {
        for (int k = 0; k < 16; k++) vector_add<<<(n + 255) / 256, 256, 0, s>>>(a, b, c, n);
        CHECK(cudaMemsetAsync(b, 0, n * sizeof(float), s));
        host_work(10);
        CHECK(cudaStreamSynchronize(s));
    }
}

static void bytes_mix(int iters, float *a, float *host, size_t bytes) {
    for (int i = 0; i < iters; i++) {
        CHECK(cudaMemcpy(a, host, bytes, cudaMemcpyHostToDevice));
        host_work(200);
        CHECK(cudaMemcpy(host, a, bytes, cudaMemcpyDeviceToHost));
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s sync|async|bytes ITERATIONS\n", argv[0]);
        return 2;
    }
    const char *mix = argv[1];
    int iters = atoi(argv[2]);
    const int n = 256;
    const size_t big = 16 << 20;
    float *a, *b, *c, *host = (float *)calloc(big / sizeof(float), sizeof(float));
    CHECK(cudaMalloc(&a, big));
    CHECK(cudaMalloc(&b, n * sizeof(float)));
    CHECK(cudaMalloc(&c, n * sizeof(float)));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    auto start = std::chrono::steady_clock::now();
    if (!strcmp(mix, "sync")) sync_mix(iters, a, b, c, host, n);
    else if (!strcmp(mix, "async")) async_mix(iters, a, b, c, n, s);
    else if (!strcmp(mix, "bytes")) bytes_mix(iters, a, host, big);
    else { fprintf(stderr, "unknown mix %s\n", mix); return 2; }
    CHECK(cudaDeviceSynchronize());
    double s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    printf("%s x%d: %.3f s\n", mix, iters, s_);
    CHECK(cudaFree(a)); CHECK(cudaFree(b)); CHECK(cudaFree(c));
    return 0;
}
