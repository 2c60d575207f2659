/* The client core: the Python half of the shim, in a link-map namespace of its own.
 *
 * libcuda.so.1 (shim.c) loads this module with dlmopen(LM_ID_NEWLM), so it brings its own
 * libpython (the one xpuremote was installed for), its own libc and its own extension modules,
 * none of them shared with the application. Whatever Python the application runs (another
 * version, a static build, none at all) and whichever cffi is first on its path, the client
 * runs in the interpreter it was built for; and since that interpreter's GIL is not the
 * application's, a thread that holds an application lock while it calls the driver never waits
 * for a thread that holds the application's GIL (docs/design.md, "The client core").
 *
 * Two things a second libc in one process gets wrong, fixed here:
 * - thread-specific keys: each libc numbers its keys from 0 but stores their values in the one
 *   thread descriptor both share, so the core's keys would overwrite the application's. Every
 *   pthread_key_* call in this namespace binds to the definitions below (this module is the
 *   namespace's root, first in its symbol scope) and goes to the application's libc;
 * - a thread that libc did not start has no character-class tables (isalpha() would read
 *   NULL): each thread initialises them on its first call in (xpu_core_dispatch);
 * - a libc that has started no thread skips its locks: both start one first (front.h).
 */
#include <Python.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "first_call.h"
#include "front.h"

#define XPU_EXPORT __attribute__((visibility("default")))

static const struct xpu_front *front;
static volatile int xpu_python_ready;
extern char **environ;

/* ---- the application's libc's thread-specific keys ---------------------------------------- */
typedef int (*key_create_fn)(pthread_key_t *, void (*)(void *));

XPU_EXPORT int pthread_key_create(pthread_key_t *key, void (*destructor)(void *)) {
    if (front) return front->key_create(key, destructor);
    /* before start-up (a constructor of this namespace): this libc's own */
    key_create_fn own = (key_create_fn)dlsym(RTLD_NEXT, "pthread_key_create");
    return own ? own(key, destructor) : EAGAIN;
}
XPU_EXPORT int pthread_key_delete(pthread_key_t key) { return front->key_delete(key); }
XPU_EXPORT void *pthread_getspecific(pthread_key_t key) { return front->getspecific(key); }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  /* glibc marks the value access(none) */
XPU_EXPORT int pthread_setspecific(pthread_key_t key, const void *value) { return front->setspecific(key, value); }
#pragma GCC diagnostic pop

