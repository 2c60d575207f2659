/* The trace's records (protocol/trace.py), after the header, read straight into columns for xpu-perf.
 *
 * The input is the decompressed stream after the header map: msgpack arrays, one a record. xpu_trace_read walks
 * it twice with the same code: first to count (out NULL), then to fill the columns the caller sized from the
 * counts. A record cut short at the end (the process killed while writing) ends the reading there, as the Python
 * reader's Unpacker does; a complete record that is not what the format says is an error, with its number and
 * offset in `counts->error`, never a read out of bounds.
 *
 * The record kinds, the tick, and the number of call classes and message kinds come from the build
 * (trace.py's _macros), not typed here again.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define NAME XPU_REC_NAME
#define CALL XPU_REC_CALL
#define MESSAGE XPU_REC_MESSAGE
#define END XPU_REC_END
#define GPU XPU_REC_GPU
#define GPU_OPS XPU_REC_GPU_OPS
#define TICK_NS XPU_TICK_NS
#define N_CLASSES XPU_N_CLASSES
#define N_KINDS XPU_N_KINDS

/* cffi: begin */
struct xpu_trace_counts {
    int64_t names, calls, messages, items, gpus, op_records, ops;
    int64_t end;     /* ns; valid where has_end */
    int32_t has_end;
    size_t used;     /* bytes of complete records */
    int64_t record;  /* the record an error is in */
    size_t error_at; /* its offset */
    char error[160];
};

struct xpu_trace_columns {
    int64_t *name_id, *name_at, *name_len;
    int64_t *call_name, *call_entry, *call_ret, *call_stream, *call_seq, *call_pos;
    int8_t *call_cls, *call_lane;
    int64_t *msg_seq, *msg_sent, *msg_up, *msg_n, *msg_wait, *msg_down, *msg_server, *msg_items;
    int8_t *msg_kind, *msg_server_nil, *msg_items_nil;
    int64_t *item;
    int8_t *item_nil;
    int64_t *gpu_seq, *gpu_ns;
    int64_t *ops_seq, *ops_n, *ops; /* ops: four numbers an operation, the records' in file order */
};

int xpu_trace_read(const uint8_t *data, size_t n, struct xpu_trace_counts *c, struct xpu_trace_columns *out);
/* cffi: end */

struct rd {
    const uint8_t *p, *end;
};

enum { OK = 0, BAD = -1, SHORT = -2 }; /* a record's reader returns how many of its items it read, or these */

static uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* How many bytes the head of the value at p takes, and the counts of the values and payload bytes after it:
 * OK, SHORT where the data ends first, BAD for the one byte msgpack never uses. */
static int head(const uint8_t *p, const uint8_t *end, size_t *size, uint64_t *values, uint64_t *bytes) {
    uint8_t t = *p;
    size_t avail = (size_t)(end - p);
    *values = 0;
    *bytes = 0;
    *size = 1;
    if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) return OK;
    if (t >= 0x80 && t <= 0x8f) { *values = 2u * (t & 0x0f); return OK; }
    if (t >= 0x90 && t <= 0x9f) { *values = t & 0x0f; return OK; }
    if (t >= 0xa0 && t <= 0xbf) { *bytes = t & 0x1f; return OK; }
    int len = 0, kind = 0; /* kind: 0 a scalar of len bytes, 1 bytes after a len-byte length, 2 array, 3 map, 4 ext */
    switch (t) {
    case 0xc1: return BAD;
    case 0xc4: case 0xd9: len = 1; kind = 1; break;
    case 0xc5: case 0xda: len = 2; kind = 1; break;
    case 0xc6: case 0xdb: len = 4; kind = 1; break;
    case 0xc7: len = 1; kind = 4; break;
    case 0xc8: len = 2; kind = 4; break;
    case 0xc9: len = 4; kind = 4; break;
    case 0xca: case 0xce: case 0xd2: len = 4; break;
    case 0xcb: case 0xcf: case 0xd3: len = 8; break;
    case 0xcc: case 0xd0: len = 1; break;
    case 0xcd: case 0xd1: len = 2; break;
    case 0xd4: *bytes = 2; return OK; /* fixext: a type byte and 1..16 */
    case 0xd5: *bytes = 3; return OK;
    case 0xd6: *bytes = 5; return OK;
    case 0xd7: *bytes = 9; return OK;
    case 0xd8: *bytes = 17; return OK;
    case 0xdc: len = 2; kind = 2; break;
    case 0xdd: len = 4; kind = 2; break;
    case 0xde: len = 2; kind = 3; break;
    case 0xdf: len = 4; kind = 3; break;
    default: return BAD;
    }
    if (kind == 0) { *bytes = (uint64_t)len; return OK; }
    if (avail < 1 + (size_t)len) return SHORT;
    uint64_t n = be(p + 1, len);
    *size = 1 + (size_t)len;
    if (kind == 1) *bytes = n;
    else if (kind == 2) *values = n;
    else if (kind == 3) *values = 2 * n;
    else *bytes = n + 1;
    return OK;
}

