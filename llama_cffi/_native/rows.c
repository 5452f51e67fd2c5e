/* Many logits rows at once (llama_cffi.kernels.RowMeasures): for each row its maximum,
   log-normaliser and entropy, and its k best candidates, on a small pool of threads.
   Called from Python with the GIL released (cffi releases it around every call). */
#include "internal.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define LLAMA_CFFI_X86 1
#endif

/* ------------------------------------------------------------------ one row */

/* floats per block of the second pass: its exponentials stay in L1 (16 KiB) */
#define ROWS_BLOCK 4096
/* rows of at least this many values are summarised by 64 interleaved group maxima */
#define ROWS_GROUPED_MIN 8192

typedef struct {
    int n_rows;
    const float *const *rows;
    int n;
    const int32_t *k;    /* candidates wanted per row (0: none) */
    const int32_t *dest; /* output slot of each row */
    int k_stride;        /* candidates each slot holds */
    const int32_t *measure; /* per row: compute log_norm and entropy (NULL: every row) */
    float *out_max;
    double *out_log_norm;
    double *out_entropy;
    int32_t *out_status;
    int32_t *out_n_top;
    int32_t *top_ids;
    float *top_logits;
    int next;  /* next row to take (atomic) */
    int error; /* out of memory somewhere */
} rows_job;

/* bmax[c] = max of the block x[64 c .. 64 c + 63] for c < nb; nonzero when any value is NaN */
static int rows_block_max_scalar(const float *x, int nb, float *bmax) {
    int nan = 0;
    for (int c = 0; c < nb; ++c) {
        const float *xb = x + (size_t)c * 64;
        float m = xb[0];
        for (int i = 0; i < 64; ++i) {
            nan |= xb[i] != xb[i];
            m = xb[i] > m ? xb[i] : m;
        }
        bmax[c] = m;
    }
    return nan;
}

/* max of x[0..n) (ignoring NaN); *nan set when any value is NaN */
static float rows_max_scalar(const float *x, int n, int *nan) {
    float m = -INFINITY;
    for (int i = 0; i < n; ++i) {
        *nan |= x[i] != x[i];
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

/* sum over i of y_i * (x_i - max) in double, skipping y_i == 0 (a -inf logit) */
static double rows_dot_scalar(int n, const float *y, const float *x, float max) {
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    int i = 0;
    for (; i + 3 < n; i += 4) {
        if (y[i] != 0.0f) a0 += (double)y[i] * (double)(x[i] - max);
        if (y[i + 1] != 0.0f) a1 += (double)y[i + 1] * (double)(x[i + 1] - max);
        if (y[i + 2] != 0.0f) a2 += (double)y[i + 2] * (double)(x[i + 2] - max);
        if (y[i + 3] != 0.0f) a3 += (double)y[i + 3] * (double)(x[i + 3] - max);
    }
    for (; i < n; ++i) {
        if (y[i] != 0.0f) a0 += (double)y[i] * (double)(x[i] - max);
    }
    return (a0 + a1) + (a2 + a3);
}

#ifdef LLAMA_CFFI_X86
__attribute__((target("avx2"))) static int rows_block_max_avx2(const float *x, int nb, float *bmax) {
    __m256 bad = _mm256_setzero_ps();
    for (int c = 0; c < nb; ++c) {
        const float *xb = x + (size_t)c * 64;
        __m256 v[8];
        for (int i = 0; i < 8; ++i) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
        }
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3])),
                                 _mm256_max_ps(_mm256_max_ps(v[4], v[5]), _mm256_max_ps(v[6], v[7])));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        bmax[c] = _mm_cvtss_f32(h);
    }
    return _mm256_movemask_ps(bad) != 0;
}

__attribute__((target("avx2"))) static double rows_dot_avx2(int n, const float *y, const float *x, float max) {
    const __m256 vm = _mm256_set1_ps(max);
    const __m256 zero = _mm256_setzero_ps();
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int i = 0;
    for (; i + 7 < n; i += 8) {
        const __m256 vy = _mm256_loadu_ps(y + i);
        /* y == 0 (a -inf logit, or an exponential that underflowed) adds nothing */
        const __m256 d = _mm256_and_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), _mm256_cmp_ps(vy, zero, _CMP_NEQ_OQ));
        a0 = _mm256_add_pd(a0, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(vy)),
                                             _mm256_cvtps_pd(_mm256_castps256_ps128(d))));
        a1 = _mm256_add_pd(a1, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(vy, 1)),
                                             _mm256_cvtps_pd(_mm256_extractf128_ps(d, 1))));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(a0, a1));
    double acc = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < n; ++i) {
        if (y[i] != 0.0f) acc += (double)y[i] * (double)(x[i] - max);
    }
    return acc;
}

