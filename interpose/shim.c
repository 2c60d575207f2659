/* The C half of the shim, libcuda.so.1: what must work without entering Python.
 *
 * - every driver entry point (entry_points.c, generated) packs its arguments and calls
 *   xpu_enter(), which refuses once the session is over and otherwise enters the client
 *   core (core.c, loaded into a namespace of its own on the first call) through its one
 *   dispatch function;
 * - the hot asynchronous calls are queued here, in C, when the core allows (lane.h);
 * - cuGetProcAddress answers from the generated variant table, with no Python at all;
 * - cuGetExportTable hands out the runtime's private tables; context-local storage and
 *   the per-thread context stack live here because the runtime touches them before
 *   almost every call.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "front.h"

extern char **environ;
#define XPU_EXPORT __attribute__((visibility("default")))
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_DEINITIALIZED 4
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_SUPPORTED 801

typedef struct { const char *name; int version; int per_thread; int op; } xpu_variant;

static int xpu_enter(int op, uint64_t *slots);
static uint64_t xpu_bits_float(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static uint64_t xpu_bits_double(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }

/* implemented below, listed in the generated symbol table */
XPU_EXPORT int cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags);
XPU_EXPORT int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status);
XPU_EXPORT int cuGetExportTable(const void **table, const unsigned char *uuid);

#include "entry_points.c"

/* Operations the export tables ask of the client are numbered after the driver symbols (abi.h's XPU_OP_*); the
 * NVML functions (protocol/nvml.py order) follow them; the math libraries' functions start at XPU_OP_LIBRARY,
 * 1 << XPU_OP_LIBRARY_SHIFT ops for each (their entry points' order). */

static volatile int xpu_finalized, xpu_python_ready, xpu_start_failed, xpu_forked;
static volatile int xpu_max_requested_version;
static xpu_dispatch_fn xpu_core_dispatch;  /* the core's, once loaded */
static pthread_mutex_t xpu_start_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static struct xpu_front xpu_front_table;

/* Said once, on stderr, by the first call after the client failed to start. */
static void xpu_say_start_failed(const char *why) {
    fprintf(stderr,
            "xpuremote: ERROR the CUDA client could not start in this process: %s; every CUDA call now "
            "fails with CUDA_ERROR_NOT_INITIALIZED.\n"
            "xpuremote: the client runs in Python %s; fix: reinstall xpuremote there, or rebuild the shim "
            "(python -m xpuremote.interpose.build, which xpu-run runs).\n", why, XPU_BUILT_FOR);
}

/* A child forked after the core started: the core's interpreter and sockets did not come along in a
 * usable state (another thread may have held its GIL), and CUDA state never survives fork() anyway.
 * The child is answered here, without entering the core; said once. */
static void xpu_after_fork_child(void) { xpu_forked = 1; }

static int xpu_refuse_forked(void) {
    static volatile int said;
    if (!__sync_lock_test_and_set(&said, 1))
        fprintf(stderr, "xpuremote: ERROR CUDA was initialised before fork(); a child process cannot use its "
                "parent's GPU session, so every CUDA call here fails with CUDA_ERROR_NOT_INITIALIZED.\n"
                "xpuremote: fix: start CUDA work in the child itself (multiprocessing's 'spawn' start method).\n");
    return 1;
}

/* The core sits beside this file: libxpuremote-core.so, in a link-map namespace of its own. */
static const char *xpu_load_core(void) {
    static char path[4096];
    Dl_info self;
    if (!dladdr((void *)xpu_load_core, &self) || !self.dli_fname) return "libcuda.so.1 cannot find its own file";
    const char *slash = strrchr(self.dli_fname, '/');
    int dir = slash ? (int)(slash - self.dli_fname + 1) : 0;
    snprintf(path, sizeof path, "%.*s%s", dir, self.dli_fname, XPU_CORE_NAME);
    xpu_mark_multithreaded();
    void *core = dlmopen(LM_ID_NEWLM, path, RTLD_NOW | RTLD_LOCAL);
    if (!core) return dlerror();
    int (*start)(const struct xpu_front *) = (int (*)(const struct xpu_front *))dlsym(core, "xpu_core_start");
    xpu_dispatch_fn dispatch = (xpu_dispatch_fn)dlsym(core, "xpu_core_dispatch");
    if (!start || !dispatch) return "the client core lacks its entry points (a broken install)";
    xpu_front_table.environ = environ;
    xpu_front_table.symbol_count = xpu_symbol_count;
    if (start(&xpu_front_table)) return "its Python did not start (the error is above)";
    pthread_atfork(NULL, NULL, xpu_after_fork_child);
    xpu_core_dispatch = dispatch;
    return NULL;
}

