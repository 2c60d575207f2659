/* Descriptors kept in C (included by shim.c, after lane.h): cuDNN's tensor descriptors and variant packs, and
 * cuBLASLt's matmul descriptors, matrix layouts and matmul preferences. PyTorch makes them anew for every
 * operation and destroys them after: a batch norm's two tensor descriptors (a create, a setter and a destroy
 * each), a convolution's variant pack (a create, three attributes, a finalize and a destroy around its
 * execution), a cuBLASLt GEMM's five (sixteen calls with their attributes), 240 calls in a ResNet-18 inference
 * step, 3 to 16 µs apiece through the core. Such a descriptor holds only its setting, so here it is a record in
 * a table (front.h), and its handle is the record's.
 *
 * The core reads a record (xpu_kept_read) when a call names the descriptor: it sends the call with the
 * server's descriptor for that setting (client/descriptors.py, `server_descriptor`). A call this table does
 * not take (another setter, a setting it cannot hold, a closed lane) goes to the core, which first takes
 * the record over (xpu_kept_read, adopting it): from then on the handle is the core's, and its slot stays
 * taken until the core frees it (xpu_kept_release) at the destroy, so a handle is given out again only after
 * it was destroyed, as the libraries' own memory is. The table answers while the lane is open (lane.h): per-call
 * logging must see every call. */
#ifndef XPU_KEPT_H
#define XPU_KEPT_H

#define XPU_KEPT_SLOTS 4096
#define XPU_KEPT_BASE 0x7B0000000000ull  /* below the core's own handles (client/driver.py) */

/* What a marked op is, and a record's kind: abi.h's XPU_KEPT_* and XPU_KEPT_KIND_* (protocol/records.py). */
#define XPU_KEPT_SETTINGS 256  /* (handle, setter) pairs whose last value C knows */
#define XPU_KEPT_BLAS 64       /* cuBLAS handles whose stream and workspace C holds */
#define XPU_KEPT_SERVED 1024   /* server descriptors C knows the settings of (a power of two; at half, it starts over) */
enum { XPU_SLOT_FREE, XPU_SLOT_KEPT, XPU_SLOT_ADOPTED };

static struct {
    pthread_mutex_t lock;
    int64_t generation;
    uint32_t fresh;               /* slots never used are taken first, then the ring of freed ones */
    uint32_t head, tail;
    uint16_t free[XPU_KEPT_SLOTS];
    struct xpu_kept_record slot[XPU_KEPT_SLOTS];
    struct {
        unsigned char role, kind, made;     /* XPU_KEPT_*, a record's kind, a create's integer arguments */
        uint8_t nargs, size;                /* a cuBLAS call queued in the lane: its arguments, its scalars' bytes */
        int8_t type_arg;                    /* or the argument naming their type (a cudaDataType_t or compute type) */
        uint32_t opcode, scalars;           /* its opcode, a bit per argument that is a host scalar */
        uint32_t descriptors;               /* a cuBLASLt call's: a bit per kept descriptor argument */
        int8_t blob_arg;                    /* and the argument whose bytes travel (a matmul's algo), or -1 */
        uint16_t blob_size;
        int32_t constant;                   /* XPU_KEPT_CONSTANT's answer once the core has said it (known) */
        uint8_t known;
    } op[XPU_LIBRARIES][XPU_LIBRARY_OPS_MAX];
    uint32_t blas_stream_opcode, blas_workspace_opcode;  /* cublasSetStream_v2's and cublasSetWorkspace_v2's */
    uint32_t lt_set_opcode;                               /* cublasLtMatmulDescSetAttribute's */
    /* cuDNN's numbers (the core's): the variant pack's descriptor type; the ids', data pointers' and workspace's
     * attribute names, then their element types. 0 until told: no pack is kept. */
    int64_t pack_type, pack_name[XPU_KEPT_PACK_ATTRIBUTES], pack_element[XPU_KEPT_PACK_ATTRIBUTES];
    /* A library handle's settings (the stream, the math mode): PyTorch sets them before each call, nearly always
     * to the value they have, which the core does not even send. The core says each value it holds, under its
     * setter's op and its getter's; a call that sets it again, or asks it, is answered here. A free entry's
     * handle is 0. */
    struct { uint64_t handle, value; int16_t library, op; } setting[XPU_KEPT_SETTINGS];
    /* A cuBLAS handle's stream and workspace (front.h): PyTorch sets both before each GEMM, nearly
     * always to what they are. cublasSetStream also puts back cuBLAS's own workspace, so a repeated one is not a
     * no-op: the pair is held here for each handle the core made, and the core reads it where it lies when a
     * call names the handle (client/mathlibs.py, `blas_settings`). A free entry's handle is 0. */
    struct { uint64_t handle; struct xpu_blas_pair pair; } blas[XPU_KEPT_BLAS];
    /* Answers that depend only on what the question names: cuBLASLt's heuristic (PyTorch asks it before every
     * cuBLASLt GEMM, of descriptors made anew) and cuDNN's sizes (a batch norm's workspace, before each one). The
     * core's first answer is kept here under the question's key (xpu_kept_answer_key: the op, the handle, the
     * descriptors' settings, the other arguments) and given again. A free entry's bytes are NULL. */
    struct { uint64_t hash, handle; uint32_t key_len, answer_len; int32_t count; unsigned char *bytes; }
        answer[XPU_KEPT_ANSWERS];
    uint32_t answers, lt_pointers;
    uint32_t lt_pointer[XPU_KEPT_LT_POINTERS];  /* matmul attributes holding device pointers: keyed by alignment */
    uint32_t lt_scale_type, lt_pointer_mode;     /* the matmul attributes that size a call's scalars */
    /* The server's descriptor for a kept descriptor's setting (the record but its generation, a device pointer
     * attribute by its alignment: xpu_kept_served_setting), as the core made it there (client/descriptors.py,
     * server_descriptor): a cuBLASLt call names those. `sent`: the addresses its pointer attributes hold there, by
     * the attribute's place in the setting (under autocast PyTorch casts a GEMM's bias anew at every step: C
     * moves the server's descriptor to the new address, ahead of the GEMM). One entry a server descriptor.
     * server 0: free; ~0: gone. */
    struct { uint64_t hash, server; struct xpu_kept_record setting; uint64_t sent[XPU_KEPT_ATTRIBUTES]; }
        served[XPU_KEPT_SERVED];
    uint32_t serving;                            /* entries used, gone ones included */
    /* Host addresses the core found holding a variant pack's by-value scalar (cuDNN attention's scale: it lives in
     * cudnn-frontend's graph, the same address at every execution of it). 0: free. */
    uint64_t scalar_address[XPU_KEPT_SCALAR_ADDRESSES];
    uint32_t scalar_addresses;
    /* The session's device memory as the core knows it: [base, end) pairs in order of their bases (a pack's data
     * pointers all inside are all device addresses: no by-value scalar, nothing to ask the core). */
    uint64_t *device;
    int64_t devices;
    /* The client-made handles whose calls C may queue (XPU_KEPT_HANDLE_CALL: a cuFFT plan's transforms, a cuRAND
     * generator's generations), each for one op, as the core let them after a first call of that op passed its
     * checks: the count argument must be a multiple of `multiple` (a quasirandom generator's dimensions, 2 for a
     * pseudorandom one's normals). Open addressing; multiple 0: a forgotten entry, probed past. */
    struct { uint64_t handle, multiple; int16_t library, op; } handle[XPU_KEPT_HANDLES];
    uint32_t handles;                           /* entries used, forgotten ones included */
} xpu_kept = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void xpu_kept_pack_names(const int64_t *names) {
    pthread_mutex_lock(&xpu_kept.lock);
    xpu_kept.pack_type = names[0];
    memcpy(xpu_kept.pack_name, names + 1, sizeof xpu_kept.pack_name);
    memcpy(xpu_kept.pack_element, names + 4, sizeof xpu_kept.pack_element);
    pthread_mutex_unlock(&xpu_kept.lock);
}

