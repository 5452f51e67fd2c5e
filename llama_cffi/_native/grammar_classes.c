/* The character classes of a grammar (see samplers.grammar.engine.Engine._build_classes,
 * the Python reference this equals): the intervals of code points that no char element
 * tells apart, numbered in the order of their first interval.
 *
 * A char element starts at each CHAR, CHAR_NOT or ANY and runs over the CHAR_RNG_UPPER and
 * CHAR_ALT after it. One CHAR alone (a literal character) is a single row: one per distinct
 * value, in increasing order, after the multi rows; it matches one class, that of
 * [v, v + 1). The others (sets, ranges, negations) are multi rows, one per distinct
 * (positive, items) in the order of first use; their membership is computed over the
 * "coarse" intervals between their own item bounds, so the work is multi rows x coarse
 * intervals plus the singles, never rows x intervals. Every index is checked. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llama_cffi.h"

enum { C_END = 0, C_CHAR = 3, C_CHAR_NOT = 4, C_RNG = 5, C_CHAR_ALT = 6, C_ANY = 7, C_MAX_TYPE = 9 };
#define MAX_CP ((int64_t)1 << 22)

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* sorts and deduplicates a[0 .. n); returns the new length */
static int64_t sort_unique(int64_t *a, int64_t n) {
    if (n == 0) return 0;
    qsort(a, (size_t)n, sizeof(int64_t), cmp_i64);
    int64_t k = 1;
    for (int64_t i = 1; i < n; i++)
        if (a[i] != a[k - 1]) a[k++] = a[i];
    return k;
}

