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
 * Record format: interpose/lane.h (u32 opcode, u16 count, u16 blob index, u32 blob bytes, u32
 * zero, u64 context; count u64 arguments; the blob padded to 8 bytes). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define XPU_NATIVE_ARGS 8
#define XPU_NATIVE_OPS 64          /* registered ops: a power of two */
#define XPU_NATIVE_HANDLES 1024    /* taught handles: a power of two; full, the table starts again */
#define XPU_NATIVE_RANGES 16       /* taught ranges; full, the oldest goes */
#define XPU_NO_BLOB 0xFFFF

enum { XPU_ARG_INT = 0, XPU_ARG_HANDLE = 1 };
enum { XPU_RAN_ALL = 0, XPU_TO_PYTHON = 1, XPU_FAILURES_FULL = 2 };

typedef int (*xpu_fn)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

struct xpu_native_op {
    uint32_t opcode;
    uint32_t count;
    xpu_fn fn;
    uint8_t kind[XPU_NATIVE_ARGS], family[XPU_NATIVE_ARGS];
    uint64_t max[XPU_NATIVE_ARGS];  /* an integer's largest value */
    int32_t address, length;         /* the device address's argument and its length's, or -1 */
    uint64_t scale;                  /* bytes per unit of the length */
};

struct xpu_native_handle { uint64_t key, value; uint32_t family, used; };

struct xpu_native {
    struct xpu_native_op ops[XPU_NATIVE_OPS];
    struct xpu_native_handle handles[XPU_NATIVE_HANDLES];
    uint32_t taught;
    uint64_t low[XPU_NATIVE_RANGES], high[XPU_NATIVE_RANGES];
    uint32_t ranges, next_range;
};

struct xpu_native *xpu_native_new(void) { return calloc(1, sizeof(struct xpu_native)); }

void xpu_native_free(struct xpu_native *n) { free(n); }

static struct xpu_native_op *op_slot(struct xpu_native *n, uint32_t opcode) {
    uint32_t i = (opcode * 2654435761u) & (XPU_NATIVE_OPS - 1);
    for (int probe = 0; probe < XPU_NATIVE_OPS; probe++, i = (i + 1) & (XPU_NATIVE_OPS - 1))
        if (n->ops[i].opcode == opcode || !n->ops[i].fn) return &n->ops[i];
    return NULL;
}

/* 0, or -1 where the op cannot be registered (too many arguments, the table full). */
int xpu_native_op(struct xpu_native *n, uint32_t opcode, void *fn, uint32_t count, const uint8_t *kind,
                  const uint8_t *family, const uint64_t *max, int32_t address, int32_t length, uint64_t scale) {
    struct xpu_native_op *op = op_slot(n, opcode);
    if (!op || !fn || count > XPU_NATIVE_ARGS) return -1;
    *op = (struct xpu_native_op){.opcode = opcode, .count = count, .fn = (xpu_fn)fn, .address = address,
                                 .length = length, .scale = scale};
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
    n->taught = n->ranges = n->next_range = 0;
}

/* A handle Python has resolved: the client's value, its family, the driver's object. */
void xpu_native_handle(struct xpu_native *n, uint64_t key, uint32_t family, uint64_t value) {
    if (n->taught >= XPU_NATIVE_HANDLES / 2) {  /* kept sparse, so a miss ends its probe soon */
        memset(n->handles, 0, sizeof n->handles);
        n->taught = 0;
    }
    struct xpu_native_handle *h = handle_slot(n, key);
    if (!h->used) n->taught++;
    *h = (struct xpu_native_handle){key, value, family, 1};
}

/* Device memory [low, high) that Python found inside the client's allocations. */
void xpu_native_range(struct xpu_native *n, uint64_t low, uint64_t high) {
    uint32_t i = n->ranges < XPU_NATIVE_RANGES ? n->ranges++ : (n->next_range++ % XPU_NATIVE_RANGES);
    n->low[i] = low;
    n->high[i] = high;
}

static int in_range(const struct xpu_native *n, uint64_t address, uint64_t size) {
    for (uint32_t i = 0; i < n->ranges; i++)
        if (n->low[i] <= address && size <= n->high[i] - address && address < n->high[i]) return 1;
    return 0;
}

/* The driver's arguments for a record, or 0 where Python must run it. */
static int arguments(const struct xpu_native *n, const struct xpu_native_op *op, const uint64_t *in,
                     uint64_t *out) {
    for (uint32_t i = 0; i < op->count; i++) {
        uint64_t v = in[i];
        if (op->kind[i] == XPU_ARG_INT) {
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

/* Run the records of data[*at, len) in context `ctx` until the end (XPU_RAN_ALL), a record Python
 * must run (XPU_TO_PYTHON, *at its offset, a malformed one included: Python's reader says why), or
 * `room` failures (XPU_FAILURES_FULL). Each failure: its record's opcode and the driver's status.
 * *ran counts the records run here. */
int xpu_native_run(struct xpu_native *n, const uint8_t *data, uint64_t len, uint64_t *at, uint64_t ctx,
                   uint64_t *ran, uint32_t *failed_op, int32_t *status, uint32_t room, uint32_t *failures) {
    uint64_t pos = *at;
    *failures = 0;
    while (len - pos >= 24) {
        uint32_t opcode, blob_len;
        uint16_t count, blob_at;
        uint64_t record_ctx;
        memcpy(&opcode, data + pos, 4);
        memcpy(&count, data + pos + 4, 2);
        memcpy(&blob_at, data + pos + 6, 2);
        memcpy(&blob_len, data + pos + 8, 4);
        memcpy(&record_ctx, data + pos + 16, 8);
        const struct xpu_native_op *op = op_slot(n, opcode);
        if (!op || !op->fn || op->count != count || blob_at != XPU_NO_BLOB || blob_len || record_ctx != ctx
            || len - pos - 24 < 8u * count)
            break;
        uint64_t in[XPU_NATIVE_ARGS], out[XPU_NATIVE_ARGS] = {0};
        memcpy(in, data + pos + 24, 8u * count);
        if (!arguments(n, op, in, out)) break;
        int rc = op->fn(out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]);
        pos += 24 + 8u * count;
        (*ran)++;
        if (rc) {
            failed_op[*failures] = opcode;
            status[*failures] = rc;
            if (++*failures == room) break;
        }
    }
    *at = pos;
    if (*failures == room) return XPU_FAILURES_FULL;
    return pos < len ? XPU_TO_PYTHON : XPU_RAN_ALL;
}
