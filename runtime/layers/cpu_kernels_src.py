"""C source of the CPU decode kernels (built and loaded by ``cpu_kernels.py``).

Kept as a Python string so it ships with the package like any module (no package-data rules)
and its hash names the compiled library in the cache.

Layout conventions shared by every kernel:
- fp32 everywhere; ``n`` rows (tokens of a decode batch).
- A matrix produced by a split matmul (``layers/linear.py``: ``[splits, n, cols / splits]``)
  is read through ``row_of``; for ``n == 1`` or ``splits == 1`` that is plain row-major.
- KV buffers are ``[slots, kv_heads, head_dim]``; ``req_to_token`` is ``[rows, stride]``.
- ``matvec`` reads a split-layout weight ``[splits, in, blk]`` (one block per OpenMP thread).
"""
from __future__ import annotations

SOURCE = r"""
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

typedef int64_t i64;

typedef struct {
    i64 n, heads, kv_heads, head_dim, rtt_stride;
    const i64 *positions, *out_loc, *rows, *seq_lens, *rtt;
    const float *cos_tab, *sin_tab; /* [max_pos, head_dim]; sin has its first half negated */
    float *qkv_rows;                /* [n, qkv cols]: the rows after bias / norms / rotary */
    float *scores;                  /* [threads, heads / kv_heads, rtt_stride] */
    i64 threads;                    /* OpenMP team cap (scores has room for this many) */
    i64 parallel_min_keys;          /* attend in parallel from this many keys x kv heads */
    float scale, norm_eps;
} DecodeStep;

/* e^x to ~1 ulp (Cephes expf), branch-free so gcc vectorizes the loops that call it. */
static inline float exp_f(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float k = __builtin_rintf(x * 1.44269504088896341f);
    float r = x - k * 0.693359375f + k * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* Row r of an [n, cols] matrix held as [splits, n, cols / splits] column blocks. */
static const float *row_of(const float *m, i64 r, i64 n, i64 cols, i64 splits, float *tmp) {
    if (splits == 1) return m + r * cols;
    if (n == 1) return m; /* the blocks of a single row are adjacent */
    i64 blk = cols / splits;
    for (i64 s = 0; s < splits; s++) memcpy(tmp + s * blk, m + (s * n + r) * blk, blk * 4);
    return tmp;
}

static void rms_row(const float *x, const float *w, float *out, i64 d, float eps) {
    float ss = 0.0f;
    for (i64 i = 0; i < d; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (i64 i = 0; i < d; i++) out[i] = x[i] * inv * w[i];
}

/* res += x (x may be NULL: res already holds the sum); out = rmsnorm(res) * w. */
void add_rmsnorm(const float *x, i64 x_splits, float *res, const float *w, float *out,
                 i64 n, i64 d, float eps, float *tmp) {
    for (i64 r = 0; r < n; r++) {
        float *rr = res + r * d;
        if (x) {
            const float *xr = row_of(x, r, n, d, x_splits, tmp);
            for (i64 i = 0; i < d; i++) rr[i] += xr[i];
        }
        rms_row(rr, w, out + r * d, d, eps);
    }
}

/* out[r] = silu(gate) * up for a packed [gate | up] row of 2 * d. */
void silu_mul(const float *gu, i64 splits, float *out, i64 n, i64 d, float *tmp) {
    for (i64 r = 0; r < n; r++) {
        const float *g = row_of(gu, r, n, 2 * d, splits, tmp), *u = g + d;
        float *o = out + r * d;
        for (i64 i = 0; i < d; i++) o[i] = g[i] / (1.0f + exp_f(-g[i])) * u[i];
    }
}

/* y[blk] = x[in] @ w[in, blk]. NOTE: one core streams weights faster with several
   independent read streams in flight: narrow blocks (rows of a few KB, adjacent rows forming
   one stream) are read as 4 bands of rows far apart, summed into one accumulator (measured on
   the 2-core EPYC box at 1 thread: ~22 GB/s vs ~16 GB/s for MKL's gemm over the same weights).
   Wide blocks (the logits matrix) already give 4 far-apart rows per step. */
static inline void axpy4(const float *x4, const float *w0, i64 q, float *y, i64 blk) {
    const float *w1 = w0 + q * blk, *w2 = w1 + q * blk, *w3 = w2 + q * blk;
    float a = x4[0], b = x4[q], c = x4[2 * q], d = x4[3 * q];
    for (i64 j = 0; j < blk; j++) y[j] += a * w0[j] + b * w1[j] + c * w2[j] + d * w3[j];
}

/* y[r] = x[r] @ w for n rows (x: [n, in], y rows y_stride apart). Each group of 4 weight rows
   is read from memory once and applied to every x row while it sits in L1/L2, so rows cost
   little beyond the first; each row sums in the same order whatever n is. */
static void matvec_block(const float *x, i64 n, const float *w, float *y, i64 y_stride,
                         i64 in, i64 blk) {
    i64 done;
    for (i64 r = 0; r < n; r++)
        for (i64 j = 0; j < blk; j++) y[r * y_stride + j] = 0.0f;
    if (blk <= 4096) { /* bands: rows i, q + i, 2q + i, 3q + i */
        i64 q = in / 4;
        for (i64 i = 0; i < q; i++)
            for (i64 r = 0; r < n; r++) axpy4(x + r * in + i, w + i * blk, q, y + r * y_stride, blk);
        done = 4 * q;
    } else { /* adjacent rows i .. i + 3 */
        for (done = 0; done + 4 <= in; done += 4)
            for (i64 r = 0; r < n; r++)
                axpy4(x + r * in + done, w + done * blk, 1, y + r * y_stride, blk);
    }
    for (i64 i = done; i < in; i++)
        for (i64 r = 0; r < n; r++)
            for (i64 j = 0; j < blk; j++) y[r * y_stride + j] += x[r * in + i] * w[i * blk + j];
}

/* y [n, splits * blk] (row-major) = x [n, in] @ w [splits, in, blk]. */
void matvec(const float *x, i64 n, const float *w, float *y, i64 splits, i64 in, i64 blk) {
    #pragma omp parallel for num_threads(splits) schedule(static) if (splits > 1)
    for (i64 s = 0; s < splits; s++)
        matvec_block(x, n, w + s * in * blk, y + s * blk, splits * blk, in, blk);
}

/* Neox rotary on `heads` heads of x in place: x * cos + [x2, x1] * signed_sin. */
static void rotate(float *x, i64 heads, i64 d, const float *c, const float *s) {
    i64 h2 = d / 2;
    for (i64 h = 0; h < heads; h++) {
        float *v = x + h * d;
        for (i64 i = 0; i < h2; i++) {
            float a = v[i], b = v[i + h2];
            v[i] = a * c[i] + b * s[i];
            v[i + h2] = b * c[i + h2] + a * s[i + h2];
        }
    }
}

/* One kv group of one request: softmax(q k^T * scale) v for its `g` query heads. */
static void attend_group(const DecodeStep *st, const float *q, const float *k_buf,
                         const float *v_buf, const i64 *slots, i64 len, i64 grp, float *out,
                         float *s) {
    i64 d = st->head_dim, g = st->heads / st->kv_heads, row = st->kv_heads * d;
    for (i64 j = 0; j < len; j++) {
        const float *k = k_buf + slots[j] * row + grp * d;
        for (i64 h = 0; h < g; h++) {
            const float *qh = q + h * d;
            float dot = 0.0f;
            for (i64 i = 0; i < d; i++) dot += qh[i] * k[i];
            s[h * len + j] = dot * st->scale;
        }
    }
    for (i64 h = 0; h < g; h++) {
        float *sh = s + h * len, m = sh[0], sum = 0.0f;
        for (i64 j = 1; j < len; j++) m = sh[j] > m ? sh[j] : m;
        for (i64 j = 0; j < len; j++) { sh[j] = exp_f(sh[j] - m); sum += sh[j]; }
        float inv = 1.0f / sum, *o = out + h * d;
        for (i64 i = 0; i < d; i++) o[i] = 0.0f;
        for (i64 j = 0; j < len; j++) {
            const float *v = v_buf + slots[j] * row + grp * d;
            float p = sh[j] * inv;
            for (i64 i = 0; i < d; i++) o[i] += p * v[i];
        }
    }
}

/* Row r of qkv (+ bias), (q/k head norms), rotary on q and k; stores k and v at out_loc. */
static void prepare_row(const DecodeStep *st, const float *qkv, i64 qkv_splits, i64 r,
                        const float *bias, const float *q_norm, const float *k_norm,
                        float *k_buf, float *v_buf) {
    i64 d = st->head_dim, nh = st->heads, nkv = st->kv_heads, cols = (nh + 2 * nkv) * d;
    float *row = st->qkv_rows + r * cols;
    const float *src = row_of(qkv, r, st->n, cols, qkv_splits, row);
    if (src != row) memcpy(row, src, cols * 4);
    if (bias) for (i64 i = 0; i < cols; i++) row[i] += bias[i];
    float *q = row, *k = row + nh * d, *v = k + nkv * d;
    if (q_norm) {
        for (i64 h = 0; h < nh; h++) rms_row(q + h * d, q_norm, q + h * d, d, st->norm_eps);
        for (i64 h = 0; h < nkv; h++) rms_row(k + h * d, k_norm, k + h * d, d, st->norm_eps);
    }
    i64 pos = st->positions[r];
    rotate(q, nh + nkv, d, st->cos_tab + pos * d, st->sin_tab + pos * d);
    memcpy(k_buf + st->out_loc[r] * nkv * d, k, nkv * d * 4);
    memcpy(v_buf + st->out_loc[r] * nkv * d, v, nkv * d * 4);
}

/* Decode attention of n requests, one new token each. qkv: [n, (heads + 2 kv_heads) * d].
   (request, kv group) pairs run on the OpenMP team when there are enough keys to pay for it. */
void decode_attention(const DecodeStep *st, const float *qkv, i64 qkv_splits,
                      const float *bias, const float *q_norm, const float *k_norm,
                      float *k_buf, float *v_buf, float *out) {
    i64 d = st->head_dim, nh = st->heads, nkv = st->kv_heads, g = nh / nkv;
    i64 cols = (nh + 2 * nkv) * d, keys = 0;
    for (i64 r = 0; r < st->n; r++) {
        prepare_row(st, qkv, qkv_splits, r, bias, q_norm, k_norm, k_buf, v_buf);
        keys += st->seq_lens[r];
    }
    #pragma omp parallel for schedule(dynamic, 1) num_threads(st->threads) \
        if (st->threads > 1 && keys * nkv >= st->parallel_min_keys)
    for (i64 t = 0; t < st->n * nkv; t++) {
        i64 r = t / nkv, grp = t % nkv;
        float *s = st->scores + omp_get_thread_num() * g * st->rtt_stride;
        const i64 *slots = st->rtt + st->rows[r] * st->rtt_stride;
        attend_group(st, st->qkv_rows + r * cols + grp * g * d, k_buf, v_buf, slots,
                     st->seq_lens[r], grp, out + r * nh * d + grp * g * d, s);
    }
}
"""
