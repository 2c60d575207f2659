/* xpuremote's libcublas.so.13, libcublasLt.so.13 and libcudnn.so.9: entry points that forward
 * to the libcuda.so.1 shim.
 *
 * Built once per library with XPU_ENTRY_POINTS naming its generated entry points
 * (<lib>_entry_points.c) and XPU_NOT_INITIALIZED its status for "no client". No Python here:
 * each function packs its arguments into 64-bit slots and calls xpu_lib_enter() of the shim,
 * whose embedded client answers it (client/mathlibs.py), so a library call is ordered with
 * the process's driver calls on one session. The symbols carry the version node NVIDIA's
 * library gives them (the SONAME), through the linker version script build.py writes.
 *
 * The entry points also export what NVIDIA's other libraries import from this one and no header
 * declares (cuSOLVER's cublasSetEnvironmentMode, cuBLAS's internal cuBLASLt calls): those refuse
 * here, in C, with the library's NOT_SUPPORTED, and name themselves once on stderr as the client
 * names a call it does not forward.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include "abi.h"

#define XPU_EXPORT __attribute__((visibility("default")))

typedef struct { int code; const char *name; } xpu_status_name;
static uint64_t xpu_bits_float(float f) { uint32_t u; __builtin_memcpy(&u, &f, 4); return u; }
static uint64_t xpu_bits_double(double d) { uint64_t u; __builtin_memcpy(&u, &d, 8); return u; }
typedef int (*xpu_enter_fn)(int library, int op, uint64_t *slots);
static xpu_enter_fn xpu_enter;
static pthread_once_t xpu_once = PTHREAD_ONCE_INIT;

static void xpu_find_shim(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
    /* NVIDIA's own libcuda has no such symbol: then there is nothing to forward to */
    xpu_enter = lib ? (xpu_enter_fn)dlsym(lib, "xpu_lib_enter") : NULL;
}

static int xpu_lib_call(int op, uint64_t *slots);
static const char *xpu_status_text(int code);
static int xpu_refuse(const char *name, int status, int *said);

#include XPU_ENTRY_POINTS

/* The shim answers -1 when its client is gone (the interpreter finalized). */
static int xpu_lib_call(int op, uint64_t *slots) {
    pthread_once(&xpu_once, xpu_find_shim);
    int status = xpu_enter ? xpu_enter(XPU_LIBRARY_ID, op, slots) : -1;
    return status < 0 ? XPU_NOT_INITIALIZED : status;
}

static const char *xpu_status_text(int code) {
    for (size_t i = 0; i < sizeof xpu_status_names / sizeof xpu_status_names[0]; i++)
        if (xpu_status_names[i].code == code) return xpu_status_names[i].name;
    return "unrecognized status code";
}

/* The client's words for a call it does not forward, at its WARNING level (XPU_LOG=ERROR hides them). */
__attribute__((unused)) static int xpu_refuse(const char *name, int status, int *said) {
    const char *level = getenv("XPU_LOG");
    if (!__atomic_exchange_n(said, 1, __ATOMIC_RELAXED) && !(level && strcasecmp(level, "ERROR") == 0))
        fprintf(stderr, "xpuremote: WARNING %s is not supported by xpuremote yet (returning %s)\n", name,
                xpu_status_text(status));
    return status;
}
