/* The fast lane: the hot asynchronous calls (memsets, event records, stream waits, launches of a
 * kernel whose argument layout the client has learnt) encoded here, in C, as records appended to
 * one buffer, without entering the client core. The core sends the buffer as one `xpuLane` call of
 * its batch, in order with the calls it queued itself (it takes the records before it queues
 * anything), and the server runs each record as the call it names (docs/design.md, "The fast lane").
 *
 * The core decides everything here: which ops may take the lane and how (xpu_lane_allow, from the
 * call table), when the lane is open (no capture under way, no blocking launches; a trace stamps each record),
 * which contexts exist on the server, which kernels' layouts are known, and which handles may take it
 * (graph instantiations without host copies, whose launches need nothing of the core). A call the lane declines
 * (return -1) takes the usual path through the core, which sends the records first.
 *
 * A record is a struct xpu_lane_record (protocol/records.py), its arguments (u64 each) and its blob,
 * padded to 8 bytes.
 *
 * In a traced session (XPU_LANE_OPEN_TRACED) each record also gets a struct xpu_lane_stamp, kept apart and never
 * sent: when it was queued, the lane's time on it, its call and stream. The core takes the stamps with the
 * records and writes them into the trace (client/trace.py). Untraced, the lane reads no clock. */
#ifndef XPU_LANE_H
#define XPU_LANE_H

#include <sys/timerfd.h>
#include <time.h>

#define XPU_LANE_CONTEXTS 64
#define XPU_LANE_FUNCTIONS 8192    /* a power of two: the open-addressing table of kernels */

struct xpu_lane_op {
    uint32_t opcode;
    uint8_t kind, nargs;
    int8_t stream_arg;  /* a per-thread op's stream: 0 in it means CU_STREAM_PER_THREAD; else -1 */
    int8_t traced_stream;  /* the argument a stamp names as the stream, or -1 */
};


struct xpu_lane_kernel {  /* a kernel's argument layout, as the core learnt it */
    uint64_t server;      /* the handle the server knows it by */
    uint32_t bytes, count;
    uint32_t offset[];    /* then size[count] */
};

#define XPU_LANE_STAMPS (XPU_LANE_BYTES / sizeof(struct xpu_lane_stamp))

static struct {
    pthread_mutex_t lock;
    volatile int open;
    int traced;                               /* stamps kept: set as the lane opens (XPU_LANE_OPEN_TRACED) */
    int alarm_fd;
    struct itimerspec window;
    uint64_t appended;                        /* records over the session's life */
    uint64_t last_ctx;                        /* the context of the last record: the server's after them */
    size_t len;
    _Alignas(8) unsigned char buf[XPU_LANE_BYTES];
    uint64_t contexts[XPU_LANE_CONTEXTS];     /* on the server: the lane may name them */
    struct { uint64_t handle; struct xpu_lane_kernel *k; } kernels[XPU_LANE_FUNCTIONS];
    uint64_t known[XPU_LANE_KNOWN_HANDLES];   /* open addressing; XPU_LANE_GONE marks a forgotten one */
    uint32_t stamped;                         /* stamps of the records in buf; taken after them, so records and
                                               * stamps together fit the core's buffer of XPU_LANE_BYTES */
    struct xpu_lane_stamp stamp[XPU_LANE_STAMPS];
} xpu_lane = {.lock = PTHREAD_MUTEX_INITIALIZER, .alarm_fd = -1};

static struct xpu_lane_op xpu_lane_ops[XPU_DRIVER_OPS];

/* ---- set by the core ------------------------------------------------------------------------ */
/* stream_arg: the stream's argument, plus XPU_LANE_STREAM_NOTED where only a trace reads it (an op that is not
 * per-thread); -1: none. */
static void xpu_lane_allow(int op, uint32_t opcode, int kind, int nargs, int stream_arg) {
    int noted = stream_arg >= XPU_LANE_STREAM_NOTED;
    int stream = noted ? stream_arg - XPU_LANE_STREAM_NOTED : stream_arg;
    if (op >= 0 && op < XPU_DRIVER_OPS && nargs <= XPU_LANE_ARGS_MAX && stream < nargs)
        xpu_lane_ops[op] = (struct xpu_lane_op){opcode, (uint8_t)kind, (uint8_t)nargs, (int8_t)(noted ? -1 : stream),
                                                (int8_t)stream};
}

static uint64_t xpu_lane_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);  /* the clock of the trace's other times (Python's monotonic_ns) */
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Open (XPU_LANE_OPEN_OPEN, or _TRACED: each record stamped) with the flusher's timer (armed when the lane's
 * first record waits) and its window; or close (XPU_LANE_OPEN_CLOSED). Closing keeps `traced`: the records
 * already queued are taken with their stamps. */