/* Past `pending` complete values: OK, SHORT (the data ends inside it) or BAD. A container adds its items to the values
 * still to pass, so no nesting needs a stack. */
static int skip(struct rd *r, uint64_t pending) {
    const uint8_t *p = r->p, *end = r->end;
    while (pending) {
        if (p >= end) return SHORT;
        uint8_t t = *p;
        pending--;
        if (t <= 0x7f || t >= 0xe0 || t == 0xc0) { p++; continue; } /* the common: small numbers, nil */
        if ((t & 0xf0) == 0x90) { pending += t & 0x0f; p++; continue; }
        size_t size;
        uint64_t values, bytes;
        int rc = head(p, end, &size, &values, &bytes);
        if (rc != OK) return rc;
        if ((size_t)(end - p) < size || (uint64_t)(end - p - size) < bytes) return SHORT;
        p += size + bytes;
        pending += values;
    }
    r->p = p;
    return OK;
}

/* The readers of a value of the type the format says: OK, SHORT where the data ends inside it, BAD where it is of
 * another type. */
static int get_nil(struct rd *r) {
    if (r->p >= r->end || *r->p != 0xc0) return 0;
    r->p++;
    return 1;
}

static int get_int(struct rd *r, int64_t *v) {
    if (r->p >= r->end) return SHORT;
    uint8_t t = *r->p;
    const uint8_t *p = r->p + 1;
    size_t left = (size_t)(r->end - p);
    if (t <= 0x7f) { *v = t; r->p = p; return OK; }
    if (t >= 0xe0) { *v = (int8_t)t; r->p = p; return OK; }
    int n = t == 0xcc || t == 0xd0 ? 1 : t == 0xcd || t == 0xd1 ? 2 : t == 0xce || t == 0xd2 ? 4 :
            t == 0xcf || t == 0xd3 ? 8 : 0;
    if (n == 0) return BAD;
    if (left < (size_t)n) return SHORT;
    uint64_t u = be(p, n);
    r->p = p + n;
    switch (t) {
    case 0xcf:
        if (u > (uint64_t)INT64_MAX) return BAD;
        *v = (int64_t)u;
        return OK;
    case 0xd0: *v = (int8_t)u; return OK;
    case 0xd1: *v = (int16_t)u; return OK;
    case 0xd2: *v = (int32_t)u; return OK;
    case 0xd3: *v = (int64_t)u; return OK;
    default: *v = (int64_t)u; return OK; /* 0xcc, 0xcd, 0xce */
    }
}

static int get_array(struct rd *r, uint64_t *n) {
    if (r->p >= r->end) return SHORT;
    uint8_t t = *r->p;
    size_t left = (size_t)(r->end - r->p);
    if (t >= 0x90 && t <= 0x9f) { *n = t & 0x0f; r->p++; return OK; }
    int len = t == 0xdc ? 2 : t == 0xdd ? 4 : 0;
    if (len == 0) return BAD;
    if (left < 1 + (size_t)len) return SHORT;
    *n = be(r->p + 1, len);
    r->p += 1 + len;
    return OK;
}

static int get_str(struct rd *r, const uint8_t **s, uint64_t *n) {
    if (r->p >= r->end) return SHORT;
    uint8_t t = *r->p;
    size_t size;
    uint64_t values;
    if (!((t >= 0xa0 && t <= 0xbf) || t == 0xd9 || t == 0xda || t == 0xdb)) return BAD;
    int rc = head(r->p, r->end, &size, &values, n);
    if (rc != OK) return rc;
    if ((size_t)(r->end - r->p) < size || (uint64_t)(r->end - r->p - size) < *n) return SHORT;
    *s = r->p + size;
    r->p += size + *n;
    return OK;
}

struct reading {
    struct xpu_trace_counts *c;
    struct xpu_trace_columns *out;
    const uint8_t *start;
    int64_t last_call, last_message; /* ticks: the times are differences from the previous record's */
};

static int fail(struct reading *g, const char *what) {
    snprintf(g->c->error, sizeof g->c->error, "%s", what);
    return BAD;
}