/* The entry of (library, op) for `handle`, or a free one (found: 0), or -1 when there is neither. */
static int xpu_kept_setting_find(uint64_t handle, int library, int op, int *found) {
    int free_at = -1;
    for (int i = 0; i < XPU_KEPT_SETTINGS; i++) {
        if (handle && xpu_kept.setting[i].handle == handle && xpu_kept.setting[i].library == library
            && xpu_kept.setting[i].op == op)
            return *found = 1, i;
        if (!xpu_kept.setting[i].handle && free_at < 0) free_at = i;
    }
    return *found = 0, free_at;
}

static void xpu_kept_answers_forget(uint64_t handle);

/* The core's: `handle`'s setter (library, op) holds `value` now; op < 0: the handle is destroyed. */
static void xpu_kept_setting(uint64_t handle, int library, int op, uint64_t value) {
    pthread_mutex_lock(&xpu_kept.lock);
    if (op < 0) {
        for (int i = 0; i < XPU_KEPT_SETTINGS; i++)
            if (xpu_kept.setting[i].handle == handle) xpu_kept.setting[i].handle = 0;
        xpu_kept_answers_forget(handle);
    } else if (handle) {
        int found, i = xpu_kept_setting_find(handle, library, op, &found);
        if (i >= 0) {
            xpu_kept.setting[i].handle = handle, xpu_kept.setting[i].value = value;
            xpu_kept.setting[i].library = (int16_t)library, xpu_kept.setting[i].op = (int16_t)op;
        }
    }
    pthread_mutex_unlock(&xpu_kept.lock);
}

/* Where `handle` is in the cuBLAS table, or -1; under the lock. */
static int xpu_kept_blas_at(uint64_t handle) {
    for (int i = 0; handle && i < XPU_KEPT_BLAS; i++)
        if (xpu_kept.blas[i].handle == handle) return i;
    return -1;
}

static struct xpu_blas_pair *xpu_kept_blas_find(uint64_t handle) {
    int i = xpu_kept_blas_at(handle);
    return i < 0 ? NULL : &xpu_kept.blas[i].pair;
}

/* The core's: hold `handle`, a new cuBLAS handle (its stream 0, cuBLAS's own workspace), and give where its pair
 * is, for the core to read and write from then on (NULL: no room); or (hold 0) forget it, destroyed. */
static struct xpu_blas_pair *xpu_kept_blas(uint64_t handle, int hold) {
    pthread_mutex_lock(&xpu_kept.lock);
    int i = xpu_kept_blas_at(handle);
    if (i >= 0 && !hold) xpu_kept.blas[i].handle = 0;
    for (int free_at = 0; i < 0 && hold && handle && free_at < XPU_KEPT_BLAS; free_at++)
        if (!xpu_kept.blas[free_at].handle) {
            i = free_at;
            xpu_kept.blas[i].handle = handle;
            xpu_kept.blas[i].pair = (struct xpu_blas_pair){.own = 1, .sent_own = 1};
        }
    pthread_mutex_unlock(&xpu_kept.lock);
    return i >= 0 && hold ? &xpu_kept.blas[i].pair : NULL;
}

/* `made`: a create's integer arguments after its output (cuBLASLt's: its setting) */
static void xpu_kept_mark(int library, int op, int role, int kind, int made, uint32_t opcode) {
    if (library < 0 || library >= XPU_LIBRARIES || op < 0 || op >= XPU_LIBRARY_OPS_MAX || made > XPU_KEPT_MADE) return;
    xpu_kept.op[library][op].role = (unsigned char)role;
    xpu_kept.op[library][op].kind = (unsigned char)kind;
    xpu_kept.op[library][op].made = (unsigned char)made;
    xpu_kept.op[library][op].opcode = opcode;
    if (role == XPU_KEPT_BLAS_STREAM) xpu_kept.blas_stream_opcode = opcode;
    if (role == XPU_KEPT_BLAS_WORKSPACE) xpu_kept.blas_workspace_opcode = opcode;
    if (role == XPU_KEPT_LT_SET && kind == XPU_KEPT_KIND_LT_MATMUL) xpu_kept.lt_set_opcode = opcode;
}

/* A library call C queues in the lane (XPU_KEPT_BLAS_CALL or _LT_CALL, marked first): `nargs` arguments, those of
 * `scalars` host scalars of `size` bytes, or of the size of the type argument `type_arg` names (a cuBLASLt call's:
 * the descriptor whose scale type sizes them); a cuBLASLt call's kept descriptors (`descriptors`, a bit each) and
 * the argument whose `blob_size` bytes travel as its blob. A HANDLE_CALL's `type_arg`: its count argument, or the
 * type argument that sizes its `scalars`, or -1. */
static void xpu_kept_lane(int library, int op, int nargs, uint32_t scalars, int type_arg, int size,
                          uint32_t descriptors, int blob_arg, int blob_size) {
    if (library < 0 || library >= XPU_LIBRARIES || op < 0 || op >= XPU_LIBRARY_OPS_MAX || nargs > XPU_LANE_ARGS_MAX
        || type_arg >= nargs || size > 8 || blob_arg >= nargs || blob_size < 0 || blob_size > 4096)
        return;
    __typeof__(xpu_kept.op[0][0]) *o = &xpu_kept.op[library][op];
    o->nargs = (uint8_t)nargs, o->scalars = scalars, o->type_arg = (int8_t)type_arg, o->size = (uint8_t)size;
    o->descriptors = descriptors, o->blob_arg = (int8_t)blob_arg, o->blob_size = (uint16_t)blob_size;
}

/* The record of a handle of this table, or NULL; under the lock. */
static struct xpu_kept_record *xpu_kept_find(uint64_t handle) {
    uint64_t i = (handle - XPU_KEPT_BASE) / 16;
    if (handle < XPU_KEPT_BASE || handle % 16 || i >= XPU_KEPT_SLOTS) return NULL;
    struct xpu_kept_record *r = &xpu_kept.slot[i];
    return r->state == XPU_SLOT_FREE ? NULL : r;
}

/* A kept descriptor of `kind` (a set or a destroy names one of its own kind, or the core answers). */
static struct xpu_kept_record *xpu_kept_own(uint64_t handle, int kind) {
    struct xpu_kept_record *r = xpu_kept_find(handle);
    return r && r->state == XPU_SLOT_KEPT && r->kind == kind ? r : NULL;
}

/* `s`: the create's arguments from its output */
static int xpu_kept_create(int kind, int made, const uint64_t *s) {
    uint64_t *out = (uint64_t *)(uintptr_t)s[0];
    if (!out || (xpu_kept.fresh == XPU_KEPT_SLOTS && xpu_kept.head == xpu_kept.tail))
        return -1;  /* the table is full: the core keeps this one */
    uint32_t i = xpu_kept.fresh < XPU_KEPT_SLOTS ? xpu_kept.fresh++ : xpu_kept.free[xpu_kept.head++ % XPU_KEPT_SLOTS];
    struct xpu_kept_record *r = &xpu_kept.slot[i];
    memset(r, 0, sizeof *r);
    r->state = XPU_SLOT_KEPT, r->kind = kind, r->generation = ++xpu_kept.generation;
    for (int a = 0; a < made; a++) r->made[a] = (int64_t)s[a + 1];
    *out = XPU_KEPT_BASE + 16u * i;
    return 0;
}