static void xpu_lane_set_open(int open, int alarm_fd, uint64_t window_ns) {
    pthread_mutex_lock(&xpu_lane.lock);
    if (open) xpu_lane.traced = open == XPU_LANE_OPEN_TRACED;
    xpu_lane.alarm_fd = alarm_fd;
    xpu_lane.window.it_value.tv_sec = (time_t)(window_ns / 1000000000u);
    xpu_lane.window.it_value.tv_nsec = (long)(window_ns % 1000000000u) + (window_ns == 0);
    xpu_lane.open = open;
    pthread_mutex_unlock(&xpu_lane.lock);
}

static void xpu_lane_context(uint64_t ctx, int ready) {
    pthread_mutex_lock(&xpu_lane.lock);
    int free_at = -1;
    for (int i = 0; i < XPU_LANE_CONTEXTS; i++) {
        if (xpu_lane.contexts[i] == ctx) {
            if (!ready) xpu_lane.contexts[i] = 0;
            free_at = -2;
            break;
        }
        if (!xpu_lane.contexts[i] && free_at == -1) free_at = i;
    }
    if (ready && free_at >= 0) xpu_lane.contexts[free_at] = ctx;  /* a 65th context takes the core's path */
    pthread_mutex_unlock(&xpu_lane.lock);
}

#define XPU_LANE_GONE UINT64_MAX

/* Where `handle` is in the known handles, or the first free slot for it; -1: neither. */
static int xpu_lane_known_slot(uint64_t handle) {
    unsigned i = (unsigned)(handle >> 4) & (XPU_LANE_KNOWN_HANDLES - 1);
    int free_at = -1;
    for (int n = 0; n < XPU_LANE_KNOWN_HANDLES; n++, i = (i + 1) & (XPU_LANE_KNOWN_HANDLES - 1)) {
        if (xpu_lane.known[i] == handle) return (int)i;
        if (xpu_lane.known[i] == XPU_LANE_GONE && free_at < 0) free_at = (int)i;
        if (!xpu_lane.known[i]) return free_at >= 0 ? free_at : (int)i;
    }
    return free_at;
}

/* The core's: calls of kind KNOWN naming `handle` first may take the lane (allow), or no longer. */
static void xpu_lane_known(uint64_t handle, int allow) {
    if (!handle || handle == XPU_LANE_GONE) return;
    pthread_mutex_lock(&xpu_lane.lock);
    int i = xpu_lane_known_slot(handle);
    if (i >= 0 && allow) xpu_lane.known[i] = handle;  /* a full table: the core's path */
    else if (i >= 0 && xpu_lane.known[i] == handle) xpu_lane.known[i] = XPU_LANE_GONE;
    pthread_mutex_unlock(&xpu_lane.lock);
}

static int xpu_lane_kernel_slot(uint64_t handle) {
    unsigned i = (unsigned)(handle >> 4) & (XPU_LANE_FUNCTIONS - 1);
    for (int n = 0; n < XPU_LANE_FUNCTIONS; n++, i = (i + 1) & (XPU_LANE_FUNCTIONS - 1))
        if (xpu_lane.kernels[i].handle == handle || !xpu_lane.kernels[i].handle) return (int)i;
    return -1;
}

/* Learn a kernel's layout (count arguments at offset[i], size[i]), or forget it (count < 0): a
 * module unloaded. A layout is read only under the lock, so it is freed after it. */
static void xpu_lane_kernel(uint64_t handle, uint64_t server, int count, const uint32_t *offset,
                            const uint32_t *size, uint32_t bytes) {
    struct xpu_lane_kernel *k = NULL;
    if (count >= 0 && bytes <= XPU_LANE_BLOB_MAX) {
        k = malloc(sizeof *k + 2 * (size_t)count * sizeof(uint32_t));
        if (!k) return;
        *k = (struct xpu_lane_kernel){server, bytes, (uint32_t)count};
        memcpy(k->offset, offset, count * sizeof(uint32_t));
        memcpy(k->offset + count, size, count * sizeof(uint32_t));
    }
    pthread_mutex_lock(&xpu_lane.lock);
    int i = xpu_lane_kernel_slot(handle);
    if (i >= 0 && (k || xpu_lane.kernels[i].handle)) {
        /* a forgotten kernel keeps its slot (a tombstone with no layout): probing goes on past it */
        struct xpu_lane_kernel *old = xpu_lane.kernels[i].k;
        xpu_lane.kernels[i].handle = handle;
        xpu_lane.kernels[i].k = k;
        k = old;
    }
    pthread_mutex_unlock(&xpu_lane.lock);
    free(k);  /* the one replaced, or the new one when the table is full */
}

