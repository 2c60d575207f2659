/* Answers in C (included by shim.c, after lane.h): the questions NVIDIA's runtime asks around almost
 * every runtime call, which device a context is on and whether a device's primary context is active; and
 * whether a default stream is capturing, which PyTorch asks before allocations and events.
 * PyTorch asks them about 1,100 times in a ResNet-18 inference step; through the core each costs 2-4 µs
 * of the application's thread, here a lock and a few loads.
 *
 * The core keeps the table true: it sets it whole (xpu_known_set) after every call that makes, ends or
 * changes a context (interpose/entry.py), and at exit, when the after-the-session answers read it. The
 * answers are given while the lane is open (lane.h: a session without per-call logging, which must see
 * every call); anything the table does not hold (a context it does not know, no current
 * context, a NULL pointer) goes to the core, which answers as the driver does. */

#define XPU_KNOWN 256

static struct {
    pthread_mutex_t lock;
    uint64_t ctx[XPU_KNOWN];
    int device[XPU_KNOWN], contexts;     /* each known context's device */
    unsigned flags[XPU_KNOWN];
    int active[XPU_KNOWN], devices;      /* each device's primary context */
} xpu_known = {PTHREAD_MUTEX_INITIALIZER};

static unsigned char xpu_ask[XPU_DRIVER_OPS];  /* op -> XPU_ASK_*, marked at start-up */

static void xpu_mark_ask(int op, int kind) {
    if (op >= 0 && op < XPU_DRIVER_OPS) xpu_ask[op] = (unsigned char)kind;
}

/* The whole table at once, so that a reader never sees half of it. */
static void xpu_known_set(const uint64_t *ctx, const int *device, int contexts, const unsigned *flags,
                          const int *active, int devices) {
    contexts = contexts < XPU_KNOWN ? contexts : XPU_KNOWN;  /* the rest take the core's path */
    devices = devices < XPU_KNOWN ? devices : XPU_KNOWN;
    pthread_mutex_lock(&xpu_known.lock);
    memcpy(xpu_known.ctx, ctx, contexts * sizeof *ctx);
    memcpy(xpu_known.device, device, contexts * sizeof *device);
    memcpy(xpu_known.flags, flags, devices * sizeof *flags);
    memcpy(xpu_known.active, active, devices * sizeof *active);
    xpu_known.contexts = contexts;
    xpu_known.devices = devices;
    pthread_mutex_unlock(&xpu_known.lock);
}

/* The device of a known context, or -1. */
static int xpu_known_device(uint64_t ctx) {
    int device = -1;
    pthread_mutex_lock(&xpu_known.lock);
    for (int i = 0; i < xpu_known.contexts; i++)
        if (xpu_known.ctx[i] == ctx) {
            device = xpu_known.device[i];
            break;
        }
    pthread_mutex_unlock(&xpu_known.lock);
    return device;
}

/* cuCtxGetDevice (`of`: the _v2 form, which names the context; 0 is the current one) from the table:
 * CUDA_SUCCESS, or -1 where the core answers. */
static int xpu_answer_device(uint64_t *slots, int of) {
    uint64_t ctx = of && slots[1] ? slots[1] : xpu_ctx_current();
    int *out = (int *)(uintptr_t)slots[0];
    int device = ctx && out ? xpu_known_device(ctx) : -1;
    if (device < 0) return -1;
    *out = device;
    return CUDA_SUCCESS;
}

static int xpu_answer_primary_state(uint64_t *slots) {
    int dev = (int)(int64_t)slots[0];
    unsigned *flags = (unsigned *)(uintptr_t)slots[1];
    int *active = (int *)(uintptr_t)slots[2];
    int rc = -1;
    pthread_mutex_lock(&xpu_known.lock);
    if (flags && active && dev >= 0 && dev < xpu_known.devices) {
        *flags = xpu_known.flags[dev];
        *active = xpu_known.active[dev];
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&xpu_known.lock);
    return rc;
}

/* A call answered here while the session is up: its CUresult, or -1 where the core answers. */
static int xpu_answer_try(int op, uint64_t *slots) {
    int kind = op < XPU_DRIVER_OPS ? xpu_ask[op] : XPU_ASK_NONE;
    if (!kind || !xpu_lane.open) return -1;
    switch (kind) {
    case XPU_ASK_CURRENT:
        if (!slots[0]) return -1;
        *(uint64_t *)(uintptr_t)slots[0] = xpu_ctx_current();
        return CUDA_SUCCESS;
    case XPU_ASK_DEVICE:
    case XPU_ASK_DEVICE_OF:
        return xpu_answer_device(slots, kind == XPU_ASK_DEVICE_OF);
    case XPU_ASK_PRIMARY_STATE:
        return xpu_answer_primary_state(slots);
    case XPU_ASK_STREAM_CAPTURING:  /* (stream, &status): an open lane means no capture is under way */
        if (slots[0] > 2 || !slots[1] || !xpu_ctx_current()) return -1;  /* the core checks other streams */
        *(int *)(uintptr_t)slots[1] = 0;  /* CU_STREAM_CAPTURE_STATUS_NONE */
        return CUDA_SUCCESS;
    }
    return -1;
}
