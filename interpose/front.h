/* What libcuda.so.1 (shim.c, the front) lends the client core (core.c), which runs in a link-map
 * namespace of its own and so cannot resolve the front's symbols: one table, passed at start-up. */
#ifndef XPU_FRONT_H
#define XPU_FRONT_H

#include <pthread.h>
#include <stdint.h>

#define XPU_FRONT_VERSION 9
/* The fast lane's buffer (lane.h): full, it declines and the core sends it. Room for about ten of
 * PyTorch's foreach launches, whose argument bytes (a TensorListMetadata) are about 25 KiB each. */
#define XPU_LANE_BYTES (256 << 10)

typedef int (*xpu_dispatch_fn)(int op, uint64_t *slots);

/* A descriptor kept in C (kept.h), as the core reads it (the cdef in build.py names its fields). */
#define XPU_KEPT_INTS 18        /* a tensor's longest setting: an Nd one of 8 dimensions */
#define XPU_KEPT_DIMS 8         /* CUDNN_DIM_MAX */
#define XPU_KEPT_MADE 4         /* a cuBLASLt create's integer arguments: a layout's type, rows, columns, ld */
#define XPU_KEPT_ATTRIBUTES 12  /* a cuBLASLt descriptor's attributes, each of at most XPU_KEPT_VALUE bytes */
#define XPU_KEPT_VALUE 16
#define XPU_KEPT_PACK 16        /* a variant pack's data pointers, unique ids and workspace: elements of each */
struct xpu_kept_attribute { uint32_t name, size; unsigned char value[XPU_KEPT_VALUE]; };
struct xpu_kept_pack {                   /* cuDNN's variant pack: its attributes in kept.h's order (ids, ...) */
    int32_t finalized, set;              /* set: a bit per attribute set */
    int64_t count[3];
    uint64_t value[3 * XPU_KEPT_PACK];   /* attribute a's elements from a * XPU_KEPT_PACK */
};
struct xpu_kept_record {
    int32_t state, kind;                 /* kind: 0 a tensor, 1-3 cuBLASLt's descriptor, layout, preference, 4 a pack */
    int32_t setter, attributes;          /* a tensor's setter (kept.h's XPU_KEPT_SET_*); how many attributes */
    int64_t generation;                  /* unique to each create and set: what the core's copy is checked by */
    int32_t ints[XPU_KEPT_INTS];         /* a tensor's setting; Nd: type, count, dims at 2, strides at 10 */
    uint64_t made[XPU_KEPT_MADE];        /* a cuBLASLt create's arguments, as their slots */
    struct xpu_kept_attribute attribute[XPU_KEPT_ATTRIBUTES];
    struct xpu_kept_pack pack;
};
/* A cuBLAS handle's stream and workspace as kept.h holds them, and the core reads and writes them where they
 * lie. own: 1 while the workspace is cuBLAS's own (cublasSetStream puts it back). */
struct xpu_blas_pair { uint64_t stream, workspace, bytes, own; };

struct xpu_front {
    int version, symbol_count;
    char **environ;                       /* the application's environment now, not at exec */
    int (*requested_version)(void);
    uint64_t (*ctx_current)(void);
    void (*ctx_set_current)(uint64_t ctx);
    int (*ctx_push)(uint64_t ctx);
    uint64_t (*ctx_pop)(void);
    void (*cls_release)(uint64_t ctx);
    /* the questions answered in C (answers.h) */
    void (*known_set)(const uint64_t *ctx, const int *device, int contexts, const unsigned *flags, const int *active,
                      int devices);
    void (*mark_ask)(int op, int kind);
    void (*mark_release)(int op);
    void (*set_finalized)(void);
    void (*set_python_ready)(void);
    void (*thread_init)(void);            /* the application's libc, in a thread the core made */
    /* the application's libc's thread-specific keys: see core.c */
    int (*key_create)(pthread_key_t *key, void (*destructor)(void *));
    int (*key_delete)(pthread_key_t key);
    void *(*getspecific)(pthread_key_t key);
    int (*setspecific)(pthread_key_t key, const void *value);
    /* the fast lane (lane.h) */
    void (*lane_allow)(int op, uint32_t opcode, int kind, int nargs, int stream_arg);
    void (*lane_set_open)(int open, int alarm_fd, uint64_t window_ns);
    void (*lane_context)(uint64_t ctx, int ready);
    void (*lane_kernel)(uint64_t handle, uint64_t server, int count, const uint32_t *offset, const uint32_t *size,
                        uint32_t bytes);
    size_t (*lane_take)(unsigned char *out, uint64_t *state);
    uint64_t (*lane_waiting)(void);
    uint64_t (*lane_appended)(void);
    /* descriptors kept in C (kept.h) */
    void (*kept_mark)(int library, int op, int role, int kind, int made);
    void (*kept_pack_names)(const int64_t *names);
    void (*kept_setting)(uint64_t handle, int library, int op, uint64_t value);
    int64_t (*kept_read)(uint64_t handle, struct xpu_kept_record *out, int adopt);
    int (*kept_release)(uint64_t handle);
    struct xpu_blas_pair *(*kept_blas)(uint64_t handle, int hold);
};

/* What each of the two libcs in the process needs, compiled into both sides so that each call binds to
 * its own side's libc (pthread_create and __ctype_init resolve within the caller's namespace). */

/* glibc skips its locks (malloc's among them) while a process has started no thread through it: the
 * application's code would otherwise run on the core's threads (host functions) with its malloc
 * unlocked, and application threads call into the core before the core starts a thread of its own.
 * One thread started and joined through each libc ends that for good. */
static void *xpu_no_op(void *arg) { return arg; }
static inline void xpu_mark_multithreaded(void) {
    pthread_t t;
    if (!pthread_create(&t, NULL, xpu_no_op, NULL)) pthread_join(t, NULL);
}

/* A thread the other libc started has no character-class tables in this one (isalpha() would read
 * NULL): what this libc's own thread start does, once per thread. */
extern void __ctype_init(void);
static __thread int xpu_libc_thread_ready;
static inline void xpu_libc_thread_init(void) {
    if (!xpu_libc_thread_ready) {
        __ctype_init();
        xpu_libc_thread_ready = 1;
    }
}

#endif
