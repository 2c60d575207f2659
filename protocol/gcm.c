/* AES-256-GCM of the data connection's small records (protocol/stream.py, protocol/gcm.py), with AES-NI and
 * PCLMULQDQ: a few hundred bytes of code and a 256-byte context, where OpenSSL's path through its EVP and
 * provider layers touches far more. A synchronous call's round trip takes four of these, each right after its
 * process has waited for the other end, when whatever it touches is cold.
 *
 * The record format is stream.py's, byte for byte what cryptography's AESGCM makes: the nonce is the record's
 * count as 12 little-endian bytes, the associated data the record's 4-byte length, then ciphertext and a 16-byte
 * tag. tests/test_stream.py checks both ways against cryptography. Counter blocks and GHASH follow NIST SP
 * 800-38D; the GF(2^128) product is the carry-less multiplication and reduction of Intel's white paper
 * ("Intel Carry-Less Multiplication Instruction and its Usage for Computing the GCM Mode", Gueron and Kounavis).
 * No table lookups and no branch on secret data; the tag is compared in constant time, before anything is
 * decrypted. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

#define TARGET __attribute__((target("aes,pclmul,sse4.1,ssse3")))
#define BSWAP _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#define HEAD 4
#define TAG 16

struct xpu_gcm {
    __m128i rk[15]; /* AES-256's round keys */
    __m128i h;      /* the hash key E(K, 0), bytes reversed */
};

int xpu_gcm_usable(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
}

/* ---- AES-256 ------------------------------------------------------------------------------------------ */
TARGET static __m128i expand_even(__m128i a, __m128i assist) {
    __m128i t = _mm_slli_si128(a, 4);
    a = _mm_xor_si128(a, t);
    t = _mm_slli_si128(t, 4);
    a = _mm_xor_si128(a, t);
    t = _mm_slli_si128(t, 4);
    a = _mm_xor_si128(a, t);
    return _mm_xor_si128(a, _mm_shuffle_epi32(assist, 0xff));
}

TARGET static __m128i expand_odd(__m128i even, __m128i b) {
    __m128i assist = _mm_shuffle_epi32(_mm_aeskeygenassist_si128(even, 0), 0xaa), t = _mm_slli_si128(b, 4);
    b = _mm_xor_si128(b, t);
    t = _mm_slli_si128(t, 4);
    b = _mm_xor_si128(b, t);
    t = _mm_slli_si128(t, 4);
    b = _mm_xor_si128(b, t);
    return _mm_xor_si128(b, assist);
}

#define EXPAND(i, rcon)                                                                                        \
    a = expand_even(a, _mm_aeskeygenassist_si128(b, rcon));                                                    \
    g->rk[i] = a;                                                                                              \
    if (i < 14) {                                                                                              \
        b = expand_odd(a, b);                                                                                  \
        g->rk[i + 1] = b;                                                                                      \
    }

TARGET static __m128i aes(const struct xpu_gcm *g, __m128i block) {
    block = _mm_xor_si128(block, g->rk[0]);
    for (int i = 1; i < 14; i++)
        block = _mm_aesenc_si128(block, g->rk[i]);
    return _mm_aesenclast_si128(block, g->rk[14]);
}

