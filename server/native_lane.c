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
 * A math library's call (XPU_NATIVE_CALL_VETTED: a GEMM names several device ranges, sized by its numbers and
 * types) is run here only where Python ran a record of the same values before (its host scalars' bytes apart,
 * passed by their address in the record): Python vets each record it ran (xpu_native_vet), and everything
 * vetted is forgotten with the handles and ranges. PyTorch's steady steps repeat their GEMMs' values exactly.
 * Such a call's float and double arguments (a batch norm's epsilon and exponentialAverageFactor) go in floating
 * registers, the others in order in the integer ones.
 *
 * A cuDNN execution (XPU_NATIVE_CALL_EXECUTE: xpuCudnnExecute, a variant pack the client kept) is vetted the same
 * way; for each vetted record this side makes one real variant pack (its data pointers, a by-value scalar's
 * pointing at bytes held with the pack, unique ids, workspace; finalized), kept until the record is forgotten, and
 * each record of those values is one cudnnBackendExecute of it.
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
#define XPU_U64_32 uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t
#define XPU_F64_8 double, double, double, double, double, double, double, double
/* A VETTED call: its floats first, then its other arguments in order. On x86-64 (System V) and AArch64 a float
 * or double argument takes the next floating register and an integer or pointer the next integer register, each
 * counted apart, and only an integer past the registers goes on the stack, in order: with at most eight floats,
 * the callee finds every argument where its own prototype puts it. Extra arguments are ignored. */
typedef int (*xpu_vetted_fn)(XPU_F64_8, XPU_U64_32, XPU_U64_32, XPU_U64_32, XPU_U64_32);
_Static_assert(XPU_LANE_ARGS_MAX <= 32, "a VETTED call passes 32 arguments");
_Static_assert(XPU_NATIVE_FLOATS == 8, "a VETTED call passes 8 floating arguments");
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
    uint32_t scalars;                /* a bit per SCALAR argument: the record's `scalars` */
    uint32_t floats;                 /* a bit per FLOAT or DOUBLE argument */
    uint64_t cudnn[XPU_NATIVE_CUDNN_COUNT];  /* an EXECUTE op's cuDNN functions and constants */
};

/* cuDNN's backend API as an EXECUTE op calls it (cudnn_graph.h): a status, enums as int. */
typedef int (*xpu_cudnn_create)(int type, void **descriptor);
typedef int (*xpu_cudnn_set)(void *descriptor, int name, int type, int64_t count, const void *elements);
typedef int (*xpu_cudnn_one)(void *descriptor);  /* finalize, destroy */
typedef int (*xpu_cudnn_execute)(void *handle, void *plan, void *pack);

/* A record Python ran: its head, its arguments (host scalars' slots zeroed) and its blob; an EXECUTE record's
 * variant pack, once made, with the by-value scalars' bytes its data pointers name and the pack's destroy. */
struct xpu_native_vetted {
    uint64_t hash;
    uint32_t len;
    unsigned char *key;
    void *pack;
    uint64_t *held;
    xpu_cudnn_one destroy;
};
#define XPU_NATIVE_KEY (sizeof(struct xpu_lane_record) + 8 * XPU_LANE_ARGS_MAX + 4096)

struct xpu_native_handle { uint64_t key, value; uint32_t family, used; };

struct xpu_native {
    struct xpu_native_op ops[XPU_NATIVE_OPS];
    struct xpu_native_handle handles[XPU_NATIVE_HANDLES];
    uint32_t taught;
    uint64_t low[XPU_NATIVE_RANGES], high[XPU_NATIVE_RANGES];  /* by `low`: allocations do not overlap */
    uint32_t ranges;
    struct xpu_native_vetted vetted[XPU_NATIVE_VETTED];
    uint32_t vetted_count;
    uint64_t cudnn[XPU_NATIVE_CUDNN_COUNT];  /* cuDNN's functions and constants, for EXECUTE ops */
};

