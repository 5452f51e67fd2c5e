/* Softmax over one float32 row (llama_cffi.kernels, samplers.measure). */
#include "internal.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static llama_cffi_softmax_fn llama_cffi_softmax_vec = NULL;

void llama_cffi_set_softmax(llama_cffi_softmax_fn f) {
    llama_cffi_softmax_vec = f;
}

/* sum(exp(x - max)) over n floats, exp(x - max) written to y (y may alias x); the sum
   is accumulated in double. Once llama_cffi_bind_cpu has found it in the CPU backend
   library loaded at import, this is ggml's own vectorised soft_max kernel (the one its
   SOFT_MAX op uses, built for that library's instruction sets); before that, or without
   it, a scalar loop. */
double llama_cffi_softmax_sum(int n, float *y, const float *x, float max) {
    if (llama_cffi_softmax_vec != NULL) return llama_cffi_softmax_vec(n, y, x, max);
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
        float v = expf(x[i] - max);
        y[i] = v;
        sum += (double)v;
    }
    return sum;
}

/* sum(y_i * (x_i - max)) over the i with y_i != 0 (y from llama_cffi_softmax_sum; a
   -inf logit has y_i = 0 and adds nothing instead of 0 * -inf = NaN). */
double llama_cffi_softmax_dot(int n, const float *y, const float *x, float max) {
    double acc = 0.0;
    for (int i = 0; i < n; ++i) {
        if (y[i] != 0.0f) acc += (double)y[i] * (double)(x[i] - max);
    }
    return acc;
}

const char *llama_cffi_softmax_impl(void) {
    return llama_cffi_softmax_vec != NULL ? "ggml_vec_soft_max_f32" : "scalar";
}

/* ---- top-k over a row summarised by interleaved group maxima (samplers.candidates) ---- */

/* descending value, then ascending position (a stable sort by -value) */
static int llama_cffi_vp_before(const llama_cffi_vp *a, const llama_cffi_vp *b) {
    return a->v > b->v || (a->v == b->v && a->pos < b->pos);
}

int llama_cffi_vp_cmp(const void *x, const void *y) {
    const llama_cffi_vp *a = (const llama_cffi_vp *)x, *b = (const llama_cffi_vp *)y;
    return llama_cffi_vp_before(a, b) ? -1 : (llama_cffi_vp_before(b, a) ? 1 : 0);
}

/* the value of rank r (0-based, ascending) among a[0..n), reordering a (Hoare's select) */
float llama_cffi_select(float *a, int n, int r) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        float pivot = a[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot) ++i;
            while (a[j] > pivot) --j;
            if (i <= j) {
                float t = a[i];
                a[i] = a[j];
                a[j] = t;
                ++i;
                --j;
            }
        }
        if (r <= j) hi = j;
        else if (r >= i) lo = i;
        else return a[r];
    }
    return a[r];
}

/* sort by descending value, then ascending position: an insertion sort for the usual few
   (about k) candidates, qsort beyond */
void llama_cffi_vp_sort(llama_cffi_vp *cand, size_t m) {
    if (m > 96) {
        qsort(cand, m, sizeof(llama_cffi_vp), llama_cffi_vp_cmp);
        return;
    }
    for (size_t i = 1; i < m; ++i) {
        const llama_cffi_vp x = cand[i];
        size_t j = i;
        while (j > 0 && llama_cffi_vp_before(&x, &cand[j - 1])) {
            cand[j] = cand[j - 1];
            --j;
        }
        cand[j] = x;
    }
}

/* append (v, pos) to *cand (m used of *cap), doubling it when full; 0, or -1 when out of memory */
int llama_cffi_vp_push(llama_cffi_vp **cand, size_t *m, size_t *cap, float v, int64_t pos) {
    if (*m == *cap) {
        llama_cffi_vp *grown = (llama_cffi_vp *)realloc(*cand, sizeof(llama_cffi_vp) * *cap * 2);
        if (grown == NULL) return -1;
        *cand = grown;
        *cap *= 2;
    }
    (*cand)[*m].v = v;
    (*cand)[*m].pos = pos;
    ++*m;
    return 0;
}

