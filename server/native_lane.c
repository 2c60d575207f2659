/* The fast lane's records, run in C (server/native_lane.py says when and why).
 *
 * The worker's Python stays the authority: it registers the ops that may run here (their driver
 * function, each argument's kind and bound, the one device range they touch), and it teaches this
 * side each handle and each range of device memory only after its own checks have passed for a
 * record that named them. It forgets everything taught whenever a handle or a range goes away. A
 * record this side cannot vouch for (an op not registered, another context, a handle or a range
 * not yet taught, a number out of bounds, a wrong shape) goes back to Python, which runs it the
 * usual way and says what is wrong with it. So a record runs here only where Python would have
 * run the same call with the same values.
 *
 * A record is a struct xpu_lane_record (protocol/records.py), its arguments (u64 each) and its blob,
 * padded to 8 bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "abi.h"

#define XPU_NATIVE_OPS 64          /* registered ops: a power of two */
#define XPU_NATIVE_HANDLES 1024    /* taught handles: a power of two; full, the table starts again */
#define XPU_NATIVE_RANGES 4096     /* taught ranges (allocations); full, the table starts again */
/* An argument's kind (XPU_NATIVE_ARG_*) and how the driver function takes the arguments (XPU_NATIVE_CALL_*)
 * are abi.h's. */

typedef int (*xpu_fn)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);
typedef int (*xpu_launch_fn)(uint64_t f, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t bx, uint32_t by,
                             uint32_t bz, uint32_t shared, uint64_t stream, void **params, void **extra);

struct xpu_native_op {
    uint32_t opcode;
    uint32_t count;
    void *fn;
    uint32_t convention;
    uint8_t kind[XPU_LANE_ARGS_MAX], family[XPU_LANE_ARGS_MAX];
    uint64_t max[XPU_LANE_ARGS_MAX];  /* an integer's largest value; a blob's, in bytes */
    int32_t address, length;         /* the device address's argument and its length's, or -1 */
    uint64_t scale;                  /* bytes per unit of the length */
    int32_t blob, blob_size;         /* the blob's argument and the one that says its size, or -1 */
};

struct xpu_native_handle { uint64_t key, value; uint32_t family, used; };

struct xpu_native {
    struct xpu_native_op ops[XPU_NATIVE_OPS];
    struct xpu_native_handle handles[XPU_NATIVE_HANDLES];
    uint32_t taught;
    uint64_t low[XPU_NATIVE_RANGES], high[XPU_NATIVE_RANGES];  /* by `low`: allocations do not overlap */
    uint32_t ranges;
};

struct xpu_native *xpu_native_new(void) { return calloc(1, sizeof(struct xpu_native)); }

void xpu_native_free(struct xpu_native *n) { free(n); }

static struct xpu_native_op *op_slot(struct xpu_native *n, uint32_t opcode) {
    uint32_t i = (opcode * 2654435761u) & (XPU_NATIVE_OPS - 1);
    for (int probe = 0; probe < XPU_NATIVE_OPS; probe++, i = (i + 1) & (XPU_NATIVE_OPS - 1))
        if (n->ops[i].opcode == opcode || !n->ops[i].fn) return &n->ops[i];
    return NULL;
}

/* 0, or -1 where the op cannot be registered (its shape, the table full). */
int xpu_native_op(struct xpu_native *n, uint32_t opcode, void *fn, uint32_t convention, uint32_t count,
                  const uint8_t *kind, const uint8_t *family, const uint64_t *max, int32_t address, int32_t length,
                  uint64_t scale, int32_t blob, int32_t blob_size) {
    struct xpu_native_op *op = op_slot(n, opcode);
    int plain = convention == XPU_NATIVE_CALL_PLAIN && count <= 8 && blob < 0;
    int launch = convention == XPU_NATIVE_CALL_LAUNCH && count == 12 && blob == 9 && blob_size == 10;
    if (!op || !fn || !(plain || launch)) return -1;
    *op = (struct xpu_native_op){.opcode = opcode, .count = count, .fn = fn, .convention = convention,
                                 .address = address, .length = length, .scale = scale, .blob = blob,
                                 .blob_size = blob_size};
    memcpy(op->kind, kind, count);
    memcpy(op->family, family, count);
    memcpy(op->max, max, count * sizeof(uint64_t));
    return 0;
}

static struct xpu_native_handle *handle_slot(struct xpu_native *n, uint64_t key) {
    uint32_t i = (uint32_t)(key >> 4) & (XPU_NATIVE_HANDLES - 1);
    for (int probe = 0; probe < XPU_NATIVE_HANDLES; probe++, i = (i + 1) & (XPU_NATIVE_HANDLES - 1))
        if (!n->handles[i].used || n->handles[i].key == key) return &n->handles[i];
    return NULL;
}

void xpu_native_forget(struct xpu_native *n) {
    memset(n->handles, 0, sizeof n->handles);
    n->taught = n->ranges = 0;
}

/* A handle Python has resolved: the client's value, its family, the driver's object. 1 where the table
 * was emptied first (kept sparse, so that a miss ends its probe soon): Python teaches it again the
 * handles every session has. */
int xpu_native_handle(struct xpu_native *n, uint64_t key, uint32_t family, uint64_t value) {
    int emptied = n->taught >= XPU_NATIVE_HANDLES / 2;
    if (emptied) {
        memset(n->handles, 0, sizeof n->handles);
        n->taught = 0;
    }
    struct xpu_native_handle *h = handle_slot(n, key);
    if (!h->used) n->taught++;
    *h = (struct xpu_native_handle){key, value, family, 1};
    return emptied;
}