/* the first index i with a[i] >= x (a increasing) */
static int64_t lower_bound(const int64_t *a, int64_t n, int64_t x) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (a[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void llama_cffi_gclasses_free(llama_cffi_gclasses *c) {
    if (!c) return;
    free(c->char_row);
    free(c->after);
    free(c->edges);
    free(c->interval_class);
    free(c->single_class);
    free(c->member);
    free(c);
}

llama_cffi_gclasses *llama_cffi_gclasses_build(int32_t n, const int32_t *types, const int64_t *values,
                                               int64_t max_cells, int32_t *rc) {
    int32_t dummy;
    if (!rc) rc = &dummy;
    *rc = -4;
    if (n < 1 || !types || !values || max_cells < 0) return NULL;
    for (int32_t p = 0; p < n; p++)
        if (types[p] < 0 || types[p] > C_MAX_TYPE) return NULL;
    *rc = -2;
    llama_cffi_gclasses *c = (llama_cffi_gclasses *)calloc(1, sizeof *c);
    /* scratch, freed at the end */
    int64_t *items = NULL, *sv = NULL, *cedges = NULL, *all = NULL, *rank_of = NULL;
    int32_t *row_off = NULL, *row_len = NULL, *tab = NULL, *ckey = NULL, *class_of_ckey = NULL, *first_coarse = NULL,
            *delta = NULL;
    uint8_t *row_pos = NULL, *cmember = NULL;
    uint64_t *col_hash = NULL;
    int32_t *ktab = NULL, *stab = NULL;
    if (!c) return NULL;
    c->char_row = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    c->after = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    items = (int64_t *)malloc(sizeof(int64_t) * 2 * (size_t)n); /* every row's (lo, hi), at most one per element */
    sv = (int64_t *)malloc(sizeof(int64_t) * (size_t)n);
    row_off = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    row_len = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    row_pos = (uint8_t *)malloc((size_t)n);
    rank_of = (int64_t *)malloc(sizeof(int64_t) * (size_t)n); /* per start: its single value, or its multi row */
    int64_t tcap = 16;
    while (tcap < 2 * (int64_t)n) tcap *= 2;
    tab = (int32_t *)calloc((size_t)tcap, sizeof(int32_t));
    stab = (int32_t *)calloc((size_t)tcap, sizeof(int32_t)); /* the singles' values seen (index + 1 in sv) */
    if (!c->char_row || !c->after || !items || !sv || !row_off || !row_len || !row_pos || !rank_of || !tab || !stab)
        goto fail;
    for (int32_t p = 0; p < n; p++) c->char_row[p] = c->after[p] = -1;
    /* the elements: singles' values, multi rows deduplicated by (positive, items) */
    int32_t n_m = 0, n_items = 0;
    int64_t n_sv = 0;
    for (int32_t p = 0; p < n; p++) {
        const int32_t t = types[p];
        if (t != C_CHAR && t != C_CHAR_NOT && t != C_ANY) continue;
        int32_t q = p + 1;
        while (q < n && (types[q] == C_RNG || types[q] == C_CHAR_ALT)) q++;
        if (q >= n) goto bad; /* a char element runs to the end: no END after it */
        c->after[p] = q;
        if (t == C_CHAR && q == p + 1) {
            /* a single: its row once the distinct values are sorted (kept once each: a
               schema's grammar has thousands of literal characters, a few dozen distinct) */
            const int64_t v = values[p];
            for (uint64_t j = mix((uint64_t)v) & (uint64_t)(tcap - 1);; j = (j + 1) & (uint64_t)(tcap - 1)) {
                const int32_t s1 = stab[j];
                if (!s1) {
                    stab[j] = (int32_t)(n_sv + 1);
                    sv[n_sv++] = v;
                    break;
                }
                if (sv[s1 - 1] == v) break;
            }
            rank_of[p] = -1;
            continue;
        }
        /* llama_grammar_match_char's walk (Engine._class_items) */
        const int32_t start = n_items;
        const uint8_t positive = (t == C_CHAR || t == C_ANY);
        int32_t pos = p;
        for (;;) {
            if (pos + 1 >= n) goto bad;
            if (types[pos + 1] == C_RNG) {
                items[2 * n_items] = values[pos];
                items[2 * n_items + 1] = values[pos + 1];
                pos += 2;
            } else if (types[pos] == C_ANY) {
                items[2 * n_items] = 0;
                items[2 * n_items + 1] = MAX_CP - 1;
                pos += 1;
            } else {
                items[2 * n_items] = items[2 * n_items + 1] = values[pos];
                pos += 1;
            }
            n_items++;
            if (pos >= n) goto bad;
            if (types[pos] != C_CHAR_ALT) break;
        }
        const int32_t len = n_items - start;
        uint64_t h = mix((uint64_t)positive + 0x9e3779b97f4a7c15ULL * (uint64_t)len);
        for (int32_t i = 0; i < 2 * len; i++) h = mix(h ^ (uint64_t)items[2 * start + i]);
        int32_t row = -1;
        for (uint64_t j = h & (uint64_t)(tcap - 1);; j = (j + 1) & (uint64_t)(tcap - 1)) {
            const int32_t r1 = tab[j];
            if (!r1) {
                row = n_m++;
                tab[j] = row + 1;
                row_off[row] = start;
                row_len[row] = len;
                row_pos[row] = positive;
                break;
            }
            const int32_t r = r1 - 1;
            if (row_len[r] == len && row_pos[r] == positive &&
                !memcmp(items + 2 * row_off[r], items + 2 * start, sizeof(int64_t) * 2 * (size_t)len)) {
                row = r;
                n_items = start; /* the row's items are kept once */
                break;
            }
        }
        rank_of[p] = row;
    }
    /* the single rows: the distinct values in increasing order, after the multi rows */
    n_sv = sort_unique(sv, n_sv);
    for (int32_t p = 0; p < n; p++) {
        if (c->after[p] < 0) continue;
        if (types[p] == C_CHAR && c->after[p] == p + 1)
            c->char_row[p] = n_m + (int32_t)lower_bound(sv, n_sv, values[p]);
        else
            c->char_row[p] = (int32_t)rank_of[p];
    }
    /* the coarse intervals: every multi item's lo and hi + 1 (capped at MAX_CP), 0, MAX_CP */
    cedges = (int64_t *)malloc(sizeof(int64_t) * (2 * (size_t)n_items + 2));
    if (!cedges) goto fail;
    int64_t n_ce = 0;
    cedges[n_ce++] = 0;
    cedges[n_ce++] = MAX_CP;
    for (int32_t r = 0; r < n_m; r++)
        for (int32_t i = row_off[r]; i < row_off[r] + row_len[r]; i++) {
            const int64_t lo = items[2 * i], hi = items[2 * i + 1];
            if (lo > hi) continue;
            const int64_t lo_c = lo < MAX_CP ? lo : MAX_CP, hi_c = hi < MAX_CP ? hi : MAX_CP;
            cedges[n_ce++] = lo_c;
            cedges[n_ce++] = hi_c + 1 < MAX_CP ? hi_c + 1 : MAX_CP;
        }
    n_ce = sort_unique(cedges, n_ce);
    const int64_t n_c = n_ce - 1;
    if ((int64_t)n_m * n_c > max_cells) {
        *rc = -7;
        goto out_err;
    }
    /* the multi rows' membership per coarse interval: +1 at an item's first interval, -1
       past its last, a running sum per row */
    cmember = (uint8_t *)malloc((size_t)n_m * (size_t)n_c + 1);
    delta = (int32_t *)malloc(sizeof(int32_t) * ((size_t)n_c + 1));
    col_hash = (uint64_t *)malloc(sizeof(uint64_t) * (size_t)n_c);
    if (!cmember || !delta || !col_hash) goto fail;
    for (int64_t i = 0; i < n_c; i++) col_hash[i] = 0x243f6a8885a308d3ULL;
    for (int32_t r = 0; r < n_m; r++) {
        memset(delta, 0, sizeof(int32_t) * ((size_t)n_c + 1));
        for (int32_t i = row_off[r]; i < row_off[r] + row_len[r]; i++) {
            const int64_t lo = items[2 * i], hi = items[2 * i + 1];
            if (lo > hi) continue;
            const int64_t lo_c = lo < MAX_CP ? lo : MAX_CP, hi_c = hi < MAX_CP ? hi : MAX_CP;
            const int64_t hi1 = hi_c + 1 < MAX_CP ? hi_c + 1 : MAX_CP;
            const int64_t a = lower_bound(cedges, n_ce, lo_c + 1) - 1; /* the last edge <= lo_c */
            const int64_t b = lower_bound(cedges, n_ce, hi1);
            if (a < 0 || a > n_c || b < 0 || b > n_c) goto bad;
            delta[a]++;
            delta[b]--;
        }
        int32_t run = 0;
        uint8_t *line = cmember + (size_t)r * (size_t)n_c;
        for (int64_t i = 0; i < n_c; i++) {
            run += delta[i];
            line[i] = (uint8_t)((run > 0) == (row_pos[r] != 0));
            col_hash[i] = mix(col_hash[i] ^ (uint64_t)(line[i] + 2 * (uint64_t)r));
        }
    }
    /* a key per distinct column, in the order of first use */
    ckey = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_c);
    first_coarse = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_c); /* per key: its first coarse interval */
    int64_t kcap = 16;
    while (kcap < 2 * n_c) kcap *= 2;
    ktab = (int32_t *)calloc((size_t)kcap, sizeof(int32_t));
    if (!ckey || !first_coarse || !ktab) goto fail;
    int32_t n_keys = 0;
    for (int64_t i = 0; i < n_c; i++) {
        for (uint64_t j = col_hash[i] & (uint64_t)(kcap - 1);; j = (j + 1) & (uint64_t)(kcap - 1)) {
            const int32_t k1 = ktab[j];
            if (!k1) {
                ktab[j] = n_keys + 1;
                first_coarse[n_keys] = (int32_t)i;
                ckey[i] = n_keys++;
                break;
            }
            const int64_t o = first_coarse[k1 - 1];
            if (col_hash[o] != col_hash[i]) continue;
            int same = 1;
            for (int32_t r = 0; r < n_m && same; r++)
                same = cmember[(size_t)r * (size_t)n_c + (size_t)o] == cmember[(size_t)r * (size_t)n_c + (size_t)i];
            if (same) {
                ckey[i] = k1 - 1;
                break;
            }
        }
    }
    /* the final intervals: the coarse bounds and each live single value's [v, v + 1) */
    int64_t n_live = lower_bound(sv, n_sv, MAX_CP);
    all = (int64_t *)malloc(sizeof(int64_t) * ((size_t)n_ce + 2 * (size_t)n_live));
    if (!all) goto fail;
    int64_t n_all = 0;
    for (int64_t i = 0; i < n_ce; i++) all[n_all++] = cedges[i];
    for (int64_t i = 0; i < n_live; i++) {
        all[n_all++] = sv[i];
        all[n_all++] = sv[i] + 1;
    }
    n_all = sort_unique(all, n_all);
    const int64_t n_int = n_all - 1;
    if (n_int < 1 || n_int > INT32_MAX / 2) goto bad;
    c->edges = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_all);
    c->interval_class = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_int);
    c->single_class = (int32_t *)malloc(sizeof(int32_t) * ((size_t)n_sv + 1));
    class_of_ckey = (int32_t *)malloc(sizeof(int32_t) * ((size_t)n_keys + 1));
    int32_t *coarse_of_class = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_int);
    if (!c->edges || !c->interval_class || !c->single_class || !class_of_ckey || !coarse_of_class) {
        free(coarse_of_class);
        goto fail;
    }
    for (int64_t i = 0; i < n_all; i++) c->edges[i] = (int32_t)all[i];
    for (int32_t k = 0; k < n_keys; k++) class_of_ckey[k] = -1;
    for (int64_t i = 0; i < n_sv; i++) c->single_class[i] = -1;
    int32_t n_classes = 0;
    int64_t co = 0, si = 0; /* the coarse interval and the live single at or after the interval's start */
    for (int64_t i = 0; i < n_int; i++) {
        const int64_t cp = all[i];
        while (co + 1 < n_c && cedges[co + 1] <= cp) co++;
        while (si < n_live && sv[si] < cp) si++;
        if (si < n_live && sv[si] == cp) { /* a literal character's own class */
            c->single_class[si] = n_classes;
            coarse_of_class[n_classes] = (int32_t)co;
            c->interval_class[i] = n_classes++;
            continue;
        }
        const int32_t k = ckey[co];
        if (class_of_ckey[k] < 0) {
            class_of_ckey[k] = n_classes;
            coarse_of_class[n_classes++] = (int32_t)co;
        }
        c->interval_class[i] = class_of_ckey[k];
    }
    if ((int64_t)n_m * n_classes > max_cells) {
        free(coarse_of_class);
        *rc = -7;
        goto out_err;
    }
    c->member = (uint8_t *)malloc((size_t)n_m * (size_t)n_classes + 1);
    if (!c->member) {
        free(coarse_of_class);
        goto fail;
    }
    for (int32_t r = 0; r < n_m; r++)
        for (int32_t k = 0; k < n_classes; k++)
            c->member[(size_t)r * (size_t)n_classes + (size_t)k] =
                cmember[(size_t)r * (size_t)n_c + (size_t)coarse_of_class[k]];
    free(coarse_of_class);
    c->n_rows = n_m + (int32_t)n_sv;
    c->n_mrows = n_m;
    c->n_classes = n_classes;
    c->n_int = (int32_t)n_int;
    *rc = 0;
    goto done;