/* The first call loads the core and starts the client; one thread at a time. cffi answers 0
 * (CUDA_SUCCESS) from a module whose initialisation failed: remember the failure, answer an error. */
static int xpu_start(int op, uint64_t *slots) {
    pthread_mutex_lock(&xpu_start_lock);
    if (!xpu_start_failed && !xpu_python_ready) {
        const char *why = xpu_core_dispatch ? NULL : xpu_load_core();
        int rc = why ? CUDA_ERROR_NOT_INITIALIZED : xpu_core_dispatch(op, slots);
        if (!xpu_python_ready) {
            xpu_start_failed = 1;
            xpu_say_start_failed(why ? why : "its Python code failed (the error is above)");
            rc = CUDA_ERROR_NOT_INITIALIZED;
        }
        pthread_mutex_unlock(&xpu_start_lock);
        return rc;
    }
    pthread_mutex_unlock(&xpu_start_lock);  /* another thread started it meanwhile, or failed to */
    return xpu_python_ready ? xpu_core_dispatch(op, slots) : CUDA_ERROR_NOT_INITIALIZED;
}

static int xpu_after_session(int op, uint64_t *slots);
static int xpu_lane_try(int op, const uint64_t *slots);
static int xpu_answer_try(int op, uint64_t *slots);
static int xpu_kept_try(int library, int op, uint64_t *slots);

static int xpu_enter(int op, uint64_t *slots) {
    if (xpu_forked && xpu_refuse_forked()) return CUDA_ERROR_NOT_INITIALIZED;
    if (xpu_finalized) return xpu_after_session(op, slots);
    if (!xpu_python_ready) return xpu_start(op, slots);
    if (!xpu_lane_try(op, slots)) return CUDA_SUCCESS;  /* queued in C (lane.h) */
    int rc = xpu_answer_try(op, slots);  /* answered in C (answers.h) */
    return rc >= 0 ? rc : xpu_core_dispatch(op, slots);
}

static int xpu_internal(int op, uint64_t *slots) { return xpu_enter(xpu_symbol_count + op, slots); }

/* The entry of xpuremote's libnvidia-ml.so.1, a plain C forwarder: NVML shares this embedded
 * client (one interpreter start, one connection to the server). Returns an nvmlReturn_t. */
XPU_EXPORT int xpu_nvml_enter(int op, uint64_t *slots) {
    if (xpu_finalized || (xpu_forked && xpu_refuse_forked()))
        return 1;  /* NVML_ERROR_UNINITIALIZED */
    int rc = xpu_internal(XPU_OP_NVML + op, slots);
    return xpu_start_failed ? 1 : rc;
}

/* The entry of xpuremote's math libraries (interpose/mathlib.c): a status of that library, or
 * -1 when there is no client (gone, or it never started). */
XPU_EXPORT int xpu_lib_enter(int library, int op, uint64_t *slots) {
    if (xpu_finalized || (xpu_forked && xpu_refuse_forked()))
        return -1;
    int rc = xpu_python_ready ? xpu_kept_try(library, op, slots) : -1;  /* answered in C (kept.h) */
    if (rc >= 0) return rc;
    rc = xpu_internal(XPU_OP_LIBRARY + (library << XPU_OP_LIBRARY_SHIFT) + op, slots);
    return xpu_start_failed ? -1 : rc;
}

/* ---- lent to the core (front.h) ------------------------------------------------------- */
static void xpu_set_finalized(void) { xpu_finalized = 1; }
/* The core's interpreter is never finalized, so its atexit would never run: the session ends
 * (goodbye to the server, the trace closed) from C's exit(), after a Python application's own
 * interpreter has finished, so PyTorch's frees at its shutdown still reach the server. */
static void xpu_at_exit(void) {
    if (!xpu_finalized && !xpu_forked) {
        uint64_t none[1] = {0};
        xpu_internal(XPU_OP_EXIT, none);
    }
}
static void xpu_set_python_ready(void) {
    xpu_python_ready = 1;
    atexit(xpu_at_exit);
}
static int xpu_requested_version(void) { return xpu_max_requested_version; }

/* ---- per-thread context stack ------------------------------------------------------ */
#define XPU_CTX_DEPTH 64
static __thread uint64_t ctx_stack[XPU_CTX_DEPTH];
static __thread int ctx_depth;