/* The records so far, moved into `out` (the core's buffer of XPU_LANE_BYTES), their stamps after them (at the
 * records' size, a multiple of 8); state[0]: the count of records ever appended (the flusher watches it grow),
 * state[1]: the last record's context, state[2]: the count of stamps. */
static size_t xpu_lane_take(unsigned char *out, uint64_t *state) {
    pthread_mutex_lock(&xpu_lane.lock);
    size_t n = xpu_lane.len;
    memcpy(out, xpu_lane.buf, n);
    memcpy(out + n, xpu_lane.stamp, xpu_lane.stamped * sizeof(struct xpu_lane_stamp));
    state[0] = xpu_lane.appended;
    state[1] = xpu_lane.last_ctx;
    state[2] = xpu_lane.stamped;
    xpu_lane.len = 0;
    xpu_lane.stamped = 0;
    pthread_mutex_unlock(&xpu_lane.lock);
    return n;
}

static uint64_t xpu_lane_waiting(void) { return xpu_lane.len; }
static uint64_t xpu_lane_appended(void) { return xpu_lane.appended; }

/* ---- the application's threads (the lane's lock held) ----------------------------------------- */
static int xpu_lane_context_ready(uint64_t ctx) {
    for (int i = 0; i < XPU_LANE_CONTEXTS; i++)
        if (xpu_lane.contexts[i] == ctx) return ctx != 0;
    return 0;
}

static int xpu_lane_is_known(uint64_t handle) {
    int i = handle ? xpu_lane_known_slot(handle) : -1;
    return i >= 0 && xpu_lane.known[i] == handle;
}

static const struct xpu_lane_kernel *xpu_lane_layout(uint64_t handle) {
    int i = xpu_lane_kernel_slot(handle);
    return i >= 0 && xpu_lane.kernels[i].handle == handle ? xpu_lane.kernels[i].k : NULL;
}

/* A launch's arguments as xpuLaunchKernel takes them, its argument bytes after them. */
static void xpu_lane_launch(const struct xpu_lane_kernel *k, const uint64_t *slots, uint64_t *args) {
    void **params = (void **)(uintptr_t)slots[9];
    unsigned char *blob = (unsigned char *)(args + 12);
    memset(blob, 0, (k->bytes + 7u) & ~7u);
    for (uint32_t p = 0; p < k->count; p++) memcpy(blob + k->offset[p], params[p], k->offset[k->count + p]);
    args[0] = k->server;
    memcpy(args + 1, slots + 1, 8 * sizeof(uint64_t));  /* grid, block, shared bytes, stream */
    args[9] = 0;  /* the blob */
    args[10] = k->bytes;
    args[11] = 0;
}

static void xpu_lane_grown(size_t size, int records, uint64_t ctx);

/* Whether `size` bytes of `records` more fit, with their stamps in a traced session. */
static int xpu_lane_room(size_t size, int records) {
    size_t stamps = xpu_lane.traced ? (xpu_lane.stamped + (size_t)records) * sizeof(struct xpu_lane_stamp) : 0;
    return xpu_lane.len + size + stamps <= XPU_LANE_BYTES;
}

/* A traced session's stamp of the record just appended: queued now, `began` when the lane first looked. */
static void xpu_lane_stamp(uint64_t began, uint64_t now, uint64_t stream, uint32_t opcode, int op) {
    xpu_lane.stamp[xpu_lane.stamped++] = (struct xpu_lane_stamp){.queued = now, .stream = stream, .opcode = opcode,
                                                                 .took = (uint32_t)(now - began), .op = op};
}

static int xpu_lane_append(int op, const uint64_t *slots, uint64_t ctx, uint64_t began) {
    const struct xpu_lane_op *lo = &xpu_lane_ops[op];
    if (!xpu_lane.open || !xpu_lane_context_ready(ctx)) return -1;
    const struct xpu_lane_kernel *k = NULL;
    if (lo->kind == XPU_LANE_LAUNCH) {  /* a kernel whose layout is known, given kernelParams, not `extra` */
        k = xpu_lane_layout(slots[0]);
        if (!k || slots[10] || (k->count && !slots[9])) return -1;
    } else if (lo->kind == XPU_LANE_KNOWN && !xpu_lane_is_known(slots[0])) {
        return -1;
    }
    uint32_t blob_len = k ? k->bytes : 0;
    size_t size = sizeof(struct xpu_lane_record) + lo->nargs * sizeof(uint64_t) + ((blob_len + 7u) & ~7u);
    if (!xpu_lane_room(size, 1)) return -1;
    unsigned char *at = xpu_lane.buf + xpu_lane.len;
    uint64_t *args = (uint64_t *)(at + sizeof(struct xpu_lane_record));
    if (k)
        xpu_lane_launch(k, slots, args);
    else
        memcpy(args, slots, lo->nargs * sizeof(uint64_t));
    if (lo->stream_arg >= 0 && !args[lo->stream_arg]) args[lo->stream_arg] = 2;  /* CU_STREAM_PER_THREAD */
    struct xpu_lane_record head = {.opcode = lo->opcode, .nargs = lo->nargs, .blob_at = k ? 9 : XPU_LANE_NO_BLOB,
                                   .blob_len = blob_len, .ctx = ctx};
    memcpy(at, &head, sizeof head);
    if (xpu_lane.traced)
        xpu_lane_stamp(began, xpu_lane_now(), lo->traced_stream >= 0 ? slots[lo->traced_stream] : 0, lo->opcode, op);
    xpu_lane_grown(size, 1, ctx);
    return 0;
}