/* ---- lent by the front, called from Python (the cdef in build.py) -------------------------- */
static int xpu_symbol_count(void) { return front->symbol_count; }
static int xpu_requested_version(void) { return front->requested_version(); }
static uint64_t xpu_ctx_current(void) { return front->ctx_current(); }
static void xpu_ctx_set_current(uint64_t ctx) { front->ctx_set_current(ctx); }
static int xpu_ctx_push(uint64_t ctx) { return front->ctx_push(ctx); }
static uint64_t xpu_ctx_pop(void) { return front->ctx_pop(); }
static void xpu_cls_release(uint64_t ctx) { front->cls_release(ctx); }
static void xpu_known_set(const uint64_t *ctx, const int *device, int contexts, const unsigned *flags,
                          const int *active, int devices) {
    front->known_set(ctx, device, contexts, flags, active, devices);
}
static void xpu_mark_ask(int op, int kind) { front->mark_ask(op, kind); }
static void xpu_mark_release(int op) { front->mark_release(op); }
static void xpu_set_finalized(void) { front->set_finalized(); }
static void xpu_thread_init(void) { front->thread_init(); }
static void xpu_lane_allow(int op, uint32_t opcode, int kind, int nargs, int stream_arg) {
    front->lane_allow(op, opcode, kind, nargs, stream_arg);
}
static void xpu_lane_set_open(int open, int alarm_fd, uint64_t window_ns) { front->lane_set_open(open, alarm_fd, window_ns); }
static void xpu_lane_context(uint64_t ctx, int ready) { front->lane_context(ctx, ready); }
static void xpu_lane_kernel(uint64_t handle, uint64_t server, int count, const uint32_t *offset, const uint32_t *size,
                            uint32_t bytes) {
    front->lane_kernel(handle, server, count, offset, size, bytes);
}
static void xpu_lane_known(uint64_t handle, int allow) { front->lane_known(handle, allow); }
static size_t xpu_lane_take(unsigned char *out, uint64_t *state) { return front->lane_take(out, state); }
static uint64_t xpu_lane_waiting(void) { return front->lane_waiting(); }
static uint64_t xpu_lane_appended(void) { return front->lane_appended(); }
static void xpu_kept_mark(int library, int op, int role, int kind, int made, uint32_t opcode) {
    front->kept_mark(library, op, role, kind, made, opcode);
}
static void xpu_kept_lane(int library, int op, int nargs, uint32_t scalars, int type_arg, int size,
                          uint32_t descriptors, int blob_arg, int blob_size) {
    front->kept_lane(library, op, nargs, scalars, type_arg, size, descriptors, blob_arg, blob_size);
}
static void xpu_kept_pack_names(const int64_t *names) { front->kept_pack_names(names); }
static void xpu_kept_setting(uint64_t handle, int library, int op, uint64_t value) {
    front->kept_setting(handle, library, op, value);
}
static int64_t xpu_kept_read(uint64_t handle, struct xpu_kept_record *out, int adopt) {
    return front->kept_read(handle, out, adopt);
}
static int xpu_kept_release(uint64_t handle) { return front->kept_release(handle); }
static struct xpu_blas_pair *xpu_kept_blas(uint64_t handle, int hold) { return front->kept_blas(handle, hold); }
static void xpu_kept_learn(int library, int op, const uint64_t *slots, const void *answer, uint64_t bytes,
                           int32_t count) {
    front->kept_learn(library, op, slots, answer, bytes, count);
}
static void xpu_kept_lt_names(const uint32_t *pointers, int count, uint32_t scale_type, uint32_t pointer_mode) {
    front->kept_lt_names(pointers, count, scale_type, pointer_mode);
}
static void xpu_kept_serve(const struct xpu_kept_record *setting, uint64_t server) {
    front->kept_serve(setting, server);
}
static void xpu_kept_constant(int library, int op, int32_t value) { front->kept_constant(library, op, value); }
static void xpu_kept_scalars_at(const uint64_t *addresses, int64_t count) { front->kept_scalars_at(addresses, count); }
static void xpu_kept_device_ranges(const uint64_t *ranges, int64_t count) { front->kept_device_ranges(ranges, count); }
static void xpu_set_python_ready(void) {
    xpu_python_ready = 1;
    front->set_python_ready();
}

/* ---- start-up -------------------------------------------------------------------------------- */
/* This namespace's libc read the environment at exec; the application may have changed it since
 * (CUDA_VISIBLE_DEVICES set by the program before its first CUDA call). A copy of its own. */
static void xpu_copy_environment(char **from) {
    size_t n = 0;
    while (from[n]) n++;
    char **copy = calloc(n + 1, sizeof(char *));
    if (!copy) return;
    for (size_t i = 0; i < n; i++) copy[i] = strdup(from[i]);
    environ = copy;
}

/* Python as `XPU_PYTHON` itself starts (its prefix, its venv, its site-packages), isolated from
 * the application's PYTHON* variables, and leaving signal handlers to the application. */
static int xpu_start_python(void) {
    PyConfig config;
    PyConfig_InitIsolatedConfig(&config);
    config.install_signal_handlers = 0;
    PyStatus status = PyConfig_SetBytesString(&config, &config.program_name, XPU_PYTHON);
    if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) {
        fprintf(stderr, "xpuremote: ERROR Python %s did not start: %s\n", XPU_PYTHON,
                status.err_msg ? status.err_msg : "(no reason given)");
        return -1;
    }
    if (PyRun_SimpleString(XPU_PYTHON_SITE) != 0)  /* the error is printed; the first call says so */
        fprintf(stderr, "xpuremote: ERROR could not add xpuremote's folders to Python's path\n");
    PyEval_SaveThread();  /* the GIL is taken by each call in, from any thread */
    return 0;
}

/* Called once by the front, before any call in. 0: Python runs; the client itself starts on
 * the first xpu_core_dispatch (cffi's embedding init, build.py's INIT). */
XPU_EXPORT int xpu_core_start(const struct xpu_front *lent) {
    if (lent->version != XPU_FRONT_VERSION) {
        fprintf(stderr, "xpuremote: ERROR libcuda.so.1 and the client core are from different builds\n");
        return -1;
    }
    front = lent;
    xpu_mark_multithreaded();
    xpu_copy_environment(lent->environ);
    return xpu_start_python();
}

XPU_EXPORT int xpu_core_dispatch(int op, uint64_t *slots) {
    xpu_libc_thread_init();
    if (!xpu_python_ready) return xpu_first_call(xpu_dispatch, &xpu_python_ready, op, slots);
    return xpu_dispatch(op, slots);
}
