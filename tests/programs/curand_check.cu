// cuRAND's host API as a C program uses it: generators made and seeded, numbers generated into device memory and
// copied back, each check deterministic (the seeds are fixed; the bounds on the moments of 10^5 numbers are wide
// enough that a correct generator passes with any seed). Built by tests/test_curand.py with nvcc, linked against
// NVIDIA's libcurand.so.10; under xpu-run the replacement of the same SONAME is loaded instead.
//
//   curand_check all      every check below; "curand_check: all correct" at the end
//   curand_check create   one generator made: its status, named

#include <cuda_runtime.h>
#include <curand.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 100000

static int failures = 0;

static void check(bool ok, const char *what) {
    printf("%s: %s\n", what, ok ? "correct" : "WRONG");
    if (!ok) failures++;
}

static bool ran(curandStatus_t status, const char *what) {
    if (status != CURAND_STATUS_SUCCESS) {
        printf("%s: status %d\n", what, (int)status);
        failures++;
        return false;
    }
    return true;
}

#define CURAND(call) do { if (!ran((call), #call)) return; } while (0)
#define CUDA(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    printf("%s: %s\n", #call, cudaGetErrorString(e_)); failures++; return; } } while (0)

struct Moments { double mean, sd, min, max; };

template <typename T> static Moments moments(const T *v, size_t n) {
    double sum = 0, sq = 0, lo = v[0], hi = v[0];
    for (size_t i = 0; i < n; i++) {
        double x = (double)v[i];
        sum += x; sq += x * x;
        lo = x < lo ? x : lo; hi = x > hi ? x : hi;
    }
    double mean = sum / n;
    return {mean, sqrt(sq / n - mean * mean), lo, hi};
}

