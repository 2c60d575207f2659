/* What libcuda.so.1 (shim.c, the front) lends the client core (core.c), which runs in a link-map
 * namespace of its own and so cannot resolve the front's symbols: one table, passed at start-up. */
#ifndef XPU_FRONT_H
#define XPU_FRONT_H

#include <pthread.h>
#include <stdint.h>
#include "abi.h"  /* the records, enums and limits C shares with Python (protocol/records.py) */

#define XPU_FRONT_VERSION 17
typedef int (*xpu_dispatch_fn)(int op, uint64_t *slots);

/* What the front lends the core's Python, once: the table's members below, core.c's forwarding functions
 * (xpu_<name>), shim.c's table and build.py's cdef (read from this list) all come from it. An entry is
 * XPU_LENT(return type, name, (parameters), (arguments)) or XPU_LENT_VOID(name, (parameters), (arguments)), one a
 * line; the front's own function is xpu_<name>. */
#define XPU_FRONT_LENT(XPU_LENT, XPU_LENT_VOID) \
    XPU_LENT(int, requested_version, (void), ()) \
    XPU_LENT(uint64_t, ctx_current, (void), ()) \
    XPU_LENT_VOID(ctx_set_current, (uint64_t ctx), (ctx)) \
    XPU_LENT(int, ctx_push, (uint64_t ctx), (ctx)) \
    XPU_LENT(uint64_t, ctx_pop, (void), ()) \
    XPU_LENT_VOID(cls_release, (uint64_t ctx), (ctx)) \
    /* the questions answered in C (answers.h) */ \
    XPU_LENT_VOID(known_set, (const uint64_t *ctx, const int *device, int contexts, const unsigned *flags, \
                              const int *active, int devices), (ctx, device, contexts, flags, active, devices)) \
    XPU_LENT_VOID(mark_ask, (int op, int kind), (op, kind)) \
    XPU_LENT_VOID(mark_release, (int op), (op)) \
    XPU_LENT_VOID(set_finalized, (void), ()) \
    XPU_LENT_VOID(thread_init, (void), ()) /* the application's libc, in a thread the core made */ \
    /* the fast lane (lane.h) */ \
    XPU_LENT_VOID(lane_allow, (int op, uint32_t opcode, int kind, int nargs, int stream_arg), \
                  (op, opcode, kind, nargs, stream_arg)) \
    XPU_LENT_VOID(lane_set_open, (int open, int alarm_fd, uint64_t window_ns), (open, alarm_fd, window_ns)) \
    XPU_LENT_VOID(lane_context, (uint64_t ctx, int ready), (ctx, ready)) \
    XPU_LENT_VOID(lane_kernel, (uint64_t handle, uint64_t server, int count, const uint32_t *offset, \
                                const uint32_t *size, uint32_t bytes), (handle, server, count, offset, size, bytes)) \
    XPU_LENT_VOID(lane_known, (uint64_t handle, int allow), (handle, allow)) \
    XPU_LENT(size_t, lane_take, (unsigned char *out, uint64_t *state), (out, state)) \
    XPU_LENT(uint64_t, lane_waiting, (void), ()) \
    XPU_LENT(uint64_t, lane_appended, (void), ()) \
    /* descriptors kept in C (kept.h) */ \
    XPU_LENT_VOID(kept_mark, (int library, int op, int role, int kind, int made, uint32_t opcode), \
                  (library, op, role, kind, made, opcode)) \
    XPU_LENT_VOID(kept_lane, (int library, int op, int nargs, uint32_t scalars, int type_arg, int size, \
                              uint32_t descriptors, int blob_arg, int blob_size), \
                  (library, op, nargs, scalars, type_arg, size, descriptors, blob_arg, blob_size)) \
    XPU_LENT_VOID(kept_pack_names, (const int64_t *names), (names)) \
    XPU_LENT_VOID(kept_setting, (uint64_t handle, int library, int op, uint64_t value), (handle, library, op, value)) \
    XPU_LENT(int64_t, kept_read, (uint64_t handle, struct xpu_kept_record *out, int adopt), (handle, out, adopt)) \
    XPU_LENT(int, kept_release, (uint64_t handle), (handle)) \
    XPU_LENT(struct xpu_blas_pair *, kept_blas, (uint64_t handle, int hold), (handle, hold)) \
    XPU_LENT_VOID(kept_learn, (int library, int op, const uint64_t *slots, const void *answer, uint64_t bytes, \
                               int32_t count), (library, op, slots, answer, bytes, count)) \
    XPU_LENT_VOID(kept_lt_names, (const uint32_t *pointers, int count, uint32_t scale_type, uint32_t pointer_mode), \
                  (pointers, count, scale_type, pointer_mode)) \
    XPU_LENT_VOID(kept_serve, (const struct xpu_kept_record *setting, uint64_t server), (setting, server)) \
    XPU_LENT_VOID(kept_constant, (int library, int op, int32_t value), (library, op, value)) \
    XPU_LENT_VOID(kept_scalars_at, (const uint64_t *addresses, int64_t count), (addresses, count)) \
    XPU_LENT_VOID(kept_device_ranges, (const uint64_t *ranges, int64_t count), (ranges, count)) \
    XPU_LENT_VOID(kept_let, (int library, int op, uint64_t handle, uint64_t multiple), (library, op, handle, multiple))

#define XPU_FRONT_MEMBER(ret, name, params, args) ret (*name) params;
#define XPU_FRONT_MEMBER_VOID(name, params, args) void (*name) params;

struct xpu_front {
    int version, symbol_count;
    char **environ;                       /* the application's environment now, not at exec */
    void (*set_python_ready)(void);       /* (the core's xpu_set_python_ready marks its own side first) */
    /* the application's libc's thread-specific keys: see core.c */
    int (*key_create)(pthread_key_t *key, void (*destructor)(void *));
    int (*key_delete)(pthread_key_t key);
    void *(*getspecific)(pthread_key_t key);
    int (*setspecific)(pthread_key_t key, const void *value);
    XPU_FRONT_LENT(XPU_FRONT_MEMBER, XPU_FRONT_MEMBER_VOID)
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
