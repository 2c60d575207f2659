/* What libcuda.so.1 (shim.c, the front) lends the client core (core.c), which runs in a link-map
 * namespace of its own and so cannot resolve the front's symbols: one table, passed at start-up. */
#ifndef XPU_FRONT_H
#define XPU_FRONT_H

#include <pthread.h>
#include <stdint.h>
#include "abi.h"  /* the records, enums and limits C shares with Python (protocol/records.py) */

#define XPU_FRONT_VERSION 15
typedef int (*xpu_dispatch_fn)(int op, uint64_t *slots);

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
    void (*lane_known)(uint64_t handle, int allow);
    size_t (*lane_take)(unsigned char *out, uint64_t *state);
    uint64_t (*lane_waiting)(void);
    uint64_t (*lane_appended)(void);
    /* descriptors kept in C (kept.h) */
    void (*kept_mark)(int library, int op, int role, int kind, int made, uint32_t opcode);
    void (*kept_lane)(int library, int op, int nargs, uint32_t scalars, int type_arg, int size, uint32_t descriptors,
                      int blob_arg, int blob_size);
    void (*kept_pack_names)(const int64_t *names);
    void (*kept_setting)(uint64_t handle, int library, int op, uint64_t value);
    int64_t (*kept_read)(uint64_t handle, struct xpu_kept_record *out, int adopt);
    int (*kept_release)(uint64_t handle);
    struct xpu_blas_pair *(*kept_blas)(uint64_t handle, int hold);
    void (*kept_learn)(int library, int op, const uint64_t *slots, const void *answer, uint64_t bytes, int32_t count);
    void (*kept_lt_names)(const uint32_t *pointers, int count, uint32_t scale_type, uint32_t pointer_mode);
    void (*kept_serve)(const struct xpu_kept_record *setting, uint64_t server);
    void (*kept_constant)(int library, int op, int32_t value);
    void (*kept_scalars_at)(const uint64_t *addresses, int64_t count);
    void (*kept_device_ranges)(const uint64_t *ranges, int64_t count);
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