static int xpu_kept_set_tensor(int setter, const uint64_t *s) {
    struct xpu_kept_record *r = xpu_kept_own(s[0], 0);
    if (!r) return -1;
    int32_t v[XPU_KEPT_INTS] = {0};
    int n = setter == XPU_KEPT_SET_4D ? 6 : 9;  /* format, type, n, c, h, w; or type, n, c, h, w, 4 strides */
    if (setter == XPU_KEPT_SET_ND) {
        int dims = (int)(int64_t)s[2];
        const int32_t *size = (const int32_t *)(uintptr_t)s[3], *stride = (const int32_t *)(uintptr_t)s[4];
        if (dims < 1 || dims > XPU_KEPT_DIMS || !size || !stride) return -1;  /* the core says what is wrong */
        v[0] = (int32_t)s[1], v[1] = dims;
        memcpy(v + 2, size, dims * sizeof *size);
        memcpy(v + 2 + XPU_KEPT_DIMS, stride, dims * sizeof *stride);
    } else {
        for (int i = 0; i < n; i++) v[i] = (int32_t)s[i + 1];
    }
    r->setter = setter;
    r->generation = ++xpu_kept.generation;
    memcpy(r->ints, v, sizeof v);
    return 0;
}

/* cublasLt*SetAttribute(descriptor, attribute, buffer, size): the attribute's bytes, replacing its last. */
static int xpu_kept_set_attribute(int kind, const uint64_t *s) {
    struct xpu_kept_record *r = xpu_kept_own(s[0], kind);
    const void *value = (const void *)(uintptr_t)s[2];
    uint32_t attribute = (uint32_t)s[1];
    if (!r || !value || !s[3] || s[3] > XPU_KEPT_VALUE) return -1;
    int at = 0;
    while (at < r->attributes && r->attribute[at].name != attribute) at++;
    if (at == XPU_KEPT_ATTRIBUTES) return -1;
    if (at == r->attributes) r->attributes++;
    r->attribute[at].name = attribute, r->attribute[at].size = (uint32_t)s[3];
    memcpy(r->attribute[at].value, value, s[3]);
    r->generation = ++xpu_kept.generation;
    return 0;
}

/* cudnnBackendSetAttribute(pack, name, type, count, elements) of one of the three attributes an execution takes
 * (8 bytes an element), before the pack is finalized. */
static int xpu_kept_set_pack(int kind, const uint64_t *s) {
    struct xpu_kept_record *r = xpu_kept_own(s[0], kind);
    int64_t count = (int64_t)s[3];
    int a = 0;
    while (a < 3 && xpu_kept.pack_name[a] != (int64_t)(uint32_t)s[1]) a++;
    if (!r || r->pack.finalized || a == 3 || xpu_kept.pack_element[a] != (int64_t)(uint32_t)s[2] || count < 0
        || count > XPU_KEPT_PACK_ELEMENTS || (count && !s[4]))
        return -1;
    if (count)
        memcpy(r->pack.value + a * XPU_KEPT_PACK_ELEMENTS, (const void *)(uintptr_t)s[4], (size_t)count * sizeof(uint64_t));
    r->pack.count[a] = count;
    r->pack.set |= 1 << a;
    r->generation = ++xpu_kept.generation;
    return 0;
}

static void xpu_kept_free(struct xpu_kept_record *r) {
    r->state = XPU_SLOT_FREE;
    xpu_kept.free[xpu_kept.tail++ % XPU_KEPT_SLOTS] = (uint16_t)(r - xpu_kept.slot);
}

/* ---- answers kept: cuBLASLt's heuristic, cuDNN's sizes ---------------------------------------------- */
static int xpu_kept_is_pointer(uint32_t name) {
    for (uint32_t i = 0; i < xpu_kept.lt_pointers; i++)
        if (xpu_kept.lt_pointer[i] == name) return 1;
    return 0;
}

/* What names a device address in a setting: its alignment, up to 256 (0 for NULL). */
static uint64_t xpu_kept_alignment(uint64_t address) {
    uint64_t lowest = address & -address;
    return lowest && lowest < 256 ? lowest : 256 * !!address;
}

/* A cuBLASLt descriptor's setting into `key`: its kind, how it was made, its attributes by name. Of a device
 * pointer (a bias, a scale) only its alignment: PyTorch casts the bias anew at every step under autocast. */
static size_t xpu_kept_setting_key(const struct xpu_kept_record *r, unsigned char *key) {
    size_t n = 0;
    memcpy(key, &r->kind, 4), n += 4;
    memcpy(key + n, r->made, sizeof r->made), n += sizeof r->made;
    memcpy(key + n, &r->attributes, 4), n += 4;
    uint32_t last = 0;
    for (int a = 0; a < r->attributes; a++) {  /* in the order of their names, whatever order they were set in */
        int next = -1;
        for (int b = 0; b < r->attributes; b++)
            if ((a == 0 || r->attribute[b].name > last) && (next < 0 || r->attribute[b].name < r->attribute[next].name))
                next = b;
        const struct xpu_kept_attribute *at = &r->attribute[next];
        last = at->name;
        memcpy(key + n, &at->name, 4), n += 4;
        memcpy(key + n, &at->size, 4), n += 4;
        uint64_t v[2] = {0, 0};
        memcpy(v, at->value, at->size);
        if (r->kind == XPU_KEPT_KIND_LT_MATMUL && at->size == 8 && xpu_kept_is_pointer(at->name)) {
            v[0] = xpu_kept_alignment(v[0]);
        }
        memcpy(key + n, v, sizeof v), n += sizeof v;
    }
    return n;
}

#define XPU_KEPT_TENSOR_KEY (8 + 4 * XPU_KEPT_INTS)
#define XPU_KEPT_ANSWER_KEY (8 + 12 + 6 * (12 + 8 * XPU_KEPT_MADE + 24 * XPU_KEPT_ATTRIBUTES))
#define XPU_KEPT_SIZE_ARGS ((XPU_KEPT_ANSWER_KEY - 8) / (8 + XPU_KEPT_TENSOR_KEY))

/* cublasLtMatmulAlgoGetHeuristic(handle, operation, A, B, C, D, preference, requested, results, count)'s key
 * after its op's: its length, 0 where C cannot say (a descriptor it does not keep, a count out of range). */
static size_t xpu_kept_heuristic_key(const uint64_t *s, unsigned char *key) {
    int32_t requested = (int32_t)s[7];
    if (!s[0] || requested <= 0 || requested > XPU_KEPT_HEURISTIC_RESULTS) return 0;
    size_t n = 0;
    memcpy(key, &s[0], 8), n += 8;
    memcpy(key + n, &requested, 4), n += 4;
    for (int d = 1; d <= 6; d++) {
        const struct xpu_kept_record *r = xpu_kept_find(s[d]);
        if (!r || r->state != XPU_SLOT_KEPT || r->kind < XPU_KEPT_KIND_LT_MATMUL || r->kind > XPU_KEPT_KIND_LT_PREFERENCE)
            return 0;
        n += xpu_kept_setting_key(r, key + n);
    }
    return n;
}

/* A size question of cuDNN (handle, integers and descriptors, then its size_t output)'s key after its op's: each
 * argument as it is, a descriptor's as its setting (a tensor C keeps) or NULL; 0 where C cannot say. */