struct xpu_native *xpu_native_new(void) { return calloc(1, sizeof(struct xpu_native)); }

static void vetted_clear(struct xpu_native *n) {
    for (int i = 0; i < XPU_NATIVE_VETTED; i++) {
        struct xpu_native_vetted *v = &n->vetted[i];
        if (v->pack) v->destroy(v->pack);
        free(v->key);
        free(v->held);
    }
    memset(n->vetted, 0, sizeof n->vetted);
    n->vetted_count = 0;
}

void xpu_native_free(struct xpu_native *n) {
    if (n) vetted_clear(n);
    free(n);
}

static struct xpu_native_op *op_slot(struct xpu_native *n, uint32_t opcode) {
    uint32_t i = (opcode * 2654435761u) & (XPU_NATIVE_OPS - 1);
    for (int probe = 0; probe < XPU_NATIVE_OPS; probe++, i = (i + 1) & (XPU_NATIVE_OPS - 1))
        if (n->ops[i].opcode == opcode || !n->ops[i].fn) return &n->ops[i];
    return NULL;
}

/* cuDNN's functions and constants (`count` of them, XPU_NATIVE_CUDNN_*'s order), which EXECUTE ops registered
 * from now on call: 0, or -1 where they are not all there. */
int xpu_native_cudnn(struct xpu_native *n, const uint64_t *values, uint32_t count) {
    if (count != XPU_NATIVE_CUDNN_COUNT) return -1;
    for (int f = XPU_NATIVE_CUDNN_CREATE; f <= XPU_NATIVE_CUDNN_DESTROY; f++)
        if (!values[f]) return -1;
    memcpy(n->cudnn, values, sizeof n->cudnn);
    return 0;
}

/* An EXECUTE op's shape: xpuCudnnExecute's arguments (XPU_EXECUTE_ARG_*), its pack the blob; cuDNN's functions
 * given (xpu_native_cudnn). */
static int execute_shape(const struct xpu_native *n, uint32_t count, const uint8_t *kind, int32_t blob) {
    if (count != 5 || blob != XPU_EXECUTE_ARG_PACK || !n->cudnn[XPU_NATIVE_CUDNN_CREATE]) return 0;
    return kind[XPU_EXECUTE_ARG_HANDLE] == XPU_NATIVE_ARG_HANDLE && kind[XPU_EXECUTE_ARG_PLAN] == XPU_NATIVE_ARG_HANDLE
           && kind[XPU_EXECUTE_ARG_COUNT] == XPU_NATIVE_ARG_INT && kind[XPU_EXECUTE_ARG_WORKSPACE] == XPU_NATIVE_ARG_INT;
}

/* 0, or -1 where the op cannot be registered (its shape, the table full, an EXECUTE op before cuDNN's functions). */
int xpu_native_op(struct xpu_native *n, uint32_t opcode, void *fn, uint32_t convention, uint32_t count,
                  const uint8_t *kind, const uint8_t *family, const uint64_t *max, int32_t address, int32_t length,
                  uint64_t scale, int32_t blob, int32_t blob_size) {
    struct xpu_native_op *op = op_slot(n, opcode);
    uint32_t floats = 0, float_count = 0;
    for (uint32_t i = 0; i < count && i < XPU_LANE_ARGS_MAX; i++)
        if (kind[i] == XPU_NATIVE_ARG_FLOAT || kind[i] == XPU_NATIVE_ARG_DOUBLE) floats |= 1u << i, float_count++;
    int plain = convention == XPU_NATIVE_CALL_PLAIN && count <= 8 && blob < 0 && !floats;
    int launch = convention == XPU_NATIVE_CALL_LAUNCH && count == 12 && blob == 9 && blob_size == 10 && !floats;
    int checked = count <= XPU_LANE_ARGS_MAX && address < 0 && (blob < 0 || max[blob] <= 4096);
    int vetted = convention == XPU_NATIVE_CALL_VETTED && checked && float_count <= XPU_NATIVE_FLOATS;
    int execute = convention == XPU_NATIVE_CALL_EXECUTE && checked && !floats && execute_shape(n, count, kind, blob);
    if (!op || !fn || !(plain || launch || vetted || execute)) return -1;
    *op = (struct xpu_native_op){.opcode = opcode, .count = count, .fn = fn, .convention = convention,
                                 .address = address, .length = length, .scale = scale, .blob = blob,
                                 .blob_size = blob_size, .floats = floats};
    for (uint32_t i = 0; i < count; i++)
        if (kind[i] == XPU_NATIVE_ARG_SCALAR) op->scalars |= 1u << i;
    if (execute) memcpy(op->cudnn, n->cudnn, sizeof op->cudnn);
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
    vetted_clear(n);
}

