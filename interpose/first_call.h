/* The first call into the embedded client from a process where Python already runs.
 *
 * cffi's first call into an embedded module takes a process-wide spin lock that, before
 * Python 3.12, lives in PyCapsule_Type.tp_version_tag and waits for it to be 0. Once the
 * application has looked up an attribute on a capsule (PyTorch has, by its first CUDA call),
 * that field holds a method-cache tag and the lock would spin forever. So the first call
 * hides the tag (0 only makes lookups on capsules miss the cache) and puts it back after;
 * one thread at a time, so that no thread saves another's stand-in value.
 *
 * Include after Python.h; `dispatch` is the module's extern "Python" function.
 */
#ifndef XPU_FIRST_CALL_H
#define XPU_FIRST_CALL_H

#include <pthread.h>
#include <stdint.h>

typedef int (*xpu_dispatch_fn)(int op, uint64_t *slots);

static pthread_mutex_t xpu_first_call_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;

static int xpu_first_call(xpu_dispatch_fn dispatch, volatile int *ready, int op, uint64_t *slots) {
#if PY_VERSION_HEX < 0x030C0000
    pthread_mutex_lock(&xpu_first_call_lock);
    if (*ready || !Py_IsInitialized()) {  /* another thread finished it, or cffi starts Python itself */
        pthread_mutex_unlock(&xpu_first_call_lock);
        return dispatch(op, slots);
    }
    unsigned int tag = PyCapsule_Type.tp_version_tag;
    PyCapsule_Type.tp_version_tag = 0;
    int rc = dispatch(op, slots);
    if (PyCapsule_Type.tp_version_tag == 0) PyCapsule_Type.tp_version_tag = tag;
    pthread_mutex_unlock(&xpu_first_call_lock);
    return rc;
#else
    (void)ready;
    return dispatch(op, slots);
#endif
}

#endif