static size_t xpu_kept_size_key(int library, int op, const uint64_t *s, unsigned char *key) {
    const __typeof__(xpu_kept.op[0][0]) *o = &xpu_kept.op[library][op];
    if (!s[0] || o->nargs < 2 || o->nargs - 1 > XPU_KEPT_SIZE_ARGS) return 0;
    size_t n = 0;
    for (int i = 0; i < o->nargs - 1; i++) {
        memcpy(key + n, &s[i], 8), n += 8;
        if (!(o->descriptors >> i & 1) || !s[i]) continue;
        const struct xpu_kept_record *r = xpu_kept_own(s[i], XPU_KEPT_KIND_TENSOR);
        if (!r || !r->setter) return 0;  /* a descriptor of the core's, or one not set: the core answers */
        memcpy(key + n - 8, &r->setter, 4), memset(key + n - 4, 0, 4);  /* its setting, not its handle */
        memcpy(key + n, r->ints, 4 * XPU_KEPT_INTS), n += 4 * XPU_KEPT_INTS;
    }
    return n;
}

/* The key of a question whose answer C keeps (XPU_KEPT_HEURISTIC, XPU_KEPT_SIZE): its length, or 0. */
static size_t xpu_kept_answer_key(int library, int op, const uint64_t *s, unsigned char *key) {
    int32_t which[2] = {library, op};
    memcpy(key, which, 8);
    size_t n = xpu_kept.op[library][op].role == XPU_KEPT_HEURISTIC ? xpu_kept_heuristic_key(s, key + 8)
                                                                  : xpu_kept_size_key(library, op, s, key + 8);
    return n ? 8 + n : 0;
}

static uint64_t xpu_kept_hash(const unsigned char *key, size_t n) {
    uint64_t h = 1469598103934665603ull;  /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ key[i]) * 1099511628211ull;
    return h;
}

/* The entry for `key`, or the free one where it would go (its bytes NULL). Under the lock. */
static int xpu_kept_answer_slot(uint64_t hash, const unsigned char *key, size_t n) {
    uint32_t i = (uint32_t)hash & (XPU_KEPT_ANSWERS - 1);
    for (;; i = (i + 1) & (XPU_KEPT_ANSWERS - 1)) {  /* never full: it starts over at half */
        if (!xpu_kept.answer[i].bytes) return (int)i;
        if (xpu_kept.answer[i].hash == hash && xpu_kept.answer[i].key_len == n
            && !memcmp(xpu_kept.answer[i].bytes, key, n))
            return (int)i;
    }
}

static void xpu_kept_answers_clear(void) {
    for (int i = 0; i < XPU_KEPT_ANSWERS; i++) {
        free(xpu_kept.answer[i].bytes);
        xpu_kept.answer[i].bytes = NULL;
    }
    xpu_kept.answers = 0;
}

/* A destroyed handle's answers go (a new handle may be given the same value). Under the lock. */
static void xpu_kept_answers_forget(uint64_t handle) {
    for (int i = 0; i < XPU_KEPT_ANSWERS; i++)
        if (xpu_kept.answer[i].bytes && xpu_kept.answer[i].handle == handle) {
            xpu_kept_answers_clear();  /* open addressing has no single removal: the few left are asked again */
            return;
        }
}

/* The core's: its answer to the question `s` of (library, op) (`bytes` of it, and a count where the question
 * has one), kept for the next time the same is asked. */
static void xpu_kept_learn(int library, int op, const uint64_t *s, const void *answer, uint64_t bytes, int32_t count) {
    unsigned char key[XPU_KEPT_ANSWER_KEY];
    if (library < 0 || library >= XPU_LIBRARIES || op < 0 || op >= XPU_LIBRARY_OPS_MAX) return;
    pthread_mutex_lock(&xpu_kept.lock);
    size_t n = xpu_kept_answer_key(library, op, s, key);
    if (n && bytes <= 4096) {
        if (xpu_kept.answers >= XPU_KEPT_ANSWERS / 2) xpu_kept_answers_clear();
        uint64_t hash = xpu_kept_hash(key, n);
        int i = xpu_kept_answer_slot(hash, key, n);
        unsigned char *kept = xpu_kept.answer[i].bytes ? NULL : malloc(n + bytes);
        if (kept) {
            memcpy(kept, key, n);
            memcpy(kept + n, answer, bytes);
            xpu_kept.answer[i].hash = hash, xpu_kept.answer[i].handle = s[0];
            xpu_kept.answer[i].key_len = (uint32_t)n, xpu_kept.answer[i].answer_len = (uint32_t)bytes;
            xpu_kept.answer[i].count = count, xpu_kept.answer[i].bytes = kept;
            xpu_kept.answers++;
        }
    }
    pthread_mutex_unlock(&xpu_kept.lock);
}

/* The question `s` answered from what the core answered before, into its outputs (a heuristic's results and
 * count; a size's size_t): 0, or -1 (the core answers). Under the lock. */
static int xpu_kept_answer(int library, int op, uint64_t *s) {
    unsigned char key[XPU_KEPT_ANSWER_KEY];
    int heuristic = xpu_kept.op[library][op].role == XPU_KEPT_HEURISTIC;
    void *out = (void *)(uintptr_t)s[heuristic ? 8 : xpu_kept.op[library][op].nargs - 1];
    size_t n = out && (!heuristic || s[9]) ? xpu_kept_answer_key(library, op, s, key) : 0;
    if (!n) return -1;
    int i = xpu_kept_answer_slot(xpu_kept_hash(key, n), key, n);
    if (!xpu_kept.answer[i].bytes) return -1;
    memcpy(out, xpu_kept.answer[i].bytes + n, xpu_kept.answer[i].answer_len);
    if (heuristic) memcpy((void *)(uintptr_t)s[9], &xpu_kept.answer[i].count, 4);
    return 0;
}

/* The core's: a XPU_KEPT_CONSTANT call answers `value` from now on (the server's library version). */
static void xpu_kept_constant(int library, int op, int32_t value) {
    if (library < 0 || library >= XPU_LIBRARIES || op < 0 || op >= XPU_LIBRARY_OPS_MAX || value < 0) return;
    pthread_mutex_lock(&xpu_kept.lock);
    xpu_kept.op[library][op].constant = value;
    xpu_kept.op[library][op].known = 1;
    pthread_mutex_unlock(&xpu_kept.lock);
}

/* ---- cuBLAS calls in the lane ------------------------------------------------------------------------ */
/* The bytes of a host scalar of a cudaDataType_t or compute type (abi.h's table), or 0. */
static int xpu_scalar_bytes_of(int64_t type) {
    for (int i = 0; i < XPU_SCALAR_BYTES_ROWS; i++)
        if (xpu_scalar_bytes[i][0] == type) return (int)xpu_scalar_bytes[i][1];
    return 0;
}

/* The host scalars among a call's arguments (a bit each in `scalars`) read into their slots of `args`, `size`
 * bytes each: 0, or -1 for a NULL one (the core says what is wrong). */
static int xpu_kept_scalars(uint32_t scalars, int nargs, const uint64_t *s, int size, uint64_t *args) {
    for (int i = 0; i < nargs; i++)
        if (scalars >> i & 1) {
            if (!s[i]) return -1;
            args[i] = 0;
            memcpy(&args[i], (const void *)(uintptr_t)s[i], (size_t)size);
        }
    return 0;
}

/* `pair`'s server side brought to what the application set (client/mathlibs.py's blas_settings, in C): the
 * setters the server's handle needs, into `calls`; their count. */
