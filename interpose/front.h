/* What libcuda.so.1 (shim.c, the front) lends the client core (core.c), which runs in a link-map
 * namespace of its own and so cannot resolve the front's symbols: one table, passed at start-up. */
#ifndef XPU_FRONT_H
#define XPU_FRONT_H

#include <pthread.h>
#include <stdint.h>

#define XPU_FRONT_VERSION 1

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
    void (*remember_ctx_device)(uint64_t ctx, int device);
    void (*mark_release)(int op);
    void (*set_finalized)(void);
    void (*set_python_ready)(void);
    void (*thread_init)(void);            /* the application's libc, in a thread the core made */
    /* the application's libc's thread-specific keys: see core.c */
    int (*key_create)(pthread_key_t *key, void (*destructor)(void *));
    int (*key_delete)(pthread_key_t key);
    void *(*getspecific)(pthread_key_t key);
    int (*setspecific)(pthread_key_t key, const void *value);
};

#endif