static int ticks_ns(int64_t ticks, int64_t *ns) {
    return __builtin_mul_overflow(ticks, (int64_t)TICK_NS, ns) ? BAD : OK;
}

/* a value of its type, or the record's reader returns: SHORT as it is, anything else as the error `what` */
#define GET(call, what) do { int rc_ = (call); if (rc_ != OK) return rc_ == SHORT ? SHORT : fail(g, what); } while (0)
#define INT(var) GET(get_int(r, &(var)), "a number expected")
#define NS(var, ticks) do { if (ticks_ns((ticks), &(var)) != OK) return fail(g, "a time out of range"); } while (0)

static int name(struct reading *g, struct rd *r, uint64_t len) {
    int64_t id;
    const uint8_t *s;
    uint64_t n;
    if (len < 3) return fail(g, "a NAME record of fewer than 3 items");
    INT(id);
    GET(get_str(r, &s, &n), "a NAME record whose name is not a string");
    int64_t i = g->c->names++;
    if (g->out) {
        g->out->name_id[i] = id;
        g->out->name_at[i] = (int64_t)(s - g->start);
        g->out->name_len[i] = (int64_t)n;
    }
    return 3;
}

static int call(struct reading *g, struct rd *r, uint64_t len) {
    int64_t id, cls, d_entry, dur, stream, seq, pos, lane = 0, entry, ret, dur_ns;
    if (len < 8) return fail(g, "a CALL record of fewer than 8 items");
    INT(id);
    INT(cls);
    INT(d_entry);
    INT(dur);
    INT(stream);
    INT(seq);
    INT(pos);
    if (len > 8 && !get_nil(r)) {
        if (r->p < r->end && (*r->p == 0xc2 || *r->p == 0xc3)) lane = *r->p++ == 0xc3;
        else INT(lane);
    }
    if (cls < 0 || cls >= N_CLASSES) return fail(g, "a CALL record of an unknown class");
    if (__builtin_add_overflow(g->last_call, d_entry, &g->last_call)) return fail(g, "a time out of range");
    NS(entry, g->last_call);
    NS(dur_ns, dur);
    if (__builtin_add_overflow(entry, dur_ns, &ret)) return fail(g, "a time out of range");
    int64_t i = g->c->calls++;
    if (g->out) {
        struct xpu_trace_columns *o = g->out;
        o->call_name[i] = id;
        o->call_cls[i] = (int8_t)cls;
        o->call_entry[i] = entry;
        o->call_ret[i] = ret;
        o->call_stream[i] = stream;
        o->call_seq[i] = seq;
        o->call_pos[i] = pos;
        o->call_lane[i] = lane != 0;
    }
    return len > 8 ? 9 : 8;
}

static int message(struct reading *g, struct rd *r, uint64_t len) {
    int64_t seq, kind, d_sent, up, n, wait, down, server = 0, sent, items = 0;
    uint64_t count = 0;
    int server_nil, items_nil;
    if (len != 10) return fail(g, "a MESSAGE record not of 10 items");
    INT(seq);
    INT(kind);
    INT(d_sent);
    INT(up);
    INT(n);
    INT(wait);
    INT(down);
    if (!(server_nil = get_nil(r))) INT(server);
    if (kind < 0 || kind >= N_KINDS) return fail(g, "a MESSAGE record of an unknown kind");
    if (__builtin_add_overflow(g->last_message, d_sent, &g->last_message)) return fail(g, "a time out of range");
    NS(sent, g->last_message);
    NS(wait, wait);
    NS(server, server);
    if (!(items_nil = get_nil(r))) GET(get_array(r, &count), "a MESSAGE record whose per_call is not an array");
    int64_t first = g->c->items;
    for (uint64_t k = 0; k < count; k++, items++) {
        int64_t t = 0;
        int nil = get_nil(r);
        if (!nil) {
            GET(get_int(r, &t), "a per_call item not a number");
            NS(t, t);
        }
        if (g->out) {
            g->out->item[first + items] = t;
            g->out->item_nil[first + items] = (int8_t)nil;
        }
    }
    g->c->items += items;
    int64_t i = g->c->messages++;
    if (g->out) {
        struct xpu_trace_columns *o = g->out;
        o->msg_seq[i] = seq;
        o->msg_kind[i] = (int8_t)kind;
        o->msg_sent[i] = sent;
        o->msg_up[i] = up;
        o->msg_n[i] = n;
        o->msg_wait[i] = wait;
        o->msg_down[i] = down;
        o->msg_server[i] = server;
        o->msg_server_nil[i] = (int8_t)server_nil;
        o->msg_items[i] = items;
        o->msg_items_nil[i] = (int8_t)items_nil;
    }
    return 10;
}