static uint64_t xpu_ctx_current(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : 0; }
static void xpu_ctx_set_current(uint64_t ctx) {
    if (ctx_depth)
        ctx_stack[ctx_depth - 1] = ctx;
    else if (ctx)
        ctx_stack[ctx_depth++] = ctx;
}
static int xpu_ctx_push(uint64_t ctx) {
    if (ctx_depth == XPU_CTX_DEPTH) return -1;
    ctx_stack[ctx_depth++] = ctx;
    return 0;
}
static uint64_t xpu_ctx_pop(void) { return ctx_depth ? ctx_stack[--ctx_depth] : 0; }

/* ---- the fast lane, and the questions answered in C ---------------------------------- */
#include "lane.h"
#include "answers.h"
#include "kept.h"

static int xpu_lane_try(int op, const uint64_t *slots) {
    return op < XPU_DRIVER_OPS && xpu_lane_ops[op].kind ? xpu_lane_put(op, slots) : -1;
}

/* ---- after the session -----------------------------------------------------------
 * The session ends at the application's exit (Python's atexit, or C's exit()), and the server
 * then releases everything it held. A program may still be tearing down: PyTorch frees tensors
 * while Python unloads its modules, and under cudaMallocAsync each free is a driver call. Those
 * calls get the truth: a release succeeds (there is nothing left to release), no primary context
 * is active, the context stack is this side's own, and a context's device is what the client told
 * this side at exit (answers.h's table). Every other call answers CUDA_ERROR_DEINITIALIZED. */

/* `name` is `family` or a version/per-thread variant of it (cuMemFreeAsync_ptsz, cuCtxDestroy_v2). */
static int xpu_family_is(const char *name, const char *family) {
    size_t n = strlen(family);
    return strncmp(name, family, n) == 0 && (name[n] == '\0' || name[n] == '_');
}

/* the ops of calls that only give something back (protocol.calls: Call.releases), marked at start-up */
static unsigned char xpu_release_ops[XPU_DRIVER_OPS];

static void xpu_mark_release(int op) {
    if (op >= 0 && op < XPU_DRIVER_OPS) xpu_release_ops[op] = 1;
}

static int xpu_after_session(int op, uint64_t *slots) {
    if (op >= xpu_symbol_count) return CUDA_ERROR_DEINITIALIZED;
    if (op < XPU_DRIVER_OPS && xpu_release_ops[op]) return CUDA_SUCCESS;
    const char *name = xpu_symbol_names[op];
    uint64_t *out = (uint64_t *)(uintptr_t)slots[0];
    if (xpu_family_is(name, "cuCtxGetCurrent")) {
        if (!out) return CUDA_ERROR_INVALID_VALUE;
        *out = xpu_ctx_current();
    } else if (xpu_family_is(name, "cuCtxSetCurrent")) {
        xpu_ctx_set_current(slots[0]);
    } else if (xpu_family_is(name, "cuCtxPushCurrent")) {
        if (xpu_ctx_push(slots[0])) return CUDA_ERROR_INVALID_VALUE;
    } else if (xpu_family_is(name, "cuCtxPopCurrent")) {
        uint64_t ctx = xpu_ctx_pop();
        if (out) *out = ctx;
    } else if (xpu_family_is(name, "cuDevicePrimaryCtxGetState")) {  /* gone with the session */
        unsigned *flags = (unsigned *)(uintptr_t)slots[1];
        int *active = (int *)(uintptr_t)slots[2];
        if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
        *flags = 0;
        *active = 0;
    } else if (xpu_family_is(name, "cuCtxGetDevice")) {  /* _v2 names the context; 0 is the current one */
        if (!out) return CUDA_ERROR_INVALID_VALUE;
        if (xpu_answer_device(slots, strcmp(name, "cuCtxGetDevice") != 0)) return CUDA_ERROR_INVALID_CONTEXT;
    } else {
        return CUDA_ERROR_DEINITIALIZED;
    }
    return CUDA_SUCCESS;
}


/* ---- cuGetProcAddress ------------------------------------------------------------- */
static int variant_cmp(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const xpu_variant *)elem)->name);
}

/* The newest variant of `per_thread` kind at or before `version`, or -1. */
static int pick_variant(const xpu_variant *v, const xpu_variant *end, int version, int per_thread) {
    int best = -1;
    for (; v < end; v++)
        if (v->per_thread == per_thread && v->version <= version
            && (best < 0 || v->version > xpu_variants[best].version))
            best = (int)(v - xpu_variants);
    return best;
}