bad:
    *rc = -4;
    goto out_err;
fail:
    *rc = -2;
out_err:
    llama_cffi_gclasses_free(c);
    c = NULL;
done:
    free(items);
    free(sv);
    free(cedges);
    free(all);
    free(rank_of);
    free(row_off);
    free(row_len);
    free(tab);
    free(stab);
    free(ckey);
    free(class_of_ckey);
    free(first_coarse);
    free(delta);
    free(row_pos);
    free(cmember);
    free(col_hash);
    free(ktab);
    return c;
}

int llama_cffi_cp_key(const int32_t *cls_of_cp, int32_t n_cps, int32_t n_classes, const uint64_t *run, uint8_t *out) {
    if (!cls_of_cp || !run || !out || n_cps < 0 || n_classes < 0) return -1;
    const int32_t n_bytes = (int32_t)(((int64_t)n_cps + 7) / 8);
    /* each class's bit as a byte (one load per code point, no shifts of the run) */
    uint8_t *in = (uint8_t *)malloc((size_t)n_classes + 1);
    if (!in) return -1;
    for (int32_t c = 0; c < n_classes; c++) in[c] = (uint8_t)((run[c >> 6] >> (c & 63)) & 1u);
    const uint32_t nc = (uint32_t)n_classes;
    const int32_t full = n_cps / 8;
    uint32_t bad = 0;
    for (int32_t b = 0; b < full; b++) {
        const int32_t *p = cls_of_cp + (int64_t)b * 8;
        const uint32_t c0 = (uint32_t)p[0], c1 = (uint32_t)p[1], c2 = (uint32_t)p[2], c3 = (uint32_t)p[3];
        const uint32_t c4 = (uint32_t)p[4], c5 = (uint32_t)p[5], c6 = (uint32_t)p[6], c7 = (uint32_t)p[7];
        bad |= (c0 >= nc) | (c1 >= nc) | (c2 >= nc) | (c3 >= nc) | (c4 >= nc) | (c5 >= nc) | (c6 >= nc) | (c7 >= nc);
        if (bad) break;
        out[b] = (uint8_t)(in[c0] | in[c1] << 1 | in[c2] << 2 | in[c3] << 3 | in[c4] << 4 | in[c5] << 5 |
                           in[c6] << 6 | in[c7] << 7);
    }
    if (!bad)
        for (int32_t b = full; b < n_bytes; b++) { /* the last, partial byte */
            uint8_t byte = 0;
            for (int32_t i = b * 8; i < n_cps; i++) {
                const uint32_t c = (uint32_t)cls_of_cp[i];
                if (c >= nc) {
                    bad = 1;
                    break;
                }
                byte |= (uint8_t)(in[c] << (i & 7));
            }
            out[b] = byte;
        }
    free(in);
    if (bad) return -1;
    out[n_bytes] = (uint8_t)((run[n_classes >> 6] >> (n_classes & 63)) & 1u);
    return 0;
}