static int gpu(struct reading *g, struct rd *r, uint64_t len) {
    int64_t seq, ticks, ns;
    if (len < 3) return fail(g, "a GPU record of fewer than 3 items");
    INT(seq);
    INT(ticks);
    NS(ns, ticks);
    int64_t i = g->c->gpus++;
    if (g->out) {
        g->out->gpu_seq[i] = seq;
        g->out->gpu_ns[i] = ns;
    }
    return 3;
}

static int gpu_ops(struct reading *g, struct rd *r, uint64_t len) {
    int64_t seq;
    uint64_t count;
    if (len < 3) return fail(g, "a GPU_OPS record of fewer than 3 items");
    INT(seq);
    GET(get_array(r, &count), "a GPU_OPS record whose operations are not an array");
    int64_t first = g->c->ops * 4, whole = (int64_t)(count / 4) * 4; /* a partial last operation is left out */
    for (int64_t k = 0; k < (int64_t)count; k++) {
        int64_t v;
        GET(get_int(r, &v), "a GPU operation's number expected");
        if (g->out && k < whole) g->out->ops[first + k] = v;
    }
    int64_t i = g->c->op_records++;
    g->c->ops += whole / 4;
    if (g->out) {
        g->out->ops_seq[i] = seq;
        g->out->ops_n[i] = whole / 4;
    }
    return 3;
}

static int end(struct reading *g, struct rd *r, uint64_t len) {
    int64_t span;
    if (len < 2) return fail(g, "an END record of fewer than 2 items");
    INT(span);
    NS(g->c->end, span);
    g->c->has_end = 1;
    return 2;
}

/* One record, its items past those the format names (which the Python reader ignores) passed over. */
static int record(struct reading *g, struct rd *r) {
    uint64_t len;
    int64_t kind;
    int read;
    GET(get_array(r, &len), "a record that is not an array");
    if (len == 0) return fail(g, "an empty record");
    GET(get_int(r, &kind), "a record whose kind is not a number");
    switch (kind) {
    case NAME: read = name(g, r, len); break;
    case CALL: read = call(g, r, len); break;
    case MESSAGE: read = message(g, r, len); break;
    case GPU: read = gpu(g, r, len); break;
    case GPU_OPS: read = gpu_ops(g, r, len); break;
    case END: read = end(g, r, len); break;
    default:
        snprintf(g->c->error, sizeof g->c->error, "unknown record kind %lld", (long long)kind);
        return BAD;
    }
    return read < 0 ? read : skip(r, len - (uint64_t)read);
}

/* What a record adds to the counts, taken back where it turns out cut short (its items past the format's last). */
struct tally {
    int64_t names, calls, messages, items, gpus, op_records, ops, end;
    int32_t has_end;
};

static struct tally tally_of(const struct xpu_trace_counts *c) {
    struct tally t = {c->names, c->calls, c->messages, c->items, c->gpus, c->op_records, c->ops, c->end, c->has_end};
    return t;
}

static void untally(struct xpu_trace_counts *c, struct tally t) {
    c->names = t.names, c->calls = t.calls, c->messages = t.messages, c->items = t.items, c->gpus = t.gpus;
    c->op_records = t.op_records, c->ops = t.ops, c->end = t.end, c->has_end = t.has_end;
}

/* Reads the records of data[0, n) into `out`, or (out NULL) counts them; 0, or -1 with counts->error said. A record
 * the data ends inside ends the reading (cut short); one that is whole and not as the format says is an error.
 * The fill is given n = counts->used of the count: its records are known whole. */
int xpu_trace_read(const uint8_t *data, size_t n, struct xpu_trace_counts *c, struct xpu_trace_columns *out) {
    struct reading g = {c, out, data, 0, 0};
    const uint8_t *at = data, *end = data + n;
    memset(c, 0, sizeof *c);
    while (at < end) {
        struct rd r = {at, end};
        struct tally before = tally_of(c);
        c->error_at = (size_t)(at - data);
        int rc = record(&g, &r);
        if (rc == BAD) {
            struct rd whole = {at, end}; /* a record cut short may look wrong before its end */
            rc = skip(&whole, 1);
            if (rc != SHORT) {
                if (rc == BAD) snprintf(c->error, sizeof c->error, "bytes that are not msgpack");
                return -1;
            }
        }
        if (rc == SHORT) { /* cut short: what came before stands, this record not counted */
            untally(c, before);
            break;
        }
        at = r.p;
        c->record++;
        c->used = (size_t)(at - data);
    }
    return 0;
}