/* The key of the record at `data` (its `count` arguments, `blob_len` bytes of blob) for `op`; its length. */
static uint32_t record_key(const struct xpu_native_op *op, const uint8_t *data, uint32_t count, uint32_t blob_len,
                           unsigned char *key) {
    const uint32_t head = sizeof(struct xpu_lane_record);
    memcpy(key, data, head + 8u * count + blob_len);
    for (uint32_t i = 0; i < count; i++)
        if (op->scalars >> i & 1) memset(key + head + 8u * i, 0, 8);
    return head + 8u * count + blob_len;
}

static uint64_t key_hash(const unsigned char *key, uint32_t len) {
    uint64_t h = 1469598103934665603ull;  /* FNV-1a */
    for (uint32_t i = 0; i < len; i++) h = (h ^ key[i]) * 1099511628211ull;
    return h;
}

/* Whether an op runs only records Python ran first. */
static int vetted_op(const struct xpu_native_op *op) {
    return op->convention == XPU_NATIVE_CALL_VETTED || op->convention == XPU_NATIVE_CALL_EXECUTE;
}

/* The entry of `key`, or the free one where it would go (its key NULL). */
static struct xpu_native_vetted *vetted_slot(struct xpu_native *n, const unsigned char *key, uint32_t len,
                                             uint64_t hash) {
    uint32_t i = (uint32_t)hash & (XPU_NATIVE_VETTED - 1);
    for (;; i = (i + 1) & (XPU_NATIVE_VETTED - 1))  /* never full: it starts over at half */
        if (!n->vetted[i].key || (n->vetted[i].hash == hash && n->vetted[i].len == len
                                  && !memcmp(n->vetted[i].key, key, len)))
            return &n->vetted[i];
}

/* The record at `data` (`len` bytes) of a VETTED op ran in Python and passed the session's checks: a record of
 * the same values may run here until everything taught is forgotten. */
void xpu_native_vet(struct xpu_native *n, const uint8_t *data, uint64_t len) {
    const uint64_t head = sizeof(struct xpu_lane_record);
    if (len < head) return;
    struct xpu_lane_record r;
    memcpy(&r, data, head);
    const struct xpu_native_op *op = op_slot(n, r.opcode);
    if (!op || !op->fn || !vetted_op(op) || op->count != r.nargs || r.blob_len > 4096
        || len < head + 8u * r.nargs + r.blob_len)
        return;
    unsigned char key[XPU_NATIVE_KEY];
    uint32_t size = record_key(op, data, r.nargs, r.blob_len, key);
    if (n->vetted_count >= XPU_NATIVE_VETTED / 2) vetted_clear(n);
    uint64_t hash = key_hash(key, size);
    struct xpu_native_vetted *v = vetted_slot(n, key, size, hash);
    if (v->key || !(v->key = malloc(size))) return;
    memcpy(v->key, key, size);
    v->hash = hash, v->len = size;
    n->vetted_count++;
}

