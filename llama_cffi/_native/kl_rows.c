/* llama-perplexity's per-row work for KL divergence (llama_cffi.kernels.kl_base_rows and
   kl_divergence_rows; see samplers.kl_divergence): the two log_softmax functions of
   tools/perplexity/perplexity.cpp that write and read the --kl-divergence-base file,
   operation by operation, so that the bytes and values are the tool's. Rows are shared
   among a pool of threads (pool.c); called from Python with the GIL released (cffi
   releases it around every call).

   Exactness rests on doing what the tool's compiled loop does: float32 where it uses
   float, float64 where it uses double, the C library's expf and log, additions in index
   order, and no fused multiply-adds (the tool is built without -march, so its compiler has
   none to use on x86-64; here they are turned off explicitly for every target). The numpy
   reference (samplers.kl_divergence._quantise_row and _kl_row) is tested against these. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "internal.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KL_MAX_THREADS 64

/* ------------------------------------------------------------------ sum of expf */

/* expf(x) is 0 below this (log(2**-150): the C library rounds the underflow to 0) */
#define KL_EXPF_ZERO (-0x1.9fe368p6f)

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KL_X86 1

/* 2**(j/32), j = 0..31 */
static const double kl_exp2_tab[32] = {
    0x1.0000000000000p+0,
    0x1.059b0d3158574p+0,
    0x1.0b5586cf9890fp+0,
    0x1.11301d0125b51p+0,
    0x1.172b83c7d517bp+0,
    0x1.1d4873168b9aap+0,
    0x1.2387a6e756238p+0,
    0x1.29e9df51fdee1p+0,
    0x1.306fe0a31b715p+0,
    0x1.371a7373aa9cbp+0,
    0x1.3dea64c123422p+0,
    0x1.44e086061892dp+0,
    0x1.4bfdad5362a27p+0,
    0x1.5342b569d4f82p+0,
    0x1.5ab07dd485429p+0,
    0x1.6247eb03a5585p+0,
    0x1.6a09e667f3bcdp+0,
    0x1.71f75e8ec5f74p+0,
    0x1.7a11473eb0187p+0,
    0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0,
    0x1.93737b0cdc5e5p+0,
    0x1.9c49182a3f090p+0,
    0x1.a5503b23e255dp+0,
    0x1.ae89f995ad3adp+0,
    0x1.b7f76f2fb5e47p+0,
    0x1.c199bdd85529cp+0,
    0x1.cb720dcef9069p+0,
    0x1.d5818dcfba487p+0,
    0x1.dfc97337b9b5fp+0,
    0x1.ea4afa2a490dap+0,
    0x1.f50765b6e4540p+0
};

/* expf of 4 floats t (all <= 0) as the C library computes them, into out. exp is computed
   in double (relative error below 1e-15: a table of 2**(j/32) and a degree-6 polynomial
   on |r| <= ln2/64) and rounded to float: that is the correctly rounded value, and the C
   library's equals it except where the exact value lies within 0.002 ulp of the midpoint
   between two floats (glibc's worst error is 0.502 ulp). So a lane whose double lies
   within 0.003 ulp of a midpoint, a subnormal or zero result, NaN, or a positive t (not
   expected) is computed by calling expf itself; t < log(2**-150) gives 0, as expf does.
   The same rule as samplers._libm.expf (checked there on 30 million floats). */
