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
#define XPU_FORWARD(ret, name, params, args) static ret xpu_##name params { return front->name args; }
#define XPU_FORWARD_VOID(name, params, args) static void xpu_##name params { front->name args; }
XPU_FRONT_LENT(XPU_FORWARD, XPU_FORWARD_VOID)
static int xpu_symbol_count(void) { return front->symbol_count; }
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