static int xpu_kept_blas_sync(uint64_t handle, const struct xpu_blas_pair *pair, struct xpu_lane_call *calls,
                              uint64_t *stream_args, uint64_t *workspace_args) {
    int stream_moved = pair->stream != pair->sent_stream;
    int same = !stream_moved && pair->own == pair->sent_own
               && (pair->own || (pair->workspace == pair->sent_workspace && pair->bytes == pair->sent_bytes));
    int n = 0;
    if (same) return 0;
    stream_args[0] = workspace_args[0] = handle;
    stream_args[1] = pair->stream;
    workspace_args[1] = pair->workspace, workspace_args[2] = pair->bytes;
    if (stream_moved || pair->own)
        calls[n++] = (struct xpu_lane_call){.opcode = xpu_kept.blas_stream_opcode, .nargs = 2, .args = stream_args};
    if (!pair->own)
        calls[n++] = (struct xpu_lane_call){.opcode = xpu_kept.blas_workspace_opcode, .nargs = 3, .args = workspace_args};
    return n;
}

/* A cuBLAS call of integers, device pointers and host scalars, queued in the lane with its scalars' bytes after
 * the settings its handle's server side lacks: 0, or -1 where the core sends it (a handle C does not hold, device
 * pointer mode, a scalar type it cannot size, a NULL scalar, the lane closed or full). Under the lock. */
static int xpu_kept_blas_call(int library, int op, const uint64_t *s) {
    const __typeof__(xpu_kept.op[0][0]) *o = &xpu_kept.op[library][op];
    struct xpu_blas_pair *pair = xpu_kept_blas_find(s[0]);
    if (!pair || pair->pointer_mode || !o->nargs || !xpu_kept.blas_stream_opcode || !xpu_kept.blas_workspace_opcode)
        return -1;
    int size = o->type_arg >= 0 ? xpu_scalar_bytes_of((int32_t)s[o->type_arg]) : o->size;
    if (o->scalars && (size <= 0 || size > 8)) return -1;
    uint64_t args[XPU_LANE_ARGS_MAX], stream_args[2], workspace_args[3];
    memcpy(args, s, o->nargs * sizeof *args);
    if (xpu_kept_scalars(o->scalars, o->nargs, s, size, args)) return -1;
    struct xpu_lane_call calls[3];
    int n = xpu_kept_blas_sync(s[0], pair, calls, stream_args, workspace_args);
    calls[n++] = (struct xpu_lane_call){.opcode = o->opcode, .scalars = o->scalars, .nargs = o->nargs,
                                        .scalar_size = o->scalars ? size : 0, .args = args};
    if (xpu_lane_put_calls(calls, n)) return -1;
    pair->sent_stream = pair->stream, pair->sent_own = pair->own;
    pair->sent_workspace = pair->own ? 0 : pair->workspace, pair->sent_bytes = pair->own ? 0 : pair->bytes;
    return 0;
}

/* ---- cuBLASLt calls in the lane ---------------------------------------------------------------------- */
static uint64_t xpu_kept_served_hash(const struct xpu_kept_record *setting) {
    return xpu_kept_hash((const unsigned char *)setting, sizeof *setting);
}

/* The entry of `setting`, or the free one where it would go. Under the lock. */
static int xpu_kept_served_slot(uint64_t hash, const struct xpu_kept_record *setting) {
    uint32_t i = (uint32_t)hash & (XPU_KEPT_SERVED - 1);
    for (;; i = (i + 1) & (XPU_KEPT_SERVED - 1)) {  /* never full: it starts over at half */
        if (!xpu_kept.served[i].server) return (int)i;
        if (xpu_kept.served[i].hash == hash && !memcmp(&xpu_kept.served[i].setting, setting, sizeof *setting))
            return (int)i;
    }
}

/* A matmul descriptor's attribute that holds a device address (a bias, a scale). */
static int xpu_kept_is_address(const struct xpu_kept_record *r, int a) {
    return r->kind == XPU_KEPT_KIND_LT_MATMUL && r->attribute[a].size == 8 && xpu_kept_is_pointer(r->attribute[a].name);
}

static uint64_t xpu_kept_address_of(const struct xpu_kept_record *r, int a) {
    uint64_t v;
    memcpy(&v, r->attribute[a].value, 8);
    return v;
}

/* What names a server's descriptor: `r` but its generation, each address attribute by its alignment as
 * xpu_kept_setting_key has it (the server's descriptor is moved to the address, xpu_kept_lt_call). */
static void xpu_kept_served_setting(const struct xpu_kept_record *r, struct xpu_kept_record *out) {
    *out = *r;
    out->generation = 0;
    for (int a = 0; a < r->attributes; a++)
        if (xpu_kept_is_address(r, a)) {
            uint64_t v = xpu_kept_alignment(xpu_kept_address_of(r, a));
            memcpy(out->attribute[a].value, &v, 8);
        }
}

/* The core's: the server's descriptor `server` has the setting `setting` (a kept record), its addresses as they
 * are there; or (setting NULL) it is gone, destroyed on the server. */
static void xpu_kept_serve(const struct xpu_kept_record *setting, uint64_t server) {
    pthread_mutex_lock(&xpu_kept.lock);
    for (int i = 0; i < XPU_KEPT_SERVED && server; i++)  /* a setting it had before is not its own any more */
        if (xpu_kept.served[i].server == server) xpu_kept.served[i].server = UINT64_MAX;  /* probing goes on */
    if (setting && server && server != UINT64_MAX) {
        if (xpu_kept.serving >= XPU_KEPT_SERVED / 2) {
            memset(xpu_kept.served, 0, sizeof xpu_kept.served);
            xpu_kept.serving = 0;
        }
        struct xpu_kept_record named;
        xpu_kept_served_setting(setting, &named);
        uint64_t hash = xpu_kept_served_hash(&named);
        int i = xpu_kept_served_slot(hash, &named);
        if (!xpu_kept.served[i].server) xpu_kept.serving++;
        xpu_kept.served[i].hash = hash, xpu_kept.served[i].server = server, xpu_kept.served[i].setting = named;
        for (int a = 0; a < setting->attributes; a++)
            xpu_kept.served[i].sent[a] = xpu_kept_is_address(setting, a) ? xpu_kept_address_of(setting, a) : 0;
    }
    pthread_mutex_unlock(&xpu_kept.lock);
}

/* The entry of the server's descriptor for the kept descriptor `handle`'s setting now, or -1. Under the lock. */
static int xpu_kept_served_at(uint64_t handle, int kind_low, int kind_high) {
    const struct xpu_kept_record *r = xpu_kept_find(handle);
    if (!r || r->state != XPU_SLOT_KEPT || r->kind < kind_low || r->kind > kind_high) return -1;
    struct xpu_kept_record named;
    xpu_kept_served_setting(r, &named);
    int i = xpu_kept_served_slot(xpu_kept_served_hash(&named), &named);
    uint64_t server = xpu_kept.served[i].server;
    return server && server != UINT64_MAX ? i : -1;
}

static uint64_t xpu_kept_served_for(uint64_t handle, int kind_low, int kind_high) {
    int i = xpu_kept_served_at(handle, kind_low, kind_high);
    return i < 0 ? 0 : xpu_kept.served[i].server;
}

/* The records that move entry `i`'s server descriptor to the addresses kept descriptor `r` holds, into `calls`
 * (their arguments in `args`, 4 a call, the addresses in `values`, the attributes' places in `places`); their
 * count. Under the lock. */
static int xpu_kept_moves(int i, const struct xpu_kept_record *r, struct xpu_lane_call *calls, uint64_t *args,
                          uint64_t *values, int *places) {
    int n = 0;
    for (int a = 0; a < r->attributes; a++) {
        if (!xpu_kept_is_address(r, a) || xpu_kept_address_of(r, a) == xpu_kept.served[i].sent[a]) continue;
        values[n] = xpu_kept_address_of(r, a), places[n] = a;
        uint64_t *at = args + 4 * n;
        at[0] = xpu_kept.served[i].server, at[1] = r->attribute[a].name, at[2] = 0, at[3] = 8;
        calls[n] = (struct xpu_lane_call){.opcode = xpu_kept.lt_set_opcode, .nargs = 4, .args = at, .blob_at = 2,
                                          .blob_len = 8, .blob = &values[n]};
        n++;
    }
    return n;
}