/* The positions of the k largest values of row[0..n), largest first, ties by lower
   position, written to out[0..k). gmax[c] (c < cols) is the max of the 64 values
   row[g * cols + c], g < 64 (Candidates.reset's interleaved groups); row[64 * cols .. n)
   is the tail. The k-th largest group max is a threshold at least k values reach, so
   only the groups whose max reaches it (and the tail) are read. The row must hold no
   NaN (reset refuses them). Returns k, or -1 when the arguments are out of range or
   memory runs out. */
int llama_cffi_top_k_grouped(int n, const float *row, int cols, const float *gmax, int k, int64_t *out) {
    if (n < 0 || cols <= 0 || (int64_t)cols * 64 > n || k <= 0 || k > cols) return -1;
    float *sel = (float *)malloc(sizeof(float) * (size_t)cols);
    if (sel == NULL) return -1;
    memcpy(sel, gmax, sizeof(float) * (size_t)cols);
    const float th = llama_cffi_select(sel, cols, cols - k);
    free(sel);
    size_t cap = (size_t)k * 4 + 64, m = 0;
    llama_cffi_vp *cand = (llama_cffi_vp *)malloc(sizeof(llama_cffi_vp) * cap);
    if (cand == NULL) return -1;
    int ok = 0;
    for (int c = 0; c < cols && ok == 0; ++c) {
        if (!(gmax[c] >= th)) continue;
        for (int g = 0; g < 64 && ok == 0; ++g) {
            const int64_t p = (int64_t)g * cols + c;
            if (row[p] >= th) ok = llama_cffi_vp_push(&cand, &m, &cap, row[p], p);
        }
    }
    for (int64_t p = (int64_t)cols * 64; p < n && ok == 0; ++p) {
        if (row[p] >= th) ok = llama_cffi_vp_push(&cand, &m, &cap, row[p], p);
    }
    if (ok != 0) {
        free(cand);
        return -1;
    }
    llama_cffi_vp_sort(cand, m);
    const int got = (size_t)k < m ? k : (int)m; /* m >= k: k values reach th */
    for (int i = 0; i < got; ++i) out[i] = cand[i].pos;
    free(cand);
    return got;
}

/* ---- top-k among the positions a packed mask allows (a grammar's; samplers.chain_batch) ---- */

/* the worst of a min-heap ordered by llama_cffi_vp_before (the root is the one every other
   comes before) */