static int rows_have_avx2(void) {
    static int have = -1;
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return have;
}
#endif

static int rows_block_max(const float *x, int nb, float *bmax) {
#ifdef LLAMA_CFFI_X86
    if (rows_have_avx2()) return rows_block_max_avx2(x, nb, bmax);
#endif
    return rows_block_max_scalar(x, nb, bmax);
}

static double rows_dot(int n, const float *y, const float *x, float max) {
#ifdef LLAMA_CFFI_X86
    if (rows_have_avx2()) return rows_dot_avx2(n, y, x, max);
#endif
    return rows_dot_scalar(n, y, x, max);
}

/* the k best of a NaN-free row without a group summary: a threshold from a selection
   over a copy, then the values that reach it, sorted. 0, or -1 when out of memory. */
static int rows_top_k_select(const float *x, int n, int k, int32_t *ids, float *logits) {
    float *tmp = (float *)malloc(sizeof(float) * (size_t)n);
    if (tmp == NULL) return -1;
    memcpy(tmp, x, sizeof(float) * (size_t)n);
    const float th = llama_cffi_select(tmp, n, n - k);
    free(tmp);
    size_t m = 0;
    for (int i = 0; i < n; ++i) m += x[i] >= th;
    llama_cffi_vp *cand = (llama_cffi_vp *)malloc(sizeof(llama_cffi_vp) * m);
    if (cand == NULL) return -1;
    m = 0;
    for (int i = 0; i < n; ++i) {
        if (x[i] >= th) {
            cand[m].v = x[i];
            cand[m].pos = i;
            ++m;
        }
    }
    llama_cffi_vp_sort(cand, m);
    for (int i = 0; i < k; ++i) {
        ids[i] = (int32_t)cand[i].pos;
        logits[i] = cand[i].v;
    }
    free(cand);
    return 0;
}

/* the k best of a NaN-free row summarised by block maxima (bmax[c]: the max of the 64
   values x[64 c ..], c < nb; the values past 64 nb are the tail): the k-th largest block
   max is a threshold at least k values reach, so only the blocks that reach it are read.
   Needs 1 <= k <= nb. 0, or -1 when out of memory. */
static int rows_top_k_blocks(const float *x, int n, int nb, const float *bmax, float *heap, int k, int32_t *ids,
                             float *logits) {
    /* the k-th largest block max: a min-heap of the k largest seen (most blocks are below
       its top and cost one comparison) */
    for (int c = 0; c < k; ++c) {
        int i = c;
        heap[i] = bmax[c];
        while (i > 0 && heap[(i - 1) / 2] > heap[i]) {
            const float t = heap[i];
            heap[i] = heap[(i - 1) / 2];
            heap[(i - 1) / 2] = t;
            i = (i - 1) / 2;
        }
    }
    for (int c = k; c < nb; ++c) {
        const float v = bmax[c];
        if (!(v > heap[0])) continue;
        int i = 0;
        for (;;) { /* replace the top and sift it down */
            int l = 2 * i + 1, best = i;
            float bv = v;
            if (l < k && heap[l] < bv) {
                best = l;
                bv = heap[l];
            }
            if (l + 1 < k && heap[l + 1] < bv) best = l + 1;
            if (best == i) break;
            heap[i] = heap[best];
            i = best;
        }
        heap[i] = v;
    }
    const float th = heap[0];
    size_t cap = (size_t)k * 4 + 64, m = 0;
    llama_cffi_vp *cand = (llama_cffi_vp *)malloc(sizeof(llama_cffi_vp) * cap);
    if (cand == NULL) return -1;
    int ok = 0;
    for (int c = 0; c < nb && ok == 0; ++c) {
        if (!(bmax[c] >= th)) continue;
        const float *xb = x + (size_t)c * 64;
        for (int i = 0; i < 64 && ok == 0; ++i) {
            if (xb[i] >= th) ok = llama_cffi_vp_push(&cand, &m, &cap, xb[i], c * 64 + i);
        }
    }
    for (int p = nb * 64; p < n && ok == 0; ++p) {
        if (x[p] >= th) ok = llama_cffi_vp_push(&cand, &m, &cap, x[p], p);
    }
    if (ok != 0) {
        free(cand);
        return -1;
    }
    llama_cffi_vp_sort(cand, m);
    for (int i = 0; i < k; ++i) { /* m >= k: k values reach th */
        ids[i] = (int32_t)cand[i].pos;
        logits[i] = cand[i].v;
    }
    free(cand);
    return 0;
}

/* one row: max (and group maxima), then the exponentials block by block (ggml's soft_max
   kernel with the row's max, as llama_cffi_softmax_sum) for the normaliser and the
   entropy, then the k best candidates. */