static int proc_address(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
    if (pfn) *pfn = NULL;
    if (version > xpu_max_requested_version) xpu_max_requested_version = version;
    const xpu_variant *first = symbol && *symbol
        ? bsearch(symbol, xpu_variants, xpu_variant_count, sizeof(xpu_variant), variant_cmp) : NULL;
    if (!first) {
        if (status) *status = 1;  /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
        return CUDA_ERROR_NOT_FOUND;
    }
    const xpu_variant *end = first, *table_end = xpu_variants + xpu_variant_count;
    while (first > xpu_variants && strcmp(first[-1].name, symbol) == 0) first--;
    while (end < table_end && strcmp(end->name, symbol) == 0) end++;
    int best = (flags & 2) ? pick_variant(first, end, version, 1) : -1;  /* PER_THREAD_DEFAULT_STREAM */
    if (best < 0) best = pick_variant(first, end, version, 0);
    if (best < 0) {
        if (status) *status = 2;  /* CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT */
        return CUDA_ERROR_NOT_FOUND;
    }
    if (!pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = xpu_symbol_addrs[xpu_variants[best].op];
    if (status) *status = 0;
    return CUDA_SUCCESS;
}

XPU_EXPORT int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
    return proc_address(symbol, pfn, version, flags, status);
}

XPU_EXPORT int cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags) {
    return proc_address(symbol, pfn, version, flags, NULL);
}

/* ---- context-local storage --------------------------------------------------------- */
typedef void (*cls_dtor)(uint64_t ctx, void *key, void *value);
typedef struct { uint64_t ctx; void *key; void *value; cls_dtor dtor; } cls_entry;
static cls_entry *cls_entries;
static int cls_len, cls_cap;
static pthread_mutex_t cls_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t cls_ctx(uint64_t ctx) { return ctx ? ctx : xpu_ctx_current(); }

static int cls_find(uint64_t ctx, void *key) {
    for (int i = 0; i < cls_len; i++)
        if (cls_entries[i].ctx == ctx && cls_entries[i].key == key) return i;
    return -1;
}

static int cls_put(uint64_t ctx, void *key, void *value, cls_dtor dtor) {
    if (!(ctx = cls_ctx(ctx))) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&cls_lock);
    int i = cls_find(ctx, key);
    if (i < 0) {
        if (cls_len == cls_cap) {
            int cap = cls_cap ? cls_cap * 2 : 64;
            cls_entry *grown = realloc(cls_entries, cap * sizeof(cls_entry));
            if (!grown) { pthread_mutex_unlock(&cls_lock); return 2; /* OUT_OF_MEMORY */ }
            cls_entries = grown;
            cls_cap = cap;
        }
        i = cls_len++;
    }
    cls_entries[i] = (cls_entry){ctx, key, value, dtor};
    pthread_mutex_unlock(&cls_lock);
    return CUDA_SUCCESS;
}

static int cls_delete(uint64_t ctx, void *key) {
    if (!(ctx = cls_ctx(ctx))) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&cls_lock);
    int i = cls_find(ctx, key);
    if (i >= 0) cls_entries[i] = cls_entries[--cls_len];
    pthread_mutex_unlock(&cls_lock);
    return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static int cls_get(void **value, uint64_t ctx, void *key) {
    if (!(ctx = cls_ctx(ctx))) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&cls_lock);
    int i = cls_find(ctx, key);
    if (i >= 0 && value) *value = cls_entries[i].value;
    pthread_mutex_unlock(&cls_lock);
    return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Called from Python when a context is destroyed or a primary context reset: runs the
 * destructors the runtime registered for it, outside the lock (they may call back in). */
static void xpu_cls_release(uint64_t ctx) {
    for (;;) {
        pthread_mutex_lock(&cls_lock);
        int i;
        for (i = 0; i < cls_len && cls_entries[i].ctx != ctx; i++) {}
        if (i == cls_len) { pthread_mutex_unlock(&cls_lock); return; }
        cls_entry e = cls_entries[i];
        cls_entries[i] = cls_entries[--cls_len];
        pthread_mutex_unlock(&cls_lock);
        if (e.dtor) e.dtor(e.ctx, e.key, e.value);
    }
}

/* ---- the private export tables ---------------------------------------------------- */
static int unknown_slot(const char *table, int slot) {
    uint64_t s[2] = {(uint64_t)(uintptr_t)table, (uint64_t)slot};
    xpu_internal(XPU_OP_UNKNOWN_SLOT, s);
    return CUDA_ERROR_NOT_SUPPORTED;
}
#define UNKNOWN(table, n) static int table##_slot##n(void) { return unknown_slot(#table, n); }