/* The entry of a record Python ran with the values of the one at `data`, or NULL. */
static struct xpu_native_vetted *vetted_of(struct xpu_native *n, const struct xpu_native_op *op, const uint8_t *data,
                                           uint32_t count, uint32_t blob_len) {
    unsigned char key[XPU_NATIVE_KEY];
    if (blob_len > 4096) return NULL;
    uint32_t size = record_key(op, data, count, blob_len, key);
    struct xpu_native_vetted *v = vetted_slot(n, key, size, key_hash(key, size));
    return v->key ? v : NULL;
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

/* The driver's arguments for a record (its arguments at `args`, its blob of `blob_len` bytes at `blob`), or 0
 * where Python must run it. A blob and a host scalar go by their address in the record. */
static int arguments(const struct xpu_native *n, const struct xpu_native_op *op, const uint64_t *in,
                     const uint8_t *args, const uint8_t *blob, uint64_t blob_len, uint64_t *out) {
    for (uint32_t i = 0; i < op->count; i++) {
        uint64_t v = in[i];
        if (op->kind[i] == XPU_NATIVE_ARG_BLOB) {
            if (blob_len > op->max[i] || (op->blob_size >= 0 && in[op->blob_size] != blob_len)) return 0;
            out[i] = (uint64_t)(uintptr_t)blob;
        } else if (op->kind[i] == XPU_NATIVE_ARG_SCALAR) {
            out[i] = (uint64_t)(uintptr_t)(args + 8u * i);
        } else if (op->kind[i] == XPU_NATIVE_ARG_INT) {
            if (v > op->max[i]) return 0;
            out[i] = v;
        } else if (op->kind[i] == XPU_NATIVE_ARG_FLOAT) {
            out[i] = v & 0xFFFFFFFFu;  /* a float's bits, in the low half of its register as in its slot */
        } else if (op->kind[i] == XPU_NATIVE_ARG_DOUBLE) {
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

/* A VETTED call: its float and double arguments (their bits, a float's in the low half) in floating registers, in
 * order, and the rest in order after them (xpu_vetted_fn says why that is the callee's own layout). */
static int call_vetted(const struct xpu_native_op *op, const uint64_t *out) {
    double f[XPU_NATIVE_FLOATS] = {0};
    uint64_t a[32] = {0};
    if (op->floats) {
        uint32_t fs = 0, as = 0;
        for (uint32_t i = 0; i < op->count; i++)
            if (op->floats >> i & 1) memcpy(&f[fs++], &out[i], 8);
            else a[as++] = out[i];
    } else {
        memcpy(a, out, 8u * op->count);
    }
    return ((xpu_vetted_fn)op->fn)(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7],
                                   a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12],
                                   a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23],
                                   a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31]);
}

/* Whether an EXECUTE record's blob holds the pack of its count (EXECUTE_PART_*'s layout: Python's reader says what
 * is wrong with one that does not). */
static int pack_fits(const uint64_t *in, uint64_t blob_len) {
    uint64_t count = in[XPU_EXECUTE_ARG_COUNT];
    return count <= 4096 && blob_len >= 8 * count * XPU_EXECUTE_PART_BY_VALUE + count;
}

/* The variant pack of an EXECUTE record's values (`in`, its blob), made as CudaBackend.xpuCudnnExecute makes one:
 * its data pointers (a by-value scalar's pointing at its bytes, held with the pack), unique ids and workspace set,
 * finalized. 0, or the failed call's status. */
