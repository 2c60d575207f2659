/* xpuremote's libnvidia-ml.so.1: NVML entry points that forward to the libcuda.so.1 shim.
 *
 * No Python here: each function packs its arguments into 64-bit slots and calls
 * xpu_nvml_enter() of the libcuda.so.1 shim (loaded already when xpu-run preloads both; else
 * found on the library path), whose embedded client answers it (client/nvml.py). The
 * functions themselves are generated from protocol/nvml.py into nvml_entry_points.c by
 * `python -m xpuremote.protocol.generate`.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>

#define XPU_EXPORT __attribute__((visibility("default")))
#define NVML_ERROR_LIBRARY_NOT_FOUND 12

typedef int (*xpu_enter_fn)(int op, uint64_t *slots);
static xpu_enter_fn xpu_enter;
static pthread_once_t xpu_once = PTHREAD_ONCE_INIT;

static void xpu_find_shim(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
    /* NVIDIA's own libcuda has no such symbol: then there is nothing to forward to */
    xpu_enter = lib ? (xpu_enter_fn)dlsym(lib, "xpu_nvml_enter") : NULL;
}

static unsigned int xpu_forward(int op, uint64_t *slots) {
    pthread_once(&xpu_once, xpu_find_shim);
    return xpu_enter ? (unsigned int)xpu_enter(op, slots) : NVML_ERROR_LIBRARY_NOT_FOUND;
}

#include "nvml_entry_points.c"

XPU_EXPORT const char *nvmlErrorString(unsigned int result) {
    for (unsigned i = 0; i < sizeof xpu_nvml_errors / sizeof xpu_nvml_errors[0]; i++)
        if (xpu_nvml_errors[i].code == result) return xpu_nvml_errors[i].text;
    return "Unknown Error";
}