static void masked_sift_down(llama_cffi_vp *h, int32_t m, int32_t i) {
    for (;;) {
        int32_t w = i;
        const int32_t l = 2 * i + 1, r = l + 1;
        if (l < m && llama_cffi_vp_before(&h[w], &h[l])) w = l;
        if (r < m && llama_cffi_vp_before(&h[w], &h[r])) w = r;
        if (w == i) return;
        const llama_cffi_vp t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static void masked_sift_up(llama_cffi_vp *h, int32_t i) {
    while (i > 0) {
        const int32_t p = (i - 1) / 2;
        if (!llama_cffi_vp_before(&h[p], &h[i])) return;
        const llama_cffi_vp t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

/* one word of the mask (word w, its bits) into the heap h (m of k taken): 0, or -2 for a
   NaN at an allowed position */
static int masked_take_word(llama_cffi_vp *h, int32_t *m_io, int32_t k, const float *row, int32_t n,
                            int32_t n_words, int32_t w, uint32_t bits) {
    int32_t m = *m_io;
    if (w == n_words - 1 && (n & 31)) bits &= (UINT32_C(1) << (n & 31)) - 1; /* (padding bits) */
    if (m == k && __builtin_popcount(bits) > 8) {
        /* a wide word with the heap full: the max of its 32 values first (one vector
           pass), and the word skipped when none beats the heap's worst (every value
           in the heap is from a lower position: an equal value comes after it). A
           NaN goes to the loop below, which refuses it. */
        const int32_t base = w * 32, end = base + 32 <= n ? base + 32 : n;
        float mx = -INFINITY;
        int nan = 0;
        for (int32_t p = base; p < end; p++) {
            const float v = row[p];
            nan |= v != v;
            mx = v > mx ? v : mx;
        }
        if (!nan && !(mx > h[0].v)) return 0;
    }
    while (bits) {
        const int32_t p = w * 32 + __builtin_ctz(bits);
        bits &= bits - 1;
        const float v = row[p];
        if (v != v) return -2; /* NaN */
        if (v == -INFINITY) continue;
        const llama_cffi_vp x = {v, p};
        if (m < k) {
            h[m] = x;
            masked_sift_up(h, m++);
        } else if (llama_cffi_vp_before(&x, &h[0])) {
            h[0] = x;
            masked_sift_down(h, m, 0);
        }
    }
    *m_io = m;
    return 0;
}

/* the nonzero words of a mask of n_words words, in increasing order, into nz; their count */
static int32_t masked_nonzero_words(const uint32_t *words, int32_t n_words, int32_t *nz) {
    int32_t c = 0;
    for (int32_t w = 0; w < n_words; w++) {
        if ((w & 7) == 0 && w + 8 <= n_words) {
            /* eight words at once: most of a narrow mask (a grammar's structural position
               allows a few tokens of 262,144) is zero, and the word-by-word test cost ~3 us
               per row */
            uint64_t q[4];
            memcpy(q, words + w, sizeof q);
            if (!(q[0] | q[1] | q[2] | q[3])) {
                w += 7;
                continue;
            }
        }
        if (words[w]) nz[c++] = w;
    }
    return c;
}

/* llama_cffi_masked_top_k over the words listed in nz (n_nz of them: the mask's nonzero
   words, increasing), or over every word when nz is NULL */
static int32_t masked_top_k_in(int32_t n, const float *row, const uint32_t *words, const int32_t *nz, int32_t n_nz,
                               int32_t k, int32_t *ids, float *logits) {
    llama_cffi_vp *h = (llama_cffi_vp *)malloc(sizeof(llama_cffi_vp) * (size_t)k);
    if (!h) return -1;
    int32_t m = 0;
    const int32_t n_words = (int32_t)(((int64_t)n + 31) / 32);
    if (nz) {
        for (int32_t i = 0; i < n_nz; i++)
            if (masked_take_word(h, &m, k, row, n, n_words, nz[i], words[nz[i]])) {
                free(h);
                return -2;
            }
    } else {
        for (int32_t w = 0; w < n_words; w++) {
            if ((w & 7) == 0 && w + 8 <= n_words) { /* (as masked_nonzero_words) */
                uint64_t q[4];
                memcpy(q, words + w, sizeof q);
                if (!(q[0] | q[1] | q[2] | q[3])) {
                    w += 7;
                    continue;
                }
            }
            const uint32_t bits = words[w];
            if (bits && masked_take_word(h, &m, k, row, n, n_words, w, bits)) {
                free(h);
                return -2;
            }
        }
    }
    llama_cffi_vp_sort(h, (size_t)m);
    for (int32_t i = 0; i < m; i++) {
        ids[i] = (int32_t)h[i].pos;
        logits[i] = h[i].v;
    }
    free(h);
    /* then the lowest positions the mask leaves at -inf (its bit clear, or -inf in the row) */
    int32_t got = m;
    for (int32_t p = 0; p < n && got < k; p++) {
        if (((words[p >> 5] >> (p & 31)) & 1u) && row[p] != -INFINITY) continue;
        ids[got] = p;
        logits[got++] = -INFINITY;
    }
    return m;
}

int32_t llama_cffi_masked_top_k(int32_t n, const float *row, const uint32_t *words, int32_t k, int32_t *ids,
                                float *logits) {
    if (n <= 0 || !row || !words || !ids || !logits || k <= 0 || k > n) return -1;
    return masked_top_k_in(n, row, words, NULL, 0, k, ids, logits);
}

/* nonzero words a row's pass visits per extra thread worth waking (a pool thread's wake
   costs about what a row of a few hundred such words does) */
#define MASKED_WORDS_PER_THREAD 2048

typedef struct {
    int32_t n_rows, n, k;
    const float *const *rows;
    const uint32_t *const *words;
    const int32_t *mask_of; /* per row: its mask's index */
    const int32_t *nz;      /* the masks' nonzero words, one mask after another */
    const int64_t *nz_off;  /* per mask: where its nonzero words start in nz */
    const int32_t *n_nz;    /* per mask: how many */
    int32_t *ids;
    float *logits;
    int32_t *n_finite;
    int32_t next; /* atomic */
} masked_rows_job;

static void masked_rows_task(void *arg, int worker) {
    masked_rows_job *j = (masked_rows_job *)arg;
    (void)worker;
    for (;;) {
        const int32_t r = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (r >= j->n_rows) return;
        const int32_t i = j->mask_of[r];
        j->n_finite[r] = masked_top_k_in(j->n, j->rows[r], j->words[r], j->nz + j->nz_off[i], j->n_nz[i], j->k,
                                         j->ids + (size_t)r * (size_t)j->k, j->logits + (size_t)r * (size_t)j->k);
    }
}

int32_t llama_cffi_masked_top_k_rows(int32_t n_rows, int32_t n, const float *const *rows, const uint32_t *const *words,
                                     int32_t k, int32_t *ids, float *logits, int32_t *n_finite, int32_t n_threads) {
    if (n_rows < 0 || (n_rows && (!rows || !words || !ids || !logits || !n_finite))) return -1;
    if (n_rows == 0) return 0;
    if (n <= 0 || k <= 0 || k > n) return -1;
    for (int32_t r = 0; r < n_rows; r++)
        if (!rows[r] || !words[r]) return -1;
    /* each distinct mask (by address: rows in one grammar state share one) scanned once, on
       this thread, for its nonzero words, kept one mask after another (a narrow mask has a
       handful: most calls keep a few hundred bytes); each of its rows then visits those
       words alone */
    const int32_t n_words = (int32_t)(((int64_t)n + 31) / 32);
    const uint32_t **masks = (const uint32_t **)malloc(sizeof *masks * (size_t)n_rows);
    int32_t *mask_of = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_rows);
    int32_t *n_nz = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_rows);
    int64_t *nz_off = (int64_t *)malloc(sizeof(int64_t) * (size_t)n_rows);
    int64_t cap = 1024, used = 0;
    int32_t *nz = (int32_t *)malloc(sizeof(int32_t) * (size_t)cap);
    int32_t rc = -1;
    if (!masks || !mask_of || !n_nz || !nz_off || !nz) goto out;
    int32_t d = 0;
    for (int32_t r = 0; r < n_rows; r++) {
        int32_t i = 0;
        if (r && words[r] == words[r - 1])
            i = mask_of[r - 1]; /* (the common case: rows of one state side by side) */
        else {
            while (i < d && masks[i] != words[r]) i++;
            if (i == d) {
                masks[d++] = words[r];
                if (cap - used < n_words) { /* room for the whole mask's words */
                    while (cap - used < n_words) cap *= 2;
                    int32_t *grown = (int32_t *)realloc(nz, sizeof(int32_t) * (size_t)cap);
                    if (!grown) goto out;
                    nz = grown;
                }
                nz_off[i] = used;
                n_nz[i] = masked_nonzero_words(words[r], n_words, nz + used);
                used += n_nz[i];
            }
        }
        mask_of[r] = i;
    }
    if (n_threads < 1) n_threads = 1;
    masked_rows_job j = {n_rows, n, k, rows, words, mask_of, nz, nz_off, n_nz, ids, logits, n_finite, 0};
    int64_t work = 0;
    for (int32_t r = 0; r < n_rows; r++) work += n_nz[mask_of[r]];
    int64_t helpers = work / MASKED_WORDS_PER_THREAD;
    if (helpers > n_threads - 1) helpers = n_threads - 1;
    if (helpers > n_rows - 1) helpers = n_rows - 1;
    llama_cffi_pool_run((int)helpers, masked_rows_task, &j); /* the process's pool (pool.c) */
    rc = 0;
    for (int32_t r = 0; r < n_rows; r++)
        if (n_finite[r] < 0) {
            rc = n_finite[r];
            break;
        }
out:
    free(nz);
    free(nz_off);
    free(masks);
    free(mask_of);
    free(n_nz);
    return rc;
}