static int cudart_primary_ctx(uint64_t *out, int device) {
    uint64_t s[2] = {(uint64_t)(uintptr_t)out, (uint64_t)device};
    return xpu_internal(XPU_OP_PRIMARY_CTX, s);
}
static int success_noop(void) { return CUDA_SUCCESS; }
UNKNOWN(cudart, 1) UNKNOWN(cudart, 3) UNKNOWN(cudart, 4) UNKNOWN(cudart, 5) UNKNOWN(cudart, 6)
UNKNOWN(cudart, 8) UNKNOWN(cudart, 9) UNKNOWN(cudart, 10) UNKNOWN(cudart, 11)
static void *cudart_interface[13] = {
    (void *)(13 * sizeof(void *)), (void *)cudart_slot1, (void *)cudart_primary_ctx, (void *)cudart_slot3,
    (void *)cudart_slot4, (void *)cudart_slot5, (void *)cudart_slot6, (void *)success_noop,
    (void *)cudart_slot8, (void *)cudart_slot9, (void *)cudart_slot10, (void *)cudart_slot11,
    (void *)success_noop,
};

static void *hook_buffer_a[1024], *hook_buffer_b[64];
static void hooks_buffer_a(void **buf, size_t *size) { *buf = hook_buffer_a; *size = 1024; }
static void hooks_buffer_b(void **buf, size_t *size) { *buf = hook_buffer_b; *size = 14; }
static void hooks_noop(void) {}
static void *runtime_callback_hooks[7] = {
    (void *)(7 * sizeof(void *)), (void *)hooks_noop, (void *)hooks_buffer_a, (void *)hooks_noop,
    (void *)hooks_noop, (void *)hooks_noop, (void *)hooks_buffer_b,
};

static int tools_tls_noop(void) { return CUDA_SUCCESS; }
static void *tools_tls[4] = {
    (void *)(4 * sizeof(void *)), (void *)tools_tls_noop, (void *)tools_tls_noop, (void *)tools_tls_noop,
};

static void *context_local_storage[4] = {(void *)cls_put, (void *)cls_delete, (void *)cls_get, NULL};

/* CONTEXT_CHECKS slot 2: the kind of a context, 1 for a green context's, 0 otherwise (the runtime asks
 * it when it destroys an execution context, and refuses to destroy one of kind 0). */
static int checks_ctx(uint64_t ctx, uint32_t *out, const void **out2) {
    if (out2) *out2 = NULL;
    if (xpu_finalized || !out) {
        if (out) *out = 0;
        return CUDA_SUCCESS;
    }
    uint64_t s[2] = {ctx, (uint64_t)(uintptr_t)out};
    return xpu_internal(XPU_OP_CONTEXT_KIND, s);
}
static uint32_t checks_zero(void) { return 0; }
static void *context_checks[4] = {
    (void *)(4 * sizeof(void *)), (void *)success_noop, (void *)checks_ctx, (void *)checks_zero,
};

static int integrity_check(uint32_t version, uint64_t unix_seconds, uint8_t out[16]);
static void *integrity_table[3] = {(void *)(3 * sizeof(void *)), (void *)integrity_check, (void *)success_noop};

/* The hash covers these three addresses (see client/integrity.py). */
static int integrity_check(uint32_t version, uint64_t unix_seconds, uint8_t out[16]) {
    uint64_t s[6] = {version, unix_seconds, (uint64_t)(uintptr_t)out, (uint64_t)(uintptr_t)cudart_interface,
                     (uint64_t)(uintptr_t)integrity_table, (uint64_t)(uintptr_t)integrity_check};
    return xpu_internal(XPU_OP_INTEGRITY, s);
}

/* TOOLS_CONTEXT (21318c60-...): libcudart 13.4 and later fail their initialisation without it
 * (every call then answers cudaErrorInvalidValue); cuBLAS, cuBLASLt, cuDNN and cuFFT ask for it too.
 * The runtime never reads its size and calls only slots 39 and 51, on the profiler-callback path of
 * its API entries, which runs only for an API whose flag a tool has set in the HOOKS[2] buffer: the
 * shim's stays zero, so nothing calls them. What the slots do is not known, so each one names itself
 * once and answers NOT_SUPPORTED. 95 slots: what a 595-series driver is reported to serve (the GPU
 * check's bench/driver_answers.py records the real size). */