__attribute__((target("avx2,fma"))) static void kl_expf4(const float *t, float *out) {
    const __m128 tf = _mm_loadu_ps(t);
    const __m256d x = _mm256_cvtps_pd(tf);
    const __m256d z = _mm256_mul_pd(x, _mm256_set1_pd(0x1.71547652b82fep+5)); /* 32/ln2 */
    const __m256d kd = _mm256_round_pd(z, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* r = x - k*ln2/32, ln2/32 = hi + lo (k*hi exact: |k| < 2**13, hi has 37 bits) */
    __m256d r = _mm256_fnmadd_pd(kd, _mm256_set1_pd(0x1.62e42fefa0000p-6), x);
    r = _mm256_fnmadd_pd(kd, _mm256_set1_pd(0x1.cf79abc9e3b3ap-45), r);
    /* exp(r), |r| <= 0.0109: Taylor to r**6 (truncation below 2e-18) */
    __m256d p = _mm256_set1_pd(1.0 / 720);
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 120));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 24));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 6));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(0.5));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
    /* 2**(k/32) = 2**(k>>5) * tab[k&31] */
    const __m128i k = _mm256_cvtpd_epi32(kd);
    const __m256d tv = _mm256_i32gather_pd(kl_exp2_tab, _mm_and_si128(k, _mm_set1_epi32(31)), 8);
    const __m256i q = _mm256_slli_epi64(_mm256_cvtepi32_epi64(_mm_srai_epi32(k, 5)), 52);
    const __m256d scale = _mm256_castsi256_pd(_mm256_add_epi64(_mm256_castpd_si256(tv), q));
    const __m256d e = _mm256_mul_pd(scale, p);
    /* lanes to hand to expf: near a float rounding midpoint, below float's normal range
       (or NaN), or outside the range */
    const __m256i bits = _mm256_castpd_si256(e);
    const __m256i low = _mm256_and_si256(bits, _mm256_set1_epi64x((1LL << 29) - 1));
    const long long band = (long long)(0.003 * (1 << 29));
    const __m256i off = _mm256_sub_epi64(low, _mm256_set1_epi64x((1LL << 28) - band));
    const __m256i near_lo = _mm256_cmpgt_epi64(_mm256_setzero_si256(), off);             /* off < 0 */
    const __m256i near_hi = _mm256_cmpgt_epi64(_mm256_set1_epi64x(2 * band), off);       /* off < 2 band */
    const __m256i near = _mm256_andnot_si256(near_lo, near_hi);
    const __m256d normal = _mm256_cmp_pd(e, _mm256_set1_pd(0x1.0p-126), _CMP_GE_OQ);       /* false for NaN */
    /* x in [log(2**-150), 0]: the range the reduction above is valid for (NaN: neither) */
    const __m256d in_range = _mm256_and_pd(_mm256_cmp_pd(x, _mm256_setzero_pd(), _CMP_LE_OQ),
                                           _mm256_cmp_pd(x, _mm256_set1_pd(KL_EXPF_ZERO), _CMP_GE_OQ));
    const __m256d ok = _mm256_andnot_pd(_mm256_castsi256_pd(near), _mm256_and_pd(normal, in_range));
    _mm_storeu_ps(out, _mm256_cvtpd_ps(e));
    int bad = ~_mm256_movemask_pd(ok) & 15;
    while (bad) {
        const int l = __builtin_ctz((unsigned)bad);
        bad &= bad - 1;
        out[l] = t[l] < KL_EXPF_ZERO ? 0.0f : expf(t[l]);
    }
}

__attribute__((target("avx2,fma"))) static double kl_sum_expf_avx2(const float *x, int n, float m) {
    double sum = 0.0;
    float t[4], y[4];
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        for (int l = 0; l < 4; ++l) t[l] = x[i + l] - m; /* the float subtraction of the C loop */
        kl_expf4(t, y);
        sum += y[0];
        sum += y[1];
        sum += y[2];
        sum += y[3];
    }
    for (; i < n; ++i) sum += expf(x[i] - m);
    return sum;
}
#endif

static int kl_use_vector = -1; /* -1 unknown, 0 scalar, 1 AVX2+FMA */

/* sum over i < n, in index order, of expf(x[i] - m) (float argument, float result, added
   in double): the loop of perplexity.cpp's log_softmax, bit for bit */
static double kl_sum_expf(const float *x, int n, float m) {
#ifdef KL_X86
    int v = __atomic_load_n(&kl_use_vector, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        __atomic_store_n(&kl_use_vector, v, __ATOMIC_RELAXED);
    }
    if (v) return kl_sum_expf_avx2(x, n, m);
#endif
    double sum_exp = 0.0;
    for (int i = 0; i < n; ++i) {
        sum_exp += expf(x[i] - m);
    }
    return sum_exp;
}