/* ---- GHASH -------------------------------------------------------------------------------------------- */
TARGET static __m128i gf_multiply(__m128i a, __m128i b) {
    __m128i lo = _mm_clmulepi64_si128(a, b, 0x00), mid = _mm_clmulepi64_si128(a, b, 0x10);
    __m128i hi = _mm_clmulepi64_si128(a, b, 0x11), t, u, v;
    mid = _mm_xor_si128(mid, _mm_clmulepi64_si128(a, b, 0x01));
    lo = _mm_xor_si128(lo, _mm_slli_si128(mid, 8));
    hi = _mm_xor_si128(hi, _mm_srli_si128(mid, 8));
    /* the 256-bit product shifted left by one bit (the operands are bit-reflected) */
    t = _mm_srli_epi32(lo, 31);
    u = _mm_srli_epi32(hi, 31);
    lo = _mm_slli_epi32(lo, 1);
    hi = _mm_slli_epi32(hi, 1);
    v = _mm_srli_si128(t, 12);
    u = _mm_slli_si128(u, 4);
    t = _mm_slli_si128(t, 4);
    lo = _mm_or_si128(lo, t);
    hi = _mm_or_si128(_mm_or_si128(hi, u), v);
    /* reduced modulo x^128 + x^7 + x^2 + x + 1 */
    t = _mm_xor_si128(_mm_xor_si128(_mm_slli_epi32(lo, 31), _mm_slli_epi32(lo, 30)), _mm_slli_epi32(lo, 25));
    u = _mm_srli_si128(t, 4);
    lo = _mm_xor_si128(lo, _mm_slli_si128(t, 12));
    t = _mm_xor_si128(_mm_xor_si128(_mm_srli_epi32(lo, 1), _mm_srli_epi32(lo, 2)), _mm_srli_epi32(lo, 7));
    lo = _mm_xor_si128(lo, _mm_xor_si128(t, u));
    return _mm_xor_si128(hi, lo);
}

TARGET static __m128i load_part(const uint8_t *p, size_t n) {
    uint8_t block[16] = {0};
    memcpy(block, p, n);
    return _mm_loadu_si128((const __m128i *)block);
}

TARGET static __m128i ghash(__m128i x, __m128i h, const uint8_t *p, size_t n) {
    for (; n >= 16; p += 16, n -= 16)
        x = gf_multiply(_mm_xor_si128(x, _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)p), BSWAP)), h);
    if (n)
        x = gf_multiply(_mm_xor_si128(x, _mm_shuffle_epi8(load_part(p, n), BSWAP)), h);
    return x;
}

/* ---- GCM with the record's nonce ---------------------------------------------------------------------- */
TARGET static __m128i counter(uint64_t count, uint32_t i) {
    uint8_t block[16] = {0};
    for (int k = 0; k < 8; k++)
        block[k] = (uint8_t)(count >> (8 * k)); /* the nonce: the count, 12 bytes little-endian */
    block[12] = (uint8_t)(i >> 24);
    block[13] = (uint8_t)(i >> 16);
    block[14] = (uint8_t)(i >> 8);
    block[15] = (uint8_t)i;
    return _mm_loadu_si128((const __m128i *)block);
}

/* out = in xor the key stream from counter block 2 on; four blocks at a time, their AES rounds interleaved */
TARGET static void ctr(const struct xpu_gcm *g, uint64_t count, const uint8_t *in, uint8_t *out, size_t n) {
    uint32_t i = 2;
    for (; n >= 64; in += 64, out += 64, n -= 64, i += 4) {
        __m128i b[4];
        for (int k = 0; k < 4; k++)
            b[k] = _mm_xor_si128(counter(count, i + k), g->rk[0]);
        for (int r = 1; r < 14; r++)
            for (int k = 0; k < 4; k++)
                b[k] = _mm_aesenc_si128(b[k], g->rk[r]);
        for (int k = 0; k < 4; k++) {
            b[k] = _mm_aesenclast_si128(b[k], g->rk[14]);
            _mm_storeu_si128((__m128i *)(out + 16 * k),
                             _mm_xor_si128(_mm_loadu_si128((const __m128i *)(in + 16 * k)), b[k]));
        }
    }
    for (; n >= 16; in += 16, out += 16, n -= 16, i++)
        _mm_storeu_si128((__m128i *)out, _mm_xor_si128(_mm_loadu_si128((const __m128i *)in), aes(g, counter(count, i))));
    if (n) {
        uint8_t block[16];
        _mm_storeu_si128((__m128i *)block, _mm_xor_si128(load_part(in, n), aes(g, counter(count, i))));
        memcpy(out, block, n);
    }
}