/* `size` bytes of `records` more in the buffer: the flusher's timer set by the first of a batch. */
static void xpu_lane_grown(size_t size, int records, uint64_t ctx) {
    if (!xpu_lane.len && xpu_lane.alarm_fd >= 0) timerfd_settime(xpu_lane.alarm_fd, 0, &xpu_lane.window, NULL);
    xpu_lane.len += size;
    xpu_lane.appended += records;
    xpu_lane.last_ctx = ctx;
}

/* Records made elsewhere in C (kept.h's cuBLAS GEMMs and the settings before them), all or none. */
struct xpu_lane_call {
    uint32_t opcode, scalars;   /* scalars: a bit per argument holding `scalar_size` bytes of a host scalar */
    int nargs, scalar_size;
    const uint64_t *args;
    int blob_at;                /* the argument `blob`'s bytes replace, or XPU_LANE_NO_BLOB */
    uint32_t blob_len;
    const void *blob;
};

/* 0: queued in the lane; -1: the lane is closed or full, or the context is not the server's yet. */
static int xpu_lane_put_calls(const struct xpu_lane_call *calls, int n) {
    if (!xpu_lane.open) return -1;
    uint64_t began = xpu_lane.traced ? xpu_lane_now() : 0;
    uint64_t ctx = xpu_ctx_current();
    size_t size = 0;
    for (int i = 0; i < n; i++)
        size += sizeof(struct xpu_lane_record) + calls[i].nargs * sizeof(uint64_t) + ((calls[i].blob_len + 7u) & ~7u);
    pthread_mutex_lock(&xpu_lane.lock);
    int rc = -1;
    if (xpu_lane.open && xpu_lane_context_ready(ctx) && xpu_lane_room(size, n)) {
        unsigned char *at = xpu_lane.buf + xpu_lane.len;
        for (int i = 0; i < n; i++) {
            uint32_t blob_len = calls[i].blob_len, padded = (blob_len + 7u) & ~7u;
            struct xpu_lane_record head = {.opcode = calls[i].opcode, .nargs = (uint8_t)calls[i].nargs,
                                           .scalar_size = (uint8_t)calls[i].scalar_size,
                                           .blob_at = blob_len ? (uint16_t)calls[i].blob_at : XPU_LANE_NO_BLOB,
                                           .blob_len = blob_len, .scalars = calls[i].scalars, .ctx = ctx};
            memcpy(at, &head, sizeof head);
            at += sizeof head;
            memcpy(at, calls[i].args, calls[i].nargs * sizeof(uint64_t));
            at += calls[i].nargs * sizeof(uint64_t);
            memset(at, 0, padded);
            if (blob_len) memcpy(at, calls[i].blob, blob_len);
            at += padded;
        }
        if (xpu_lane.traced) {  /* one time for all: the lane's time is the last's, the application's call */
            uint64_t now = xpu_lane_now();
            for (int i = 0; i < n; i++) xpu_lane_stamp(i == n - 1 ? began : now, now, 0, calls[i].opcode, -1);
        }
        xpu_lane_grown(size, n, ctx);
        rc = 0;
    }
    pthread_mutex_unlock(&xpu_lane.lock);
    return rc;
}

/* 0: the call is queued in the lane; -1: it goes the core's way. */
static int xpu_lane_put(int op, const uint64_t *slots) {
    if (!xpu_lane.open) return -1;
    uint64_t began = xpu_lane.traced ? xpu_lane_now() : 0;
    uint64_t ctx = xpu_ctx_current();
    pthread_mutex_lock(&xpu_lane.lock);
    int rc = xpu_lane_append(op, slots, ctx, began);
    pthread_mutex_unlock(&xpu_lane.lock);
    return rc;
}

#endif
