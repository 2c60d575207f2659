/* cuDNN tensor descriptors kept in C (included by shim.c, after lane.h). PyTorch makes two or three
 * for every batch norm, pooling or activation it runs and destroys them after: a create, a setter and a
 * destroy each, 120 calls in a ResNet-18 inference step, about 12 µs apiece through the core. A
 * descriptor holds only its setting, so here it is a record in a table, and its handle is the record's.
 *
 * The core reads a record (xpu_kept_read) when a call names the descriptor: it sends the call with the
 * server's descriptor for that setting (client/mathlibs.py, `server_descriptor`). A call this table does
 * not take (another setter, a setting it cannot hold, a closed lane) goes to the core, which first takes
 * the record over (xpu_kept_adopt): from then on the handle is the core's, and its slot stays taken until
 * the core frees it (xpu_kept_release) at the destroy, so a handle is given out again only after it was
 * destroyed, as cuDNN's own memory is. The table answers while the lane is open (lane.h): a trace or
 * per-call logging must see every call. */
#ifndef XPU_KEPT_H
#define XPU_KEPT_H

#define XPU_KEPT_SLOTS 4096
#define XPU_KEPT_BASE 0x7B0000000000ull  /* below the core's own handles (client/driver.py) */
#define XPU_KEPT_INTS 18                  /* the longest setting: an Nd one of 8 dimensions */
#define XPU_KEPT_DIMS 8                   /* CUDNN_DIM_MAX */

/* What a marked op is (client/mathlibs.py names the same numbers); a record's setter is one of the SET_ */
enum { XPU_KEPT_NONE, XPU_KEPT_CREATE, XPU_KEPT_SET_ND, XPU_KEPT_SET_4D, XPU_KEPT_SET_4D_EX, XPU_KEPT_DESTROY };
enum { XPU_SLOT_FREE, XPU_SLOT_KEPT, XPU_SLOT_ADOPTED };

struct xpu_kept_record {
    int state, setter;
    int64_t generation;           /* unique to each create and set: what the core's copy is checked by */
    int32_t ints[XPU_KEPT_INTS];  /* the setter's arguments; Nd: type, count, dims at 2, strides at 10 */
};

static struct {
    pthread_mutex_t lock;
    int64_t generation;
    uint32_t fresh;               /* slots never used are taken first, then the ring of freed ones */
    uint32_t head, tail;
    uint16_t free[XPU_KEPT_SLOTS];
    struct xpu_kept_record slot[XPU_KEPT_SLOTS];
    unsigned char op[3][1 << 10]; /* library, op -> XPU_KEPT_* */
} xpu_kept = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void xpu_kept_mark(int library, int op, int kind) {
    if (library >= 0 && library < 3 && op >= 0 && op < (1 << 10)) xpu_kept.op[library][op] = (unsigned char)kind;
}

/* The record of a handle of this table, or NULL; under the lock. */
static struct xpu_kept_record *xpu_kept_find(uint64_t handle) {
    uint64_t i = (handle - XPU_KEPT_BASE) / 16;
    if (handle < XPU_KEPT_BASE || handle % 16 || i >= XPU_KEPT_SLOTS) return NULL;
    struct xpu_kept_record *r = &xpu_kept.slot[i];
    return r->state == XPU_SLOT_FREE ? NULL : r;
}

static int xpu_kept_create(uint64_t *out) {
    if (!out || (xpu_kept.fresh == XPU_KEPT_SLOTS && xpu_kept.head == xpu_kept.tail))
        return -1;  /* the table is full: the core keeps this one */
    uint32_t i = xpu_kept.fresh < XPU_KEPT_SLOTS ? xpu_kept.fresh++ : xpu_kept.free[xpu_kept.head++ % XPU_KEPT_SLOTS];
    xpu_kept.slot[i] = (struct xpu_kept_record){XPU_SLOT_KEPT, XPU_KEPT_NONE, ++xpu_kept.generation, {0}};
    *out = XPU_KEPT_BASE + 16u * i;
    return 0;
}

