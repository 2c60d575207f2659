// The runtime API as most programs start, for tests/test_refusals_said.py: NVIDIA's libcudart (12 or 13,
// linked at build time) asks the driver, and the program prints what each call answered.
// No header: the two entry points and cudaGetErrorName have the same ABI in both majors.
#include <stddef.h>
#include <stdio.h>

extern "C" {
int cudaGetDeviceCount(int *count);
int cudaMalloc(void **ptr, size_t size);
int cudaFree(void *ptr);
const char *cudaGetErrorName(int error);
}

int main() {
    int count = -1;
    void *ptr = NULL;
    int rc = cudaGetDeviceCount(&count);
    printf("cudaGetDeviceCount %s %d\n", cudaGetErrorName(rc), count);
    rc = cudaMalloc(&ptr, 256);
    printf("cudaMalloc %s\n", cudaGetErrorName(rc));
    if (rc == 0) cudaFree(ptr);
    return 0;
}