#define UNKNOWN10(table, d) UNKNOWN(table, d##0) UNKNOWN(table, d##1) UNKNOWN(table, d##2) UNKNOWN(table, d##3) \
    UNKNOWN(table, d##4) UNKNOWN(table, d##5) UNKNOWN(table, d##6) UNKNOWN(table, d##7) UNKNOWN(table, d##8) \
    UNKNOWN(table, d##9)
#define SLOT(table, n) (void *)table##_slot##n
#define SLOT10(table, d) SLOT(table, d##0), SLOT(table, d##1), SLOT(table, d##2), SLOT(table, d##3), \
    SLOT(table, d##4), SLOT(table, d##5), SLOT(table, d##6), SLOT(table, d##7), SLOT(table, d##8), SLOT(table, d##9)
UNKNOWN(tools_context, 1) UNKNOWN(tools_context, 2) UNKNOWN(tools_context, 3) UNKNOWN(tools_context, 4)
UNKNOWN(tools_context, 5) UNKNOWN(tools_context, 6) UNKNOWN(tools_context, 7) UNKNOWN(tools_context, 8)
UNKNOWN(tools_context, 9) UNKNOWN10(tools_context, 1) UNKNOWN10(tools_context, 2) UNKNOWN10(tools_context, 3)
UNKNOWN10(tools_context, 4) UNKNOWN10(tools_context, 5) UNKNOWN10(tools_context, 6) UNKNOWN10(tools_context, 7)
UNKNOWN10(tools_context, 8) UNKNOWN(tools_context, 90) UNKNOWN(tools_context, 91) UNKNOWN(tools_context, 92)
UNKNOWN(tools_context, 93) UNKNOWN(tools_context, 94)
static void *tools_context[95] = {
    (void *)(95 * sizeof(void *)), SLOT(tools_context, 1), SLOT(tools_context, 2), SLOT(tools_context, 3),
    SLOT(tools_context, 4), SLOT(tools_context, 5), SLOT(tools_context, 6), SLOT(tools_context, 7),
    SLOT(tools_context, 8), SLOT(tools_context, 9), SLOT10(tools_context, 1), SLOT10(tools_context, 2),
    SLOT10(tools_context, 3), SLOT10(tools_context, 4), SLOT10(tools_context, 5), SLOT10(tools_context, 6),
    SLOT10(tools_context, 7), SLOT10(tools_context, 8), SLOT(tools_context, 90), SLOT(tools_context, 91),
    SLOT(tools_context, 92), SLOT(tools_context, 93), SLOT(tools_context, 94),
};

typedef struct { const unsigned char uuid[16]; void **table; } export_table;
static const export_table export_tables[] = {
    {{0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9}, cudart_interface},
    {{0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66},
     runtime_callback_hooks},
    {{0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc}, tools_tls},
    {{0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93},
     context_local_storage},
    {{0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e}, context_checks},
    {{0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2}, integrity_table},
    {{0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2}, tools_context},
};

XPU_EXPORT int cuGetExportTable(const void **table, const unsigned char *uuid) {
    if (!table || !uuid) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof export_tables / sizeof export_tables[0]; i++)
        if (memcmp(uuid, export_tables[i].uuid, 16) == 0) {
            *table = export_tables[i].table;
            return CUDA_SUCCESS;
        }
    *table = NULL;
    /* said in the client: which library asked (the caller's file), and for what */
    Dl_info caller;
    const char *file = dladdr(__builtin_return_address(0), &caller) && caller.dli_fname ? caller.dli_fname : "";
    uint64_t s[2] = {(uint64_t)(uintptr_t)uuid, (uint64_t)(uintptr_t)file};
    xpu_internal(XPU_OP_UNKNOWN_TABLE, s);
    return CUDA_ERROR_INVALID_VALUE;
}

static void xpu_thread_init(void) { xpu_libc_thread_init(); }
#define XPU_FRONT_OWN(ret, name, params, args) .name = xpu_##name,
#define XPU_FRONT_OWN_VOID(name, params, args) .name = xpu_##name,
static struct xpu_front xpu_front_table = {
    .version = XPU_FRONT_VERSION, .set_python_ready = xpu_set_python_ready,
    .key_create = pthread_key_create, .key_delete = pthread_key_delete, .getspecific = pthread_getspecific,
    .setspecific = pthread_setspecific, XPU_FRONT_LENT(XPU_FRONT_OWN, XPU_FRONT_OWN_VOID)
};