static void rows_one(rows_job *j, int r, float *scratch, float *bmax, float *sel) {
    const float *x = j->rows[r];
    const int n = j->n;
    const int slot = j->dest != NULL ? j->dest[r] : r;
    int k = j->k != NULL ? j->k[r] : 0;
    if (k > n) k = n;
    if (k > j->k_stride) k = j->k_stride;
    const int nb = n >= ROWS_GROUPED_MIN ? n / 64 : 0;
    int nan = 0;
    float m;
    if (nb > 0) {
        nan = rows_block_max(x, nb, bmax);
        m = rows_max_scalar(bmax, nb, &nan);
        const float t = rows_max_scalar(x + (size_t)nb * 64, n - nb * 64, &nan);
        m = t > m ? t : m;
    } else {
        m = rows_max_scalar(x, n, &nan);
    }
    int status = 0;
    if (nan) status = 1;
    else if (m == INFINITY) status = 2;
    else if (m == -INFINITY) status = 3;
    j->out_max[slot] = nan ? NAN : m;
    j->out_status[slot] = status;
    const int measure = j->measure == NULL || j->measure[r];
    double log_norm = NAN, ent = NAN;
    if (measure && status == 0) {
        double s = 0.0, d = 0.0;
        for (int off = 0; off < n; off += ROWS_BLOCK) {
            const int b = n - off < ROWS_BLOCK ? n - off : ROWS_BLOCK;
            s += llama_cffi_softmax_sum(b, scratch, x + off, m);
            d += rows_dot(b, scratch, x + off, m);
        }
        log_norm = log(s);
        ent = log_norm - d / s;
        const double hi = log((double)n);
        ent = ent < 0.0 ? 0.0 : (ent > hi ? hi : ent);
    }
    if (measure && j->out_log_norm != NULL) j->out_log_norm[slot] = log_norm;
    if (measure && j->out_entropy != NULL) j->out_entropy[slot] = ent;
    int got = 0;
    if (k > 0 && status != 1) {
        int32_t *ids = j->top_ids + (size_t)slot * j->k_stride;
        float *lg = j->top_logits + (size_t)slot * j->k_stride;
        if (nb > 0 && k * 8 <= nb) {
            got = rows_top_k_blocks(x, n, nb, bmax, sel, k, ids, lg) == 0 ? k : -1;
        } else {
            got = rows_top_k_select(x, n, k, ids, lg) == 0 ? k : -1;
        }
        if (got < 0) {
            got = 0;
            j->error = 1;
        }
    }
    j->out_n_top[slot] = got;
}

/* ------------------------------------------------------------------ the work */

#define ROWS_MAX_THREADS 64

typedef struct {
    float *scratch; /* ROWS_BLOCK exponentials */
    float *bmax;    /* block maxima, and a copy to select in */
    int cap_nb;
} rows_buffers;

static int rows_buffers_fit(rows_buffers *b, int n) {
    const int nb = n / 64 + 1;
    if (b->scratch == NULL) {
        b->scratch = (float *)malloc(sizeof(float) * ROWS_BLOCK);
        if (b->scratch == NULL) return -1;
    }
    if (nb > b->cap_nb) {
        free(b->bmax);
        b->bmax = (float *)malloc(sizeof(float) * 2 * (size_t)nb);
        b->cap_nb = b->bmax != NULL ? nb : 0;
        if (b->bmax == NULL) return -1;
    }
    return 0;
}

/* take rows until none is left (on any thread of the pool: each keeps its buffers) */
static void rows_task(void *arg, int worker) {
    static __thread rows_buffers buf; /* this thread's, reused across calls */
    rows_job *j = (rows_job *)arg;
    (void)worker;
    if (rows_buffers_fit(&buf, j->n) != 0) {
        __atomic_store_n(&j->error, 1, __ATOMIC_RELAXED);
        return;
    }
    for (;;) {
        const int r = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (r >= j->n_rows) return;
        rows_one(j, r, buf.scratch, buf.bmax, buf.bmax + buf.cap_nb);
    }
}