TARGET static __m128i tag_of(const struct xpu_gcm *g, uint64_t count, const uint8_t *head, const uint8_t *sealed,
                             size_t n) {
    __m128i x = ghash(ghash(_mm_setzero_si128(), g->h, head, HEAD), g->h, sealed, n);
    x = gf_multiply(_mm_xor_si128(x, _mm_set_epi64x((long long)HEAD * 8, (long long)n * 8)), g->h);
    return _mm_xor_si128(_mm_shuffle_epi8(x, BSWAP), aes(g, counter(count, 1)));
}

TARGET struct xpu_gcm *xpu_gcm_new(const uint8_t key[32]) {
    struct xpu_gcm *g = aligned_alloc(16, sizeof *g);
    if (!g)
        return NULL;
    __m128i a = _mm_loadu_si128((const __m128i *)key), b = _mm_loadu_si128((const __m128i *)(key + 16));
    g->rk[0] = a;
    g->rk[1] = b;
    EXPAND(2, 0x01) EXPAND(4, 0x02) EXPAND(6, 0x04) EXPAND(8, 0x08) EXPAND(10, 0x10) EXPAND(12, 0x20)
    EXPAND(14, 0x40)
    g->h = _mm_shuffle_epi8(aes(g, _mm_setzero_si128()), BSWAP);
    return g;
}

void xpu_gcm_free(struct xpu_gcm *g) {
    if (g) {
        explicit_bzero(g, sizeof *g); /* the keys die with the stream */
        free(g);
    }
}

/* A record of n plaintext bytes at `in`, written at `out`: its length (u32 little-endian), the ciphertext and
 * the tag; n + 20 bytes. */
TARGET void xpu_gcm_seal(const struct xpu_gcm *g, uint64_t count, const uint8_t *in, size_t n, uint8_t *out) {
    uint32_t length = (uint32_t)n;
    for (int k = 0; k < HEAD; k++)
        out[k] = (uint8_t)(length >> (8 * k));
    ctr(g, count, in, out + HEAD, n);
    _mm_storeu_si128((__m128i *)(out + HEAD + n), tag_of(g, count, out, out + HEAD, n));
}

/* The record at `record` (head, n bytes of ciphertext, tag) checked and, only if its tag is right, opened into
 * `out` (NULL: in place, record + 4): 0; -1 if its tag is wrong (nothing was decrypted). */
TARGET int xpu_gcm_open(const struct xpu_gcm *g, uint64_t count, uint8_t *record, size_t n, uint8_t *out) {
    __m128i want = tag_of(g, count, record, record + HEAD, n);
    __m128i diff = _mm_xor_si128(want, _mm_loadu_si128((const __m128i *)(record + HEAD + n)));
    if (!_mm_testz_si128(diff, diff))
        return -1;
    ctr(g, count, record + HEAD, out ? out : record + HEAD, n);
    return 0;
}

/* A synchronous call's message or answer, as one read brought it: the record at the start of `raw` (`got` bytes
 * read), if it is there whole and holds 1 to `most` bytes, checked and opened into `out`. Its plaintext length;
 * 0 if it is not whole there or its length is out of that range (the caller reads it the long way); -1 if its
 * check fails (out's first `length` bytes zeroed, as the caller zeroes after OpenSSL's failure). */
TARGET int64_t xpu_gcm_open_first(const struct xpu_gcm *g, uint64_t count, uint8_t *raw, size_t got, size_t most,
                                  uint8_t *out) {
    if (got < HEAD)
        return 0;
    size_t n = (size_t)raw[0] | (size_t)raw[1] << 8 | (size_t)raw[2] << 16 | (size_t)raw[3] << 24;
    if (n == 0 || n > most || got < HEAD + n + TAG)
        return 0;
    if (xpu_gcm_open(g, count, raw, n, out)) {
        memset(out, 0, n);
        return -1;
    }
    return (int64_t)n;
}