/* perplexity.cpp's nearest_int: round to nearest (ties to even) for |fval| <= 4194303 */
static inline int kl_nearest_int(float fval) {
    float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

/* log_softmax(n_vocab, logits, log_prob, tok) of perplexity.cpp: one base-file row into
   out (header, n_vocab values, then the row's padding, zeroed), -log p(tok) returned;
   NaN (and out left as it was) when the row holds NaN or its maximum is not finite. */
static double kl_base_row(int n_vocab, const float *logits, uint16_t *out, int pad, int tok) {
    float max_logit = logits[0];
    float min_logit = logits[0];
    for (int i = 1; i < n_vocab; ++i) {
        max_logit = max_logit < logits[i] ? logits[i] : max_logit; /* std::max */
        min_logit = logits[i] < min_logit ? logits[i] : min_logit; /* std::min */
    }
    const float floor_logit = max_logit - 16;
    min_logit = min_logit < floor_logit ? floor_logit : min_logit;
    const double sum_exp = kl_sum_expf(logits, n_vocab, max_logit);
    if (!isfinite(max_logit) || isnan(sum_exp)) return NAN;
    const float log_sum_exp = (float)log(sum_exp);
    const float min_log_prob = min_logit - max_logit - log_sum_exp;
    const float scale = (max_logit - min_logit) / 65535.f;
    memcpy(out, &scale, sizeof(float));
    memcpy(out + 2, &min_log_prob, sizeof(float));
    uint16_t *log_prob = out + 4;
    if (scale) {
        const float inv_scale = 1 / scale;
        for (int i = 0; i < n_vocab; ++i) {
            log_prob[i] = logits[i] > min_logit ? (uint16_t)kl_nearest_int(inv_scale * (logits[i] - min_logit)) : 0;
        }
    } else {
        memset(log_prob, 0, (size_t)n_vocab * sizeof(uint16_t));
    }
    memset(log_prob + n_vocab, 0, (size_t)pad * sizeof(uint16_t));
    const float r = max_logit + log_sum_exp - logits[tok];
    return r;
}

/* log_softmax(n_vocab, logits, base_log_prob, tok, kld) of perplexity.cpp: one row's
   values (the sums are the caller's); 0, or 1 when the row holds NaN or its maximum is not
   finite (nothing written) */
static int kl_row(int n_vocab, const float *logits, const uint16_t *base, int tok, float *nll_out, float *nll_base_out,
                  double *kld_out, int32_t *same_top_out, float *p_diff_out) {
    float max_logit = logits[0];
    int imax = 0;
    for (int i = 1; i < n_vocab; ++i) {
        if (logits[i] > max_logit) {
            max_logit = logits[i];
            imax = i;
        }
    }
    const double sum_exp = kl_sum_expf(logits, n_vocab, max_logit);
    if (!isfinite(max_logit) || isnan(sum_exp)) return 1;
    const float log_sum_exp = (float)log(sum_exp);
    float scale, min_log_prob;
    memcpy(&scale, base, sizeof(float));
    memcpy(&min_log_prob, base + 2, sizeof(float));
    const uint16_t *base_log_prob = base + 4;

    const float nll = max_logit + log_sum_exp - logits[tok];
    const float nll_base = -(scale * base_log_prob[tok] + min_log_prob);

    max_logit += log_sum_exp;
    double sum = 0;
    int imax_base = -1;
    float p_log_base_max = 0;
    for (int i = 0; i < n_vocab; ++i) {
        const float p_log_base = scale * base_log_prob[i] + min_log_prob;
        if (i == 0 || p_log_base > p_log_base_max) {
            p_log_base_max = p_log_base;
            imax_base = i;
        }
        if (p_log_base > -16.f) {
            const float p_base = expf(p_log_base);
            sum += p_base * (p_log_base - logits[i] + max_logit);
        }
    }
    const float p_base = expf(-nll_base);
    const float p = expf(-nll);
    *nll_out = nll;
    *nll_base_out = nll_base;
    *kld_out = sum;
    *same_top_out = imax == imax_base;
    *p_diff_out = p - p_base;
    return 0;
}

int llama_cffi_expf(int n, const float *x, float *out, int vector) {
    if (n < 0 || (n > 0 && (x == NULL || out == NULL))) return -1;
    int i = 0;
#ifdef KL_X86
    if (vector) {
        (void)kl_sum_expf(x, 0, 0.0f); /* decides kl_use_vector */
        if (__atomic_load_n(&kl_use_vector, __ATOMIC_RELAXED) == 1) {
            for (; i + 4 <= n; i += 4) kl_expf4(x + i, out + i);
        }
    }
#else
    (void)vector;
#endif
    for (; i < n; ++i) out[i] = expf(x[i]);
    return 0;
}

/* ------------------------------------------------------------------ the jobs */

typedef struct {
    int n_rows;
    int n_vocab;
    const float *logits;  /* row r at logits + r * logits_stride */
    int64_t logits_stride;
    const int32_t *tokens; /* the token each row is scored against */
    uint16_t *out;         /* base rows (write) */
    const uint16_t *base;  /* base rows (read) */
    int64_t row_stride;    /* uint16 per base row */
    double *out_nll;
    float *nll;
    float *nll_base;
    double *kld;
    int32_t *same_top;
    float *p_diff;
    int32_t *status;
    int next; /* next row to take (atomic) */
} kl_job;

static void kl_base_task(void *arg, int worker) {
    kl_job *j = (kl_job *)arg;
    (void)worker;
    const int pad = (int)(j->row_stride - 4 - j->n_vocab);
    for (;;) {
        const int r = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (r >= j->n_rows) return;
        j->out_nll[r] = kl_base_row(j->n_vocab, j->logits + (size_t)r * (size_t)j->logits_stride,
                                    j->out + (size_t)r * (size_t)j->row_stride, pad, j->tokens[r]);
    }
}

static void kl_task(void *arg, int worker) {
    kl_job *j = (kl_job *)arg;
    (void)worker;
    for (;;) {
        const int r = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (r >= j->n_rows) return;
        j->status[r] = kl_row(j->n_vocab, j->logits + (size_t)r * (size_t)j->logits_stride,
                              j->base + (size_t)r * (size_t)j->row_stride, j->tokens[r], j->nll + r, j->nll_base + r,
                              j->kld + r, j->same_top + r, j->p_diff + r);
    }
}

static int kl_check(int n_rows, int n_vocab, const float *logits, int64_t logits_stride, const int32_t *tokens,
                    int64_t row_stride) {
    if (n_rows < 0 || n_vocab <= 0 || logits == NULL || tokens == NULL || logits_stride < n_vocab ||
        row_stride < (int64_t)n_vocab + 4)
        return -1;
    for (int r = 0; r < n_rows; ++r) {
        if (tokens[r] < 0 || tokens[r] >= n_vocab) return -1;
    }
    return 0;
}

static int kl_helpers(int n_threads, int n_rows) {
    int helpers = n_threads - 1;
    if (helpers > n_rows - 1) helpers = n_rows - 1;
    if (helpers > KL_MAX_THREADS - 1) helpers = KL_MAX_THREADS - 1;
    return helpers;
}

int llama_cffi_kl_base_rows(int n_rows, int n_vocab, const float *logits, int64_t logits_stride,
                            const int32_t *tokens, uint16_t *out, int64_t row_stride, int n_threads, double *out_nll) {
    if (kl_check(n_rows, n_vocab, logits, logits_stride, tokens, row_stride) != 0 || out == NULL || out_nll == NULL)
        return -1;
    if (n_rows == 0) return 0;
    kl_job j;
    memset(&j, 0, sizeof(j));
    j.n_rows = n_rows;
    j.n_vocab = n_vocab;
    j.logits = logits;
    j.logits_stride = logits_stride;
    j.tokens = tokens;
    j.out = out;
    j.row_stride = row_stride;
    j.out_nll = out_nll;
    llama_cffi_pool_run(kl_helpers(n_threads, n_rows), kl_base_task, &j);
    return 0;
}

int llama_cffi_kl_rows(int n_rows, int n_vocab, const float *logits, int64_t logits_stride, const int32_t *tokens,
                       const uint16_t *base, int64_t row_stride, int n_threads, float *nll, float *nll_base,
                       double *kld, int32_t *same_top, float *p_diff, int32_t *status) {
    if (kl_check(n_rows, n_vocab, logits, logits_stride, tokens, row_stride) != 0 || base == NULL || nll == NULL ||
        nll_base == NULL || kld == NULL || same_top == NULL || p_diff == NULL || status == NULL)
        return -1;
    if (n_rows == 0) return 0;
    kl_job j;
    memset(&j, 0, sizeof(j));
    j.n_rows = n_rows;
    j.n_vocab = n_vocab;
    j.logits = logits;
    j.logits_stride = logits_stride;
    j.tokens = tokens;
    j.base = base;
    j.row_stride = row_stride;
    j.nll = nll;
    j.nll_base = nll_base;
    j.kld = kld;
    j.same_top = same_top;
    j.p_diff = p_diff;
    j.status = status;
    llama_cffi_pool_run(kl_helpers(n_threads, n_rows), kl_task, &j);
    return 0;
}