static int make_pack(const struct xpu_native_op *op, struct xpu_native_vetted *v, const uint64_t *in,
                     const uint8_t *blob) {
    const uint64_t count = in[XPU_EXECUTE_ARG_COUNT], part = 8 * count, room = part ? part : 8;
    const uint64_t *c = op->cudnn;
    uint64_t *pointers = calloc(1, room), *held = calloc(1, room), workspace = in[XPU_EXECUTE_ARG_WORKSPACE];
    int64_t *ids = calloc(1, room);
    void *pack = NULL;
    int rc = pointers && held && ids ? 0 : -1;
    if (!rc) {
        memcpy(pointers, blob + part * XPU_EXECUTE_PART_POINTERS, part);
        memcpy(ids, blob + part * XPU_EXECUTE_PART_UNIQUE_IDS, part);
        memcpy(held, blob + part * XPU_EXECUTE_PART_SCALARS, part);
        for (uint64_t e = 0; e < count; e++)
            if (blob[part * XPU_EXECUTE_PART_BY_VALUE + e]) pointers[e] = (uint64_t)(uintptr_t)(held + e);
        rc = ((xpu_cudnn_create)(uintptr_t)c[XPU_NATIVE_CUDNN_CREATE])((int)c[XPU_NATIVE_CUDNN_VARIANT_PACK], &pack);
    }
    xpu_cudnn_set set = (xpu_cudnn_set)(uintptr_t)c[XPU_NATIVE_CUDNN_SET];
    int pointer = (int)c[XPU_NATIVE_CUDNN_VOID_PTR];
    if (!rc) rc = set(pack, (int)c[XPU_NATIVE_CUDNN_DATA_POINTERS], pointer, (int64_t)count, pointers);
    if (!rc) rc = set(pack, (int)c[XPU_NATIVE_CUDNN_UNIQUE_IDS], (int)c[XPU_NATIVE_CUDNN_INT64], (int64_t)count, ids);
    if (!rc) rc = set(pack, (int)c[XPU_NATIVE_CUDNN_WORKSPACE], pointer, 1, &workspace);
    if (!rc) rc = ((xpu_cudnn_one)(uintptr_t)c[XPU_NATIVE_CUDNN_FINALIZE])(pack);
    xpu_cudnn_one destroy = (xpu_cudnn_one)(uintptr_t)c[XPU_NATIVE_CUDNN_DESTROY];
    free(pointers);
    free(ids);
    if (rc) {
        if (pack) destroy(pack);
        free(held);
        return rc;
    }
    v->pack = pack, v->held = held, v->destroy = destroy;
    return 0;
}

/* An EXECUTE record: cudnnBackendExecute(handle, plan, the pack of its values), the pack made the first time. */
static int execute(const struct xpu_native_op *op, struct xpu_native_vetted *v, const uint64_t *in,
                   const uint64_t *out, const uint8_t *blob) {
    int rc = v->pack ? 0 : make_pack(op, v, in, blob);
    if (rc) return rc;
    return ((xpu_cudnn_execute)op->fn)((void *)(uintptr_t)out[XPU_EXECUTE_ARG_HANDLE],
                                       (void *)(uintptr_t)out[XPU_EXECUTE_ARG_PLAN], v->pack);
}

static int call(const struct xpu_native_op *op, const uint64_t *a, const uint8_t *blob, uint64_t blob_len) {
    if (op->convention == XPU_NATIVE_CALL_PLAIN) return ((xpu_fn)op->fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
    if (op->convention == XPU_NATIVE_CALL_VETTED) return call_vetted(op, a);
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
        if (!op || !op->fn || op->count != count || !blob_ok || r.ctx != ctx || r.scalars != op->scalars
            || len - pos - head < 8u * count + (uint64_t)blob_len)
            break;
        struct xpu_native_vetted *v = NULL;
        if (vetted_op(op) && !(v = vetted_of(n, op, data + pos, count, blob_len))) break;
        uint64_t in[XPU_LANE_ARGS_MAX], out[XPU_LANE_ARGS_MAX] = {0};
        memcpy(in, data + pos + head, 8u * count);
        const uint8_t *blob = data + pos + head + 8u * count;
        if (!arguments(n, op, in, data + pos + head, blob, blob_len, out)) break;
        int execution = op->convention == XPU_NATIVE_CALL_EXECUTE;
        if (execution && !pack_fits(in, blob_len)) break;
        int rc = execution ? execute(op, v, in, out, blob) : call(op, out, blob, blob_len);
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