static int xpu_kept_set(int kind, const uint64_t *s) {
    struct xpu_kept_record *r = xpu_kept_find(s[0]);
    if (!r || r->state != XPU_SLOT_KEPT) return -1;
    int32_t v[XPU_KEPT_INTS] = {0};
    int n = kind == XPU_KEPT_SET_4D ? 6 : 9;  /* format, type, n, c, h, w; or type, n, c, h, w, 4 strides */
    if (kind == XPU_KEPT_SET_ND) {
        int dims = (int)(int64_t)s[2];
        const int32_t *size = (const int32_t *)(uintptr_t)s[3], *stride = (const int32_t *)(uintptr_t)s[4];
        if (dims < 1 || dims > XPU_KEPT_DIMS || !size || !stride) return -1;  /* the core says what is wrong */
        v[0] = (int32_t)s[1], v[1] = dims;
        memcpy(v + 2, size, dims * sizeof *size);
        memcpy(v + 2 + XPU_KEPT_DIMS, stride, dims * sizeof *stride);
    } else {
        for (int i = 0; i < n; i++) v[i] = (int32_t)s[i + 1];
    }
    r->setter = kind;
    r->generation = ++xpu_kept.generation;
    memcpy(r->ints, v, sizeof v);
    return 0;
}

static void xpu_kept_free(struct xpu_kept_record *r) {
    r->state = XPU_SLOT_FREE;
    xpu_kept.free[xpu_kept.tail++ % XPU_KEPT_SLOTS] = (uint16_t)(r - xpu_kept.slot);
}

/* A math library call answered here: its status (0, success), or -1 where the core answers. */
static int xpu_kept_try(int library, int op, uint64_t *slots) {
    int kind = library >= 0 && library < 3 && op >= 0 && op < (1 << 10) ? xpu_kept.op[library][op] : 0;
    if (!kind || !xpu_lane.open) return -1;
    pthread_mutex_lock(&xpu_kept.lock);
    int rc = -1;
    if (kind == XPU_KEPT_CREATE) {
        rc = xpu_kept_create((uint64_t *)(uintptr_t)slots[0]);
    } else if (kind == XPU_KEPT_DESTROY) {
        struct xpu_kept_record *r = xpu_kept_find(slots[0]);
        if (r && r->state == XPU_SLOT_KEPT) {
            xpu_kept_free(r);
            rc = 0;
        }
    } else {
        rc = xpu_kept_set(kind, slots);
    }
    pthread_mutex_unlock(&xpu_kept.lock);
    return rc;
}

/* ---- for the core ---------------------------------------------------------------------------- */
/* A kept descriptor's record copied out: its generation, or -1 if the table does not keep it (any more). */
static int64_t xpu_kept_read(uint64_t handle, int32_t *setter, int32_t *ints) {
    pthread_mutex_lock(&xpu_kept.lock);
    struct xpu_kept_record *r = xpu_kept_find(handle);
    int64_t generation = -1;
    if (r && r->state == XPU_SLOT_KEPT) {
        *setter = r->setter;
        memcpy(ints, r->ints, sizeof r->ints);
        generation = r->generation;
    }
    pthread_mutex_unlock(&xpu_kept.lock);
    return generation;
}

/* The core takes a kept descriptor over: its record copied out as by xpu_kept_read, its slot kept taken. */
static int64_t xpu_kept_adopt(uint64_t handle, int32_t *setter, int32_t *ints) {
    pthread_mutex_lock(&xpu_kept.lock);
    int64_t generation = -1;
    struct xpu_kept_record *r = xpu_kept_find(handle);
    if (r && r->state == XPU_SLOT_KEPT) {
        *setter = r->setter;
        memcpy(ints, r->ints, sizeof r->ints);
        generation = r->generation;
        r->state = XPU_SLOT_ADOPTED;
    }
    pthread_mutex_unlock(&xpu_kept.lock);
    return generation;
}

/* A destroyed descriptor of the table's range, kept or adopted: 1 if it was one (its slot is free again). */
static int xpu_kept_release(uint64_t handle) {
    pthread_mutex_lock(&xpu_kept.lock);
    struct xpu_kept_record *r = xpu_kept_find(handle);
    if (r) xpu_kept_free(r);
    pthread_mutex_unlock(&xpu_kept.lock);
    return r != NULL;
}

#endif