/* How many taught ranges begin at or below `address`: the one that may hold it is the last of them. */
static uint32_t ranges_from(const struct xpu_native *n, uint64_t address) {
    uint32_t lo = 0, hi = n->ranges;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (n->low[mid] <= address) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* Device memory [low, high) that Python found inside the client's allocations: one allocation, kept in
 * order of `low` (PyTorch's caching allocator holds many segments; a memset may name any of them). */
void xpu_native_range(struct xpu_native *n, uint64_t low, uint64_t high) {
    uint32_t i = ranges_from(n, low);
    if (i && n->low[i - 1] == low) {  /* taught again */
        n->high[i - 1] = high;
        return;
    }
    if (n->ranges == XPU_NATIVE_RANGES) n->ranges = i = 0;
    memmove(n->low + i + 1, n->low + i, (n->ranges - i) * sizeof n->low[0]);
    memmove(n->high + i + 1, n->high + i, (n->ranges - i) * sizeof n->high[0]);
    n->low[i] = low;
    n->high[i] = high;
    n->ranges++;
}

static int in_range(const struct xpu_native *n, uint64_t address, uint64_t size) {
    uint32_t i = ranges_from(n, address);
    return i && size <= n->high[i - 1] - address && address < n->high[i - 1];
}

/* The driver's arguments for a record (its blob of `blob_len` bytes), or 0 where Python must run it. */
static int arguments(const struct xpu_native *n, const struct xpu_native_op *op, const uint64_t *in,
                     uint64_t blob_len, uint64_t *out) {
    for (uint32_t i = 0; i < op->count; i++) {
        uint64_t v = in[i];
        if (op->kind[i] == XPU_NATIVE_ARG_BLOB) {
            if (blob_len > op->max[i] || in[op->blob_size] != blob_len) return 0;
        } else if (op->kind[i] == XPU_NATIVE_ARG_INT) {
            if (v > op->max[i]) return 0;
            out[i] = v;
        } else if (v == 0) {
            out[i] = 0;
        } else {
            struct xpu_native_handle *h = handle_slot((struct xpu_native *)n, v);
            if (!h || !h->used || h->family != op->family[i]) return 0;
            out[i] = h->value;
        }
    }
    if (op->address >= 0 && in[op->address]) {
        uint64_t units = in[op->length], size;
        if (__builtin_mul_overflow(units, op->scale, &size)) return 0;
        if (!in_range(n, in[op->address], size ? size : 1)) return 0;
    }
    return 1;
}

static int call(const struct xpu_native_op *op, const uint64_t *a, const uint8_t *blob, uint64_t blob_len) {
    if (op->convention == XPU_NATIVE_CALL_PLAIN) return ((xpu_fn)op->fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
    size_t size = blob_len;
    void *extra[] = {(void *)1, (void *)blob, (void *)2, &size, NULL};  /* CU_LAUNCH_PARAM_BUFFER_*, END */
    return ((xpu_launch_fn)op->fn)(a[0], (uint32_t)a[1], (uint32_t)a[2], (uint32_t)a[3], (uint32_t)a[4],
                                   (uint32_t)a[5], (uint32_t)a[6], (uint32_t)a[7], a[8], NULL, extra);
}

/* Run the records of data[*at, len) in context `ctx` until the end, a record Python must run (*at is
 * its offset; a malformed one included: Python's reader says why), or `room` failures. Each failure:
 * its record's opcode and the driver's status. *ran counts the records run here. */
void xpu_native_run(struct xpu_native *n, const uint8_t *data, uint64_t len, uint64_t *at, uint64_t ctx,
                    uint64_t *ran, uint32_t *failed_op, int32_t *status, uint32_t room, uint32_t *failures) {
    uint64_t pos = *at;
    *failures = 0;
    const uint64_t head = sizeof(struct xpu_lane_record);
    while (len - pos >= head) {
        struct xpu_lane_record r;
        memcpy(&r, data + pos, head);
        uint32_t opcode = r.opcode, blob_len = r.blob_len, count = r.nargs;
        const struct xpu_native_op *op = op_slot(n, opcode);
        int blob_ok = op && (op->blob < 0 ? r.blob_at == XPU_LANE_NO_BLOB && !blob_len : r.blob_at == op->blob);
        if (!op || !op->fn || op->count != count || !blob_ok || r.ctx != ctx || r.scalars
            || len - pos - head < 8u * count + (uint64_t)blob_len)
            break;
        uint64_t in[XPU_LANE_ARGS_MAX], out[XPU_LANE_ARGS_MAX] = {0};
        memcpy(in, data + pos + head, 8u * count);
        if (!arguments(n, op, in, blob_len, out)) break;
        const uint8_t *blob = data + pos + head + 8u * count;
        int rc = call(op, out, blob, blob_len);
        uint64_t next = pos + head + 8u * count + (((uint64_t)blob_len + 7) & ~(uint64_t)7);
        pos = next < len ? next : len;  /* the blob's padding may run past the end, as Python reads it */
        (*ran)++;
        if (rc) {
            failed_op[*failures] = opcode;
            status[*failures] = rc;
            if (++*failures == room) break;
        }
    }
    *at = pos;
}