/* A kept matmul descriptor's attribute `name` as an int32 (4 bytes), or `otherwise`. */
static int32_t xpu_kept_attribute_int(const struct xpu_kept_record *r, uint32_t name, int32_t otherwise) {
    for (int a = 0; a < r->attributes; a++)
        if (r->attribute[a].name == name && r->attribute[a].size >= 4) {
            int32_t v;
            memcpy(&v, r->attribute[a].value, 4);
            return v;
        }
    return otherwise;
}

/* A cuBLASLt call (cublasLtMatmul) queued in the lane, its kept descriptors named by the server's descriptors for
 * their settings and its scalars' bytes in the record: 0, or -1 where the core sends it (a descriptor C does not
 * keep or the core has not made on the server yet, device pointer mode, a scale type it cannot size, a NULL
 * scalar or struct, the lane closed or full). Under the lock. */
static int xpu_kept_lt_call(int library, int op, const uint64_t *s) {
    const __typeof__(xpu_kept.op[0][0]) *o = &xpu_kept.op[library][op];
    if (!o->nargs || o->type_arg < 0 || !xpu_kept.lt_scale_type) return -1;
    uint64_t args[XPU_LANE_ARGS_MAX], move_args[4 * XPU_KEPT_ATTRIBUTES], addresses[XPU_KEPT_ATTRIBUTES];
    struct xpu_lane_call calls[XPU_KEPT_ATTRIBUTES + 1];
    int n = 0, moved = -1, places[XPU_KEPT_ATTRIBUTES];
    memcpy(args, s, o->nargs * sizeof *args);
    for (int i = 0; i < o->nargs; i++) {
        if (!(o->descriptors >> i & 1)) continue;
        int at = xpu_kept_served_at(s[i], XPU_KEPT_KIND_LT_MATMUL, XPU_KEPT_KIND_LT_LAYOUT);
        if (at < 0) return -1;
        args[i] = xpu_kept.served[at].server;
        const struct xpu_kept_record *r = xpu_kept_find(s[i]);
        if (r->kind == XPU_KEPT_KIND_LT_MATMUL && moved < 0 && xpu_kept.lt_set_opcode)
            n = xpu_kept_moves(moved = at, r, calls, move_args, addresses, places);
        else if (r->kind == XPU_KEPT_KIND_LT_MATMUL)
            return -1;  /* two matmul descriptors, or no setter's opcode: the core sends it */
    }
    const struct xpu_kept_record *desc = xpu_kept_find(s[o->type_arg]);  /* kept: it was served above */
    if (!desc || desc->kind != XPU_KEPT_KIND_LT_MATMUL || xpu_kept_attribute_int(desc, xpu_kept.lt_pointer_mode, 0))
        return -1;
    int size = xpu_scalar_bytes_of(xpu_kept_attribute_int(desc, xpu_kept.lt_scale_type, (int32_t)desc->made[1]));
    if (size <= 0 || size > 8) return -1;
    if (xpu_kept_scalars(o->scalars, o->nargs, s, size, args)) return -1;
    const void *blob = o->blob_arg >= 0 ? (const void *)(uintptr_t)s[o->blob_arg] : NULL;
    if (o->blob_arg >= 0 && !blob) return -1;
    if (o->blob_arg >= 0) args[o->blob_arg] = 0;
    calls[n] = (struct xpu_lane_call){.opcode = o->opcode, .scalars = o->scalars, .nargs = o->nargs,
                                      .scalar_size = size, .args = args, .blob_at = o->blob_arg,
                                      .blob_len = blob ? o->blob_size : 0, .blob = blob};
    if (xpu_lane_put_calls(calls, n + 1)) return -1;
    for (int m = 0; m < n; m++) xpu_kept.served[moved].sent[places[m]] = addresses[m];  /* where they are now */
    return 0;
}

/* ---- cuDNN calls in the lane ------------------------------------------------------------------------- */
/* A kept tensor's cudnnDataType_t: the first int of an Nd or 4dEx setting, the second of a 4d one; -1 unset. */
static int64_t xpu_kept_tensor_type(const struct xpu_kept_record *r) {
    if (r->setter == XPU_KEPT_SET_4D) return r->ints[1];
    return r->setter == XPU_KEPT_SET_ND || r->setter == XPU_KEPT_SET_4D_EX ? r->ints[0] : -1;
}

/* The bytes of a cuDNN host scalar for tensors of `type` (abi.h's table, 4 where it says nothing). */
static int xpu_dnn_scalar_bytes_of(int64_t type) {
    for (int i = 0; i < XPU_DNN_SCALAR_BYTES_ROWS; i++)
        if (xpu_dnn_scalar_bytes[i][0] == type) return (int)xpu_dnn_scalar_bytes[i][1];
    return 4;
}

/* A cuDNN call (a batch norm: Call.dnn_lane) queued in the lane, its tensor descriptors named by the server's
 * descriptors for their settings and its scalars' bytes, sized by a tensor's data type, in the record: 0, or -1
 * where the core sends it (a descriptor C does not keep or the core has not made on the server yet, another
 * non-NULL descriptor, a scalar tensor not set, a NULL scalar, the lane closed or full). Under the lock. */
static int xpu_kept_dnn_call(int library, int op, const uint64_t *s) {
    const __typeof__(xpu_kept.op[0][0]) *o = &xpu_kept.op[library][op];
    if (!o->nargs || (o->scalars && o->type_arg < 0)) return -1;
    uint64_t args[XPU_LANE_ARGS_MAX];
    memcpy(args, s, o->nargs * sizeof *args);
    for (int i = 0; i < o->nargs; i++)
        if (o->descriptors >> i & 1 && s[i]
            && !(args[i] = xpu_kept_served_for(s[i], XPU_KEPT_KIND_TENSOR, XPU_KEPT_KIND_TENSOR)))
            return -1;
    int size = 0;
    if (o->scalars) {
        const struct xpu_kept_record *tensor = xpu_kept_own(s[o->type_arg], XPU_KEPT_KIND_TENSOR);
        int64_t type = tensor ? xpu_kept_tensor_type(tensor) : -1;
        if (type < 0) return -1;
        size = xpu_dnn_scalar_bytes_of(type);
        if (xpu_kept_scalars(o->scalars, o->nargs, s, size, args)) return -1;
    }
    struct xpu_lane_call call = {.opcode = o->opcode, .scalars = o->scalars, .nargs = o->nargs, .scalar_size = size,
                                 .args = args};
    return xpu_lane_put_calls(&call, 1);
}

/* ---- calls of a client-made handle in the lane (cuFFT's transforms, cuRAND's generations) ---------------- */
/* Where (library, op, handle) is in the handles the core let take the lane, or the free entry where it would go.
 * Under the lock. */
static uint32_t xpu_kept_handle_slot(int library, int op, uint64_t handle) {
    uint64_t key[2] = {handle, (uint64_t)library << 32 | (uint32_t)op};
    uint32_t i = (uint32_t)(xpu_kept_hash((const unsigned char *)key, sizeof key) & (XPU_KEPT_HANDLES - 1));
    while (xpu_kept.handle[i].library) {  /* library + 1 in a used entry; never full: it starts over at half */
        if (xpu_kept.handle[i].handle == handle && xpu_kept.handle[i].library == library + 1
            && xpu_kept.handle[i].op == op)
            break;
        i = (i + 1) & (XPU_KEPT_HANDLES - 1);
    }
    return i;
}