// `n` floats of a fresh generator of `type` seeded with `seed` at `offset`, copied back into `out`
static void uniforms(curandRngType_t type, unsigned long long seed, unsigned long long offset, float *dev,
                     float *out, size_t n) {
    curandGenerator_t gen;
    CURAND(curandCreateGenerator(&gen, type));
    CURAND(curandSetPseudoRandomGeneratorSeed(gen, seed));
    CURAND(curandSetGeneratorOffset(gen, offset));
    CURAND(curandGenerateUniform(gen, dev, n));
    CUDA(cudaMemcpy(out, dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    CURAND(curandDestroyGenerator(gen));
}

static size_t same(const float *a, const float *b, size_t n) {
    size_t count = 0;
    for (size_t i = 0; i < n; i++) count += a[i] == b[i];
    return count;
}

static void reproducible(float *dev) {
    static float a[N], b[N], c[N], d[N];
    for (curandRngType_t type : {CURAND_RNG_PSEUDO_DEFAULT, CURAND_RNG_PSEUDO_PHILOX4_32_10}) {
        uniforms(type, 1234, 0, dev, a, N);
        uniforms(type, 1234, 0, dev, b, N);
        uniforms(type, 4321, 0, dev, c, N);
        uniforms(type, 1234, 1000, dev, d, N);
        check(!memcmp(a, b, sizeof a), "same seed, same numbers");
        check(same(a, c, N) < 100, "another seed, other numbers");
        check(same(a, d, N) < 100, "another offset, other numbers");
        Moments m = moments(a, N);
        check(m.min > 0 && m.max <= 1, "uniform in (0, 1]");
        check(fabs(m.mean - 0.5) < 0.01 && fabs(m.sd - sqrt(1 / 12.0)) < 0.01, "uniform's mean and deviation");
    }
}

static void distributions(void *dev) {
    static float f[N];
    static double g[N];
    static unsigned int u[N];
    curandGenerator_t gen;
    cudaStream_t stream;
    CUDA(cudaStreamCreate(&stream));
    CURAND(curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    CURAND(curandSetStream(gen, stream));
    CURAND(curandSetPseudoRandomGeneratorSeed(gen, 2024));
    CURAND(curandSetGeneratorOrdering(gen, CURAND_ORDERING_PSEUDO_DEFAULT));
    CURAND(curandGenerateSeeds(gen));

    CURAND(curandGenerateNormal(gen, (float *)dev, N, 2.0f, 3.0f));
    CUDA(cudaMemcpyAsync(f, dev, sizeof f, cudaMemcpyDeviceToHost, stream));
    CUDA(cudaStreamSynchronize(stream));
    Moments m = moments(f, N);
    check(fabs(m.mean - 2) < 0.1 && fabs(m.sd - 3) < 0.1, "normal's mean and deviation");

    CURAND(curandGenerateNormalDouble(gen, (double *)dev, N, -1.0, 0.5));
    CUDA(cudaMemcpy(g, dev, sizeof g, cudaMemcpyDeviceToHost));
    m = moments(g, N);
    check(fabs(m.mean + 1) < 0.02 && fabs(m.sd - 0.5) < 0.02, "normal double's mean and deviation");

    CURAND(curandGenerateLogNormal(gen, (float *)dev, N, 0.5f, 0.25f));
    CUDA(cudaMemcpy(f, dev, sizeof f, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < N; i++) g[i] = log(f[i] > 0 ? f[i] : 1e-30f);
    m = moments(f, N);
    Moments logs = moments(g, N);
    check(m.min > 0 && fabs(logs.mean - 0.5) < 0.01 && fabs(logs.sd - 0.25) < 0.01, "log-normal's logarithms");

    CURAND(curandGenerateUniformDouble(gen, (double *)dev, N));
    CUDA(cudaMemcpy(g, dev, sizeof g, cudaMemcpyDeviceToHost));
    m = moments(g, N);
    check(m.min > 0 && m.max <= 1 && fabs(m.mean - 0.5) < 0.01, "uniform doubles");

    CURAND(curandGeneratePoisson(gen, (unsigned int *)dev, N, 4.5));
    CUDA(cudaMemcpy(u, dev, sizeof u, cudaMemcpyDeviceToHost));
    m = moments(u, N);
    check(fabs(m.mean - 4.5) < 0.1 && fabs(m.sd * m.sd - 4.5) < 0.3, "Poisson's mean and variance");

    CURAND(curandGenerate(gen, (unsigned int *)dev, N));
    CUDA(cudaMemcpy(u, dev, sizeof u, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < N; i++) g[i] = u[i] / 4294967296.0;
    m = moments(g, N);
    check(fabs(m.mean - 0.5) < 0.01 && m.max < 1, "32-bit values");

    // cuRAND's answers at the call: an odd count of normals, 64-bit values from a 32-bit generator
    check(curandGenerateNormal(gen, (float *)dev, 3, 0.0f, 1.0f) == CURAND_STATUS_LENGTH_NOT_MULTIPLE,
          "an odd count of normals refused");
    check(curandGenerateLongLong(gen, (unsigned long long *)dev, 4) == CURAND_STATUS_TYPE_ERROR,
          "64-bit values from a pseudorandom generator refused");
    CURAND(curandDestroyGenerator(gen));
    CUDA(cudaStreamDestroy(stream));
}

static void versions() {
    int version = 0, major = -1;
    CURAND(curandGetVersion(&version));
    CURAND(curandGetProperty(MAJOR_VERSION, &major));
    printf("version %d, major %d\n", version, major);
    check(major == CURAND_VER_MAJOR && version / 1000 == major, "version and property");
    curandGenerator_t host;
    check(curandCreateGeneratorHost(&host, CURAND_RNG_PSEUDO_DEFAULT) != CURAND_STATUS_SUCCESS,
          "a host generator refused");
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "all";
    if (!strcmp(mode, "create")) {
        void *dev;
        cudaMalloc(&dev, 16);
        curandGenerator_t gen;
        curandStatus_t status = curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_DEFAULT);
        printf("create: status %d\n", (int)status);
        return status == CURAND_STATUS_SUCCESS ? 0 : 1;
    }
    void *dev;
    if (cudaMalloc(&dev, N * sizeof(double)) != cudaSuccess) {
        printf("cudaMalloc failed\n");
        return 1;
    }
    reproducible((float *)dev);
    distributions(dev);
    versions();
    cudaFree(dev);
    if (failures) {
        printf("curand_check: %d wrong\n", failures);
        return 1;
    }
    printf("curand_check: all correct\n");
    return 0;
}