int llama_cffi_rows_measure(int n_rows, const float *const *rows, int n, const int32_t *k, const int32_t *dest, int k_stride, const int32_t *measure, int n_threads, float *out_max, double *out_log_norm, double *out_entropy, int32_t *out_status, int32_t *out_n_top, int32_t *top_ids, float *top_logits) {
    if (n_rows < 0 || n <= 0 || k_stride < 0 || rows == NULL || out_max == NULL || out_status == NULL ||
        out_n_top == NULL || (k_stride > 0 && (top_ids == NULL || top_logits == NULL)))
        return -1;
    if (n_rows == 0) return 0;
    rows_job j;
    memset(&j, 0, sizeof(j));
    j.n_rows = n_rows;
    j.rows = rows;
    j.n = n;
    j.k = k_stride > 0 ? k : NULL;
    j.dest = dest;
    j.k_stride = k_stride;
    j.measure = measure;
    j.out_max = out_max;
    j.out_log_norm = out_log_norm;
    j.out_entropy = out_entropy;
    j.out_status = out_status;
    j.out_n_top = out_n_top;
    j.top_ids = top_ids;
    j.top_logits = top_logits;
    int helpers = n_threads - 1;
    if (helpers > n_rows - 1) helpers = n_rows - 1;
    if (helpers > ROWS_MAX_THREADS - 1) helpers = ROWS_MAX_THREADS - 1;
    llama_cffi_pool_run(helpers, rows_task, &j); /* helpers <= 0: this thread alone */
    return __atomic_load_n(&j.error, __ATOMIC_RELAXED) ? -2 : 0;
}

int llama_cffi_rows_pool_size(void) { return llama_cffi_pool_size(); }

/* log(sum(exp(x - max[r]))) over the first n[r] values of row r of a (n_rows, stride)
   matrix, with llama_cffi_softmax_sum (ggml's kernel when bound: the arithmetic of the
   one-row measures); -inf rows give NaN. 0, -1 on bad arguments, -2 out of memory. */
int llama_cffi_rows_log_sum(int n_rows, const float *x, int stride, const int32_t *n, const float *max, double *out) {
    if (n_rows < 0 || stride <= 0 || x == NULL || n == NULL || max == NULL || out == NULL) return -1;
    float *scratch = (float *)malloc(sizeof(float) * (size_t)stride);
    if (scratch == NULL) return -2;
    for (int r = 0; r < n_rows; ++r) {
        const int m = n[r] < stride ? n[r] : stride;
        out[r] = m > 0 ? log(llama_cffi_softmax_sum(m, scratch, x + (size_t)r * stride, max[r])) : NAN;
    }
    free(scratch);
    return 0;
}

/* samplers.chain_batch's top-p step (see llama_cffi.h): numpy's
   cumsum(pr, dtype=float32)[n - 1], pr / total, cumsum(..., dtype=float32) >= p, each row's
   first hit at or after min_keep - 1 and before n */
int llama_cffi_top_p_rows(int n_rows, int k, float *x, const float *pr, int32_t *n, float p, int min_keep) {
    if (n_rows < 0 || k <= 0 || (n_rows && (x == NULL || pr == NULL || n == NULL))) return -1;
    for (int r = 0; r < n_rows; ++r)
        if (n[r] < 1 || n[r] > k) return -1;
    for (int r = 0; r < n_rows; ++r) {
        const float *q = pr + (size_t)r * (size_t)k;
        const int m = n[r];
        float total = q[0];
        for (int j = 1; j < m; ++j) total = total + q[j];
        float acc = 0.0f;
        int hit = -1;
        for (int j = 0; j < m; ++j) {
            const float d = q[j] / total;
            acc = j ? acc + d : d;
            if (j >= min_keep - 1 && acc >= p) {
                hit = j;
                break;
            }
        }
        if (hit >= 0) n[r] = hit + 1;
        float *row = x + (size_t)r * (size_t)k;
        for (int j = n[r]; j < k; ++j) row[j] = -INFINITY;
    }
    return 0;
}

/* samplers.chain_batch's dist step (see llama_cffi.h): numpy's cumsum(pr, dtype=float64),
   count_nonzero(cum < cum[n - 1] * u), at most n - 1 */
int llama_cffi_dist_rows(int n_rows, int k, const float *pr, const int32_t *n, const double *u, int32_t *sel) {
    if (n_rows < 0 || k <= 0 || (n_rows && (pr == NULL || n == NULL || u == NULL || sel == NULL))) return -1;
    for (int r = 0; r < n_rows; ++r)
        if (n[r] < 1 || n[r] > k) return -1;
    for (int r = 0; r < n_rows; ++r) {
        const float *q = pr + (size_t)r * (size_t)k;
        const int m = n[r];
        double mass = (double)q[0];
        for (int j = 1; j < m; ++j) mass = mass + (double)q[j];
        const double t = mass * u[r];
        /* the running sum never decreases (pr >= 0): the count of sums below t is the first
           position whose sum reaches it, k when none does (cum past n - 1 stays at mass) */
        double acc = 0.0;
        int c = 0;
        for (; c < k; ++c) {
            acc = c ? acc + (double)q[c] : (double)q[c];
            if (!(acc < t)) break;
        }
        sel[r] = c < m - 1 ? c : m - 1;
    }
    return 0;
}