/* The core's: `op` of `library` naming `handle` first may be queued here when its count argument is a multiple of
 * `multiple`; or (multiple 0) every op of that library's `handle` goes the core's way again (a destroy, or a change
 * of what the core's checks read). */
static void xpu_kept_let(int library, int op, uint64_t handle, uint64_t multiple) {
    if (library < 0 || library >= XPU_LIBRARIES || op < 0 || op >= XPU_LIBRARY_OPS_MAX) return;
    pthread_mutex_lock(&xpu_kept.lock);
    if (!multiple) {
        for (int i = 0; i < XPU_KEPT_HANDLES; i++)
            if (xpu_kept.handle[i].handle == handle && xpu_kept.handle[i].library == library + 1)
                xpu_kept.handle[i].multiple = 0;
    } else {
        if (xpu_kept.handles >= XPU_KEPT_HANDLES / 2) {
            memset(xpu_kept.handle, 0, sizeof xpu_kept.handle);
            xpu_kept.handles = 0;
        }
        uint32_t i = xpu_kept_handle_slot(library, op, handle);
        xpu_kept.handles += !xpu_kept.handle[i].library;
        xpu_kept.handle[i].handle = handle, xpu_kept.handle[i].multiple = multiple;
        xpu_kept.handle[i].library = (int16_t)(library + 1), xpu_kept.handle[i].op = (int16_t)op;
    }
    pthread_mutex_unlock(&xpu_kept.lock);
}

/* A call of a handle the core let take the lane for this op (Call.handle_lane), its arguments as they are, host
 * scalars (o->scalars, cuSPARSE's alpha and beta) as their bytes, of the size of the type argument o->type_arg
 * names: 0, or -1 where the core takes it (a handle it did not let, or forgot; a count not a multiple of what it
 * said; a scalar type of no known size or over 8 bytes, a NULL scalar; the lane closed or full). Under the lock. */
static int xpu_kept_handle_call(int library, int op, const uint64_t *s) {
    const __typeof__(xpu_kept.op[0][0]) *o = &xpu_kept.op[library][op];
    if (!o->nargs) return -1;
    uint64_t multiple = xpu_kept.handle[xpu_kept_handle_slot(library, op, s[0])].multiple;
    if (!multiple) return -1;
    struct xpu_lane_call call = {.opcode = o->opcode, .nargs = o->nargs, .args = s};
    uint64_t args[XPU_LANE_ARGS_MAX];
    if (o->scalars) {  /* type_arg: the scalars' type */
        int size = o->type_arg >= 0 ? xpu_scalar_bytes_of((int32_t)s[o->type_arg]) : 0;
        if (size <= 0 || size > 8) return -1;
        memcpy(args, s, o->nargs * sizeof *args);
        if (xpu_kept_scalars(o->scalars, o->nargs, s, size, args)) return -1;
        call.scalars = o->scalars, call.scalar_size = size, call.args = args;
    } else if (o->type_arg >= 0 && s[o->type_arg] % multiple) {  /* type_arg: the count */
        return -1;
    }
    return xpu_lane_put_calls(&call, 1);
}

/* ---- cuDNN's variant packs executed in the lane ------------------------------------------------------ */
/* Where `address` is in the table of by-value scalars' addresses, or the free entry where it would go. Under the
 * lock. */
static uint32_t xpu_kept_scalar_slot(uint64_t address) {
    uint32_t i = (uint32_t)(xpu_kept_hash((const unsigned char *)&address, 8) & (XPU_KEPT_SCALAR_ADDRESSES - 1));
    while (xpu_kept.scalar_address[i] && xpu_kept.scalar_address[i] != address)  /* never full: it starts over */
        i = (i + 1) & (XPU_KEPT_SCALAR_ADDRESSES - 1);
    return i;
}

/* The core's: these `count` host addresses hold a variant pack's by-value scalars. */
static void xpu_kept_scalars_at(const uint64_t *addresses, int64_t count) {
    pthread_mutex_lock(&xpu_kept.lock);
    for (int64_t a = 0; a < count; a++) {
        if (!addresses[a]) continue;
        if (xpu_kept.scalar_addresses >= XPU_KEPT_SCALAR_ADDRESSES / 2) {
            memset(xpu_kept.scalar_address, 0, sizeof xpu_kept.scalar_address);
            xpu_kept.scalar_addresses = 0;
        }
        uint32_t i = xpu_kept_scalar_slot(addresses[a]);
        xpu_kept.scalar_addresses += !xpu_kept.scalar_address[i];
        xpu_kept.scalar_address[i] = addresses[a];
    }
    pthread_mutex_unlock(&xpu_kept.lock);
}

/* The core's: device memory is these `count` [base, end) pairs now, in order of their bases. */
static void xpu_kept_device_ranges(const uint64_t *ranges, int64_t count) {
    uint64_t *copy = count > 0 ? malloc((size_t)count * 16) : NULL;
    if (copy) memcpy(copy, ranges, (size_t)count * 16);
    pthread_mutex_lock(&xpu_kept.lock);
    free(xpu_kept.device);
    xpu_kept.device = copy, xpu_kept.devices = copy ? count : 0;
    pthread_mutex_unlock(&xpu_kept.lock);
}

/* Whether `address` is inside the session's device memory. Under the lock. */
static int xpu_kept_on_device(uint64_t address) {
    int64_t low = 0, high = xpu_kept.devices;  /* the last range whose base is at or below the address */
    while (low < high) {
        int64_t mid = (low + high) / 2;
        if (xpu_kept.device[2 * mid] <= address) low = mid + 1;
        else high = mid;
    }
    return low > 0 && address < xpu_kept.device[2 * (low - 1) + 1];
}

/* A pack's `count` data pointers: 0 and a bit per by-value scalar's host address in `by_value`, or -1 where C
 * cannot say (a pointer neither in device memory nor where the core found a by-value scalar). Under the lock. */
static int xpu_kept_by_value(const uint64_t *pointers, int64_t count, uint32_t *by_value) {
    *by_value = 0;
    for (int64_t e = 0; e < count; e++) {
        if (!pointers[e] || xpu_kept_on_device(pointers[e])) continue;
        if (!xpu_kept.scalar_address[xpu_kept_scalar_slot(pointers[e])]) return -1;
        *by_value |= 1u << e;
    }
    return 0;
}

/* cudnnBackendExecute(handle, plan, pack) of a finalized kept pack of data pointers, as many unique ids and at most
 * a workspace, queued in the lane as xpuCudnnExecute with its by-value scalars' bytes: 0, or -1 where the core
 * sends it (a pack C does not keep, pointers the core has not told C of, a scalar at a page's end, the lane closed
 * or full). Under the lock. */
static int xpu_kept_execute(int library, int op, const uint64_t *s) {
    const struct xpu_kept_record *r = xpu_kept_own(s[2], XPU_KEPT_KIND_PACK);
    const int ids = XPU_PACK_ATTRIBUTE_UNIQUE_IDS, data = XPU_PACK_ATTRIBUTE_DATA_POINTERS;
    const int space = XPU_PACK_ATTRIBUTE_WORKSPACE;
    if (!r || !r->pack.finalized || (r->pack.set & (1 << ids | 1 << data)) != (1 << ids | 1 << data)) return -1;
    int64_t count = r->pack.count[data];
    if (count <= 0 || count != r->pack.count[ids] || (r->pack.set >> space & 1 && r->pack.count[space] != 1))
        return -1;
    const uint64_t *pointers = r->pack.value + data * XPU_KEPT_PACK_ELEMENTS;
    uint32_t by_value;
    if (xpu_kept_by_value(pointers, count, &by_value)) return -1;
    unsigned char pack[25 * XPU_KEPT_PACK_ELEMENTS] = {0};
    size_t part = (size_t)count * 8;
    memcpy(pack + part * XPU_EXECUTE_PART_POINTERS, pointers, part);
    memcpy(pack + part * XPU_EXECUTE_PART_UNIQUE_IDS, r->pack.value + ids * XPU_KEPT_PACK_ELEMENTS, part);
    for (int e = 0; e < count; e++)
        if (by_value >> e & 1) {  /* read here as cuDNN would: the caller keeps it alive */
            if ((pointers[e] & 4095) > 4096 - 8) return -1;  /* the core reads what the page holds */
            memcpy(pack + part * XPU_EXECUTE_PART_SCALARS + 8 * e, (const void *)(uintptr_t)pointers[e], 8);
            pack[part * XPU_EXECUTE_PART_BY_VALUE + e] = 1;
        }
    uint64_t args[5] = {s[0], s[1], (uint64_t)count, r->pack.set >> space & 1 ? r->pack.value[space * XPU_KEPT_PACK_ELEMENTS] : 0, 0};
    struct xpu_lane_call call = {.opcode = xpu_kept.op[library][op].opcode, .nargs = 5, .args = args, .blob_at = 4,
                                 .blob_len = (uint32_t)(25 * count), .blob = pack};
    return xpu_lane_put_calls(&call, 1);
}

/* The core's: the matmul attributes that hold a device pointer, and those that say its scalars' type and mode. */
static void xpu_kept_lt_names(const uint32_t *pointers, int count, uint32_t scale_type, uint32_t pointer_mode) {
    pthread_mutex_lock(&xpu_kept.lock);
    xpu_kept.lt_pointers = count < XPU_KEPT_LT_POINTERS ? (uint32_t)count : XPU_KEPT_LT_POINTERS;
    memcpy(xpu_kept.lt_pointer, pointers, xpu_kept.lt_pointers * sizeof *pointers);
    xpu_kept.lt_scale_type = scale_type, xpu_kept.lt_pointer_mode = pointer_mode;
    xpu_kept_answers_clear();
    pthread_mutex_unlock(&xpu_kept.lock);
}

/* A math library call answered here: its status (0, success), or -1 where the core answers. */
static int xpu_kept_try(int library, int op, uint64_t *slots) {
    if (library < 0 || library >= XPU_LIBRARIES || op < 0 || op >= XPU_LIBRARY_OPS_MAX || !xpu_lane.open) return -1;
    int role = xpu_kept.op[library][op].role, kind = xpu_kept.op[library][op].kind;
    if (!role) return -1;
    pthread_mutex_lock(&xpu_kept.lock);
    int rc = -1;
    struct xpu_kept_record *r;
    switch (role) {
    case XPU_KEPT_CREATE:
    case XPU_KEPT_LT_CREATE:
        rc = xpu_kept_create(kind, xpu_kept.op[library][op].made, slots);
        break;
    case XPU_KEPT_DESTROY:
    case XPU_KEPT_LT_DESTROY:
    case XPU_KEPT_PACK_DESTROY:
        if ((r = xpu_kept_own(slots[0], kind))) {
            xpu_kept_free(r);
            rc = 0;
        }
        break;
    case XPU_KEPT_LT_SET:
        rc = xpu_kept_set_attribute(kind, slots);
        break;
    case XPU_KEPT_PACK_CREATE:  /* cudnnBackendCreateDescriptor(type, &descriptor): a variant pack's */
        if (xpu_kept.pack_type && (int64_t)(uint32_t)slots[0] == xpu_kept.pack_type)
            rc = xpu_kept_create(kind, 0, slots + 1);
        break;
    case XPU_KEPT_PACK_SET:
        rc = xpu_kept_set_pack(kind, slots);
        break;
    case XPU_KEPT_PACK_FINALIZE:
        if ((r = xpu_kept_own(slots[0], kind)) && !r->pack.finalized) {
            r->pack.finalized = 1;
            r->generation = ++xpu_kept.generation;
            rc = 0;
        }
        break;
    case XPU_KEPT_SETTING: {  /* setter(handle, value): the value it holds already */
        int found, i = xpu_kept_setting_find(slots[0], library, op, &found);
        if (found && xpu_kept.setting[i].value == slots[1]) rc = 0;
        break;
    }
    case XPU_KEPT_BLAS_STREAM: {  /* cublasSetStream(handle, stream): cuBLAS's own workspace again */
        struct xpu_blas_pair *pair = xpu_kept_blas_find(slots[0]);
        if (pair) pair->stream = slots[1], pair->own = 1, rc = 0;
        break;
    }
    case XPU_KEPT_BLAS_WORKSPACE: {  /* cublasSetWorkspace(handle, workspace, bytes) */
        struct xpu_blas_pair *pair = xpu_kept_blas_find(slots[0]);
        if (pair) pair->workspace = slots[1], pair->bytes = slots[2], pair->own = 0, rc = 0;
        break;
    }
    case XPU_KEPT_BLAS_GET_STREAM: {  /* cublasGetStream(handle, &stream) */
        struct xpu_blas_pair *pair = xpu_kept_blas_find(slots[0]);
        if (pair && slots[1]) memcpy((void *)(uintptr_t)slots[1], &pair->stream, 8), rc = 0;
        break;
    }
    case XPU_KEPT_HEURISTIC:
    case XPU_KEPT_SIZE:
        rc = xpu_kept_answer(library, op, slots);
        break;
    case XPU_KEPT_DNN_CALL:
        rc = xpu_kept_dnn_call(library, op, slots);
        break;
    case XPU_KEPT_BLAS_CALL:
        rc = xpu_kept_blas_call(library, op, slots);
        break;
    case XPU_KEPT_LT_CALL:
        rc = xpu_kept_lt_call(library, op, slots);
        break;
    case XPU_KEPT_PACK_EXECUTE:
        rc = xpu_kept_execute(library, op, slots);
        break;
    case XPU_KEPT_HANDLE_CALL:
        rc = xpu_kept_handle_call(library, op, slots);
        break;
    case XPU_KEPT_CONSTANT:
        if (xpu_kept.op[library][op].known) rc = xpu_kept.op[library][op].constant;
        break;
    case XPU_KEPT_GETTING: {  /* getter(handle, &value): `kind` bytes, little-endian as the value's slot */
        int found, i = xpu_kept_setting_find(slots[0], library, op, &found);
        if (found && slots[1]) {
            memcpy((void *)(uintptr_t)slots[1], &xpu_kept.setting[i].value, (size_t)kind);
            rc = 0;
        }
        break;
    }
    default:
        rc = xpu_kept_set_tensor(role, slots);
    }
    pthread_mutex_unlock(&xpu_kept.lock);
    return rc;
}

/* ---- for the core ---------------------------------------------------------------------------- */
/* A kept descriptor's record copied out: its generation, or -1 if the table does not keep it (any more).
 * `out` NULL: the generation alone, for a core whose copy may still be current. `adopt`: the core takes it
 * over, its slot kept taken. */
static int64_t xpu_kept_read(uint64_t handle, struct xpu_kept_record *out, int adopt) {
    pthread_mutex_lock(&xpu_kept.lock);
    struct xpu_kept_record *r = xpu_kept_find(handle);
    int64_t generation = -1;
    if (r && r->state == XPU_SLOT_KEPT) {
        if (out) *out = *r;
        generation = r->generation;
        if (adopt) r->state = XPU_SLOT_ADOPTED;
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
