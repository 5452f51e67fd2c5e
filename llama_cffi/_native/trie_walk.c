/* The innermost loops of grammar masks: walks of a vocabulary's code-point trie under a
 * grammar's transition table (see llama_cffi/_trie_walk.py for the Python side and
 * samplers/grammar/compiled.py for the algorithm, whose numpy version is the reference).
 *
 * The trie (one per vocabulary) numbers its nodes level by level; the root is node
 * n_nodes; a node's children are nodes first_child .. first_child + n_child; in the
 * sorted token order (row r is token order[r]) its subtree is rows row_start ..
 * row_end, of which the first n_term end at the node; per node it also keeps the ASCII
 * code points strictly below it (below_asc) and whether a code point >= 128 lies below
 * (special or not: llama_cffi_trie_special_cps) and a token ends inside a UTF-8
 * character at or below it (below_flags): shared by every grammar. A grammar gives each
 * code point of the vocabulary a character class (cls_of_cpi: a node's class is that of
 * its code point, node_cls); whether a subtree is made of a set of classes is read from
 * those summaries (conservatively where code points >= 128 are concerned: see covered),
 * so a grammar writes no per-node array.
 *
 * A state's run (L, k): the classes L that all lead it to one successor, and the length
 * k up to which every string over L stays alive that way (a state with self-loops:
 * every length). A node whose subtree is no deeper than k and uses only classes of L
 * is accepted whole when reached in that state.
 *
 * Everything Python cannot cheaply know in advance -- a transition not computed yet, a
 * state's run, which partial characters a state can complete -- is not guessed:
 * the walk leaves that node's subtree untouched and reports it as pending, with the
 * reason; Python computes what was missing and walks the pending nodes again. Nothing
 * is allocated inside the loops; every index read from an array is bounds-checked. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define SET_BIT(mask, t) ((mask)[(uint32_t)(t) >> 5] |= (uint32_t)1 << ((uint32_t)(t)&31u))

int llama_cffi_mask_set(uint32_t *mask, int32_t n_words, const int32_t *tokens, int32_t n) {
    if (!mask || n_words < 0 || n < 0 || (n && !tokens)) return -1;
    for (int32_t i = 0; i < n; i++) {
        const int32_t t = tokens[i];
        if (t < 0 || (t >> 5) >= n_words) return -1;
        SET_BIT(mask, t);
    }
    return 0;
}

int llama_cffi_trie_clear_below(const llama_cffi_trie *t, uint32_t *mask, const int32_t *nodes, int32_t n_nodes,
                                const int32_t *tokens, int32_t n_tokens) {
    if (!t || !mask || !t->nodes || !t->row_tok || n_nodes < 0 || n_tokens < 0 || (n_nodes && !nodes) ||
        (n_tokens && !tokens))
        return -1;
    for (int32_t i = 0; i < n_nodes; i++) {
        const int32_t node = nodes[i];
        if (node < 0 || node >= t->n_nodes) return -1;
        const int32_t rs = t->nodes[node].row_start, re = t->nodes[node].row_end;
        if (rs < 0 || re < rs || re > t->n_vocab) return -1;
        for (int32_t r = rs; r < re; r++) {
            const int32_t tok = t->row_tok[2 * (size_t)r];
            if (tok < 0 || tok >= t->n_vocab) return -1;
            mask[(uint32_t)tok >> 5] &= ~((uint32_t)1 << ((uint32_t)tok & 31u));
        }
    }
    for (int32_t i = 0; i < n_tokens; i++) {
        const int32_t tok = tokens[i];
        if (tok < 0 || tok >= t->n_vocab) return -1;
        mask[(uint32_t)tok >> 5] &= ~((uint32_t)1 << ((uint32_t)tok & 31u));
    }
    return 0;
}

int llama_cffi_trie_pack(const llama_cffi_trie *t, llama_cffi_tnode *nodes, int32_t *row_tok) {
    if (!t || !nodes || !row_tok || t->n_nodes < 0 || t->n_vocab < 0) return -1;
    const int32_t n_nodes = t->n_nodes, n_vocab = t->n_vocab;
    for (int32_t n = 0; n <= n_nodes; n++) {
        llama_cffi_tnode *r = nodes + n;
        r->first_child = t->first_child[n];
        r->n_child = t->n_child[n];
        r->row_start = t->row_start[n];
        r->row_end = t->row_end[n];
        r->n_term = t->n_term[n];
        r->height = t->height[n];
        r->cpi = n < n_nodes ? t->node_cpi[n] : -1;
        r->has_pt = t->has_pt[n];
        r->below_flags = t->below_flags[n];
        r->pad[0] = r->pad[1] = 0;
        r->below_asc[0] = t->below_asc[2 * (size_t)n];
        r->below_asc[1] = t->below_asc[2 * (size_t)n + 1];
    }
    /* (a token out of range is kept as it is, with slot -1: the walks check each token
       they read, as they did reading order) */
    for (int32_t r = 0; r < n_vocab; r++) {
        const int32_t tok = t->order[r];
        row_tok[2 * (size_t)r] = tok;
        row_tok[2 * (size_t)r + 1] = (uint32_t)tok < (uint32_t)n_vocab ? t->pchar_slot[tok] : -1;
    }
    return 0;
}

int llama_cffi_trie_root_groups(const llama_cffi_trie *t, const int32_t *cls_of_cpi, int32_t n_cps, int32_t n_classes,
                                int32_t *out_nodes, int32_t *out_start) {
    if (!t || !cls_of_cpi || !out_nodes || !out_start || n_classes < 0 || n_cps < 0) return -1;
    const int32_t root = t->n_nodes, fc = t->first_child[root], n = t->n_child[root];
    if (fc < 0 || n < 0 || fc + n > t->n_nodes) return -1;
    memset(out_start, 0, sizeof(int32_t) * ((size_t)n_classes + 1));
    for (int32_t i = 0; i < n; i++) {
        const uint32_t cpi = (uint32_t)t->node_cpi[fc + i];
        if (cpi >= (uint32_t)n_cps) return -1;
        const int32_t c = cls_of_cpi[cpi];
        if (c < 0 || c >= n_classes) return -1;
        out_start[c + 1]++;
    }
    for (int32_t c = 0; c < n_classes; c++) out_start[c + 1] += out_start[c];
    for (int32_t i = 0; i < n; i++) /* counting sort, stable (the classes were checked above) */
        out_nodes[out_start[cls_of_cpi[t->node_cpi[fc + i]]]++] = fc + i;
    for (int32_t c = n_classes; c > 0; c--) out_start[c] = out_start[c - 1];
    out_start[0] = 0;
    return 0;
}

int llama_cffi_trie_big_groups(const llama_cffi_trie *t, const int32_t *cls_of_cpi, int32_t n_cps, int32_t n_classes,
                               int32_t *kids, int32_t *next) {
    if (!t || !cls_of_cpi || n_cps < 0 || n_classes < 1 || t->n_big < 0 || (t->n_big && (!t->big_nodes || !t->big_base)))
        return -1;
    if (!t->n_big) return 0;
    if (!kids || !next || t->big_base[0] != 0) return -1;
    /* per class, how many children of the node (reset after each node: only the classes met) */
    int32_t *count = (int32_t *)calloc((size_t)n_classes, sizeof(int32_t));
    int32_t *met = (int32_t *)malloc(sizeof(int32_t));
    int32_t met_cap = 1;
    if (!count || !met) {
        free(count);
        free(met);
        return -2;
    }
    int rc = 0;
    for (int32_t i = 0; i < t->n_big && !rc; i++) {
        const int32_t node = t->big_nodes[i], base = t->big_base[i];
        if (node < 0 || node >= t->n_nodes || (i && node <= t->big_nodes[i - 1])) {
            rc = -1;
            break;
        }
        const int32_t fc = t->first_child[node], n = t->n_child[node];
        if (fc < 0 || n < 0 || fc + n > t->n_nodes || t->big_base[i + 1] - base != n) {
            rc = -1;
            break;
        }
        if (n > met_cap) {
            int32_t *p = (int32_t *)realloc(met, sizeof(int32_t) * (size_t)n);
            if (!p) {
                rc = -2;
                break;
            }
            met = p;
            met_cap = n;
        }
        int32_t n_met = 0;
        for (int32_t j = 0; j < n; j++) {
            const uint32_t cpi = (uint32_t)t->node_cpi[fc + j];
            if (cpi >= (uint32_t)n_cps || cls_of_cpi[cpi] < 0 || cls_of_cpi[cpi] >= n_classes) {
                rc = -1;
                break;
            }
            const int32_t c = cls_of_cpi[cpi];
            if (!count[c]++) met[n_met++] = c;
        }
        if (rc) break;
        /* the groups in the order their classes were met; count[c] becomes the group's
           next free position, then is cleared */
        int32_t at = 0;
        for (int32_t m = 0; m < n_met; m++) {
            const int32_t c = met[m], size = count[c];
            for (int32_t j = at; j < at + size; j++) next[base + j] = base + at + size;
            count[c] = at;
            at += size;
        }
        for (int32_t j = 0; j < n; j++) kids[base + count[cls_of_cpi[t->node_cpi[fc + j]]]++] = fc + j;
        for (int32_t m = 0; m < n_met; m++) count[met[m]] = 0;
    }
    free(count);
    free(met);
    return rc;
}

/* big node node's grouped children and their next positions (relative: kids[0 .. n)),
   when node is one of the trie's big nodes and g has its groups; 0 when not (the caller
   reads the children in order), -1 bad data */
static inline int big_of(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, int32_t node, int32_t n,
                         const int32_t **kids, const int32_t **next) {
    *kids = *next = NULL;
    if (!g->big_kids || !g->big_next || t->n_big <= 0) return 0;
    int32_t lo = 0, hi = t->n_big;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (t->big_nodes[mid] < node) lo = mid + 1;
        else hi = mid;
    }
    if (lo == t->n_big || t->big_nodes[lo] != node) return 0;
    const int32_t base = t->big_base[lo];
    if (base < 0 || t->big_base[lo + 1] - base != n) return -1;
    *kids = g->big_kids + base;
    *next = g->big_next + base;
    return 1;
}

/* the special code points (see llama_cffi.h), increasing: JavaScript's and Python's \s
   above ASCII, which holds the line separators that . leaves out */
static const int32_t special_cps[] = {0x85,   0xA0,   0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
                                      0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029,
                                      0x202F, 0x205F, 0x3000, 0xFEFF};
#define N_SPECIAL_CPS ((int32_t)(sizeof special_cps / sizeof special_cps[0]))

int32_t llama_cffi_trie_special_cps(int32_t *out, int32_t cap) {
    if (!out || cap < N_SPECIAL_CPS) return -1;
    memcpy(out, special_cps, sizeof special_cps);
    return N_SPECIAL_CPS;
}

int llama_cffi_trie_bind(const llama_cffi_trie *t, const int32_t *uniq_cps, const double *cp_weight, int32_t n_cps,
                         int32_t n_ascii, const int32_t *edges, const int32_t *interval_class, int32_t n_int,
                         int32_t n_classes, const int32_t *ascii_cls, int32_t *cls_of_cpi, double *class_weight,
                         uint64_t *na_classes, uint64_t *asc_table, int32_t *root_nodes, int32_t *root_start) {
    if (!t || !uniq_cps || !cp_weight || !edges || !interval_class || !ascii_cls || !cls_of_cpi || !class_weight ||
        !na_classes || !asc_table || !root_nodes || !root_start || n_cps < 0 || n_ascii < 0 || n_ascii > n_cps ||
        n_int < 1 || n_classes < 1 || n_classes >= (1 << 24))
        return -1;
    const int32_t W = n_classes / 64 + 1;
    if (edges[0] != 0) return -1;
    for (int32_t i = 0; i < n_int; i++)
        if (edges[i + 1] <= edges[i] || interval_class[i] < 0 || interval_class[i] >= n_classes) return -1;
    for (int32_t cp = 0; cp < 128; cp++)
        if (ascii_cls[cp] < 0 || ascii_cls[cp] >= n_classes) return -1;
    /* each code point's class: its interval's (a merge of two increasing sequences; code
       points past the last edge take the last interval, as classes_of clips them) */
    memset(class_weight, 0, sizeof(double) * (size_t)n_classes);
    memset(na_classes, 0, sizeof(uint64_t) * 2 * (size_t)W);
    int32_t iv = 0, sp = 0;
    for (int32_t i = 0; i < n_cps; i++) {
        const int32_t cp = uniq_cps[i];
        if (cp < 0 || (i && cp <= uniq_cps[i - 1]) || !(cp_weight[i] >= 0)) return -1;
        if ((i < n_ascii) != (cp < 128)) return -1;
        while (iv + 1 < n_int && edges[iv + 1] <= cp) iv++;
        const int32_t c = interval_class[iv];
        cls_of_cpi[i] = c;
        class_weight[c] += cp_weight[i];
        if (i >= n_ascii) { /* (both lists increase: one merge) */
            while (sp < N_SPECIAL_CPS && special_cps[sp] < cp) sp++;
            const int special = sp < N_SPECIAL_CPS && special_cps[sp] == cp;
            na_classes[(special ? (size_t)W : 0) + (size_t)(c >> 6)] |= (uint64_t)1 << (c & 63);
        }
    }
    /* the ASCII code points of each class, then per byte of a class set and its value the
       union of its classes' (row (8 w + b) * 256 + v; the value without its lowest bit,
       plus that bit's class) */
    uint64_t *cls_asc = (uint64_t *)calloc((size_t)(64 * W) * 2, sizeof(uint64_t));
    if (!cls_asc) return -2;
    for (int32_t cp = 0; cp < 128; cp++) cls_asc[2 * ascii_cls[cp] + (cp >> 6)] |= (uint64_t)1 << (cp & 63);
    for (int32_t j = 0; j < 8 * W; j++) {
        uint64_t *row = asc_table + (size_t)j * 512;
        row[0] = row[1] = 0;
        for (int32_t v = 1; v < 256; v++) {
            const int32_t low = v & (v - 1), b = __builtin_ctz((unsigned)v);
            row[2 * v] = row[2 * low] | cls_asc[2 * (8 * j + b)];
            row[2 * v + 1] = row[2 * low + 1] | cls_asc[2 * (8 * j + b) + 1];
        }
    }
    free(cls_asc);
    return llama_cffi_trie_root_groups(t, cls_of_cpi, n_cps, n_classes, root_nodes, root_start);
}

/* the root's children of class c in g's root groups: *a .. *b of g->root_nodes; 0, -1 bad data */
static inline int root_group(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, int32_t c, int32_t *a,
                             int32_t *b) {
    const int32_t nroot = t->n_child[t->n_nodes];
    *a = g->root_start[c];
    *b = g->root_start[c + 1];
    return (*a < 0 || *b < *a || *b > nroot) ? -1 : 0;
}

/* where a walk reads transitions: the engine's table when g has an engine, else trans;
   and how many states there are */
static inline const int32_t *table_of(const llama_cffi_trie_grammar *g) {
    return g->engine ? llama_cffi_gengine_table((const llama_cffi_gengine *)g->engine) : g->trans;
}
static inline int32_t n_states_of(const llama_cffi_trie_grammar *g) {
    return g->engine ? llama_cffi_gengine_n_states((const llama_cffi_gengine *)g->engine) : g->n_states;
}

/* a transition not computed yet (UNKNOWN in the table): computed by the engine when g has
   one (the successor, -1 none, or an engine error <= LLAMA_CFFI_GENGINE_WALK_ERR);
   LLAMA_CFFI_TRANS_UNKNOWN (leave it pending) when not */
static inline int32_t compute_trans(const llama_cffi_trie_grammar *g, int32_t s, int32_t c) {
    if (!g->engine) return LLAMA_CFFI_TRANS_UNKNOWN;
    return llama_cffi_gengine_walk_step((llama_cffi_gengine *)g->engine, s, c);
}

/* the root's children of class c (*a .. *b of g's root groups) and, when there are any,
   start's successor on c in *s (computed if unknown; -1: none or none there); 0, -1 bad
   data, or an engine error <= LLAMA_CFFI_GENGINE_WALK_ERR */
static inline int root_class_step(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, int32_t start,
                                  int32_t c, int32_t *a, int32_t *b, int32_t *s) {
    *s = -1;
    if (root_group(t, g, c, a, b)) return -1;
    if (*a == *b) return 0;
    int32_t x = table_of(g)[(size_t)start * (size_t)g->n_classes + (size_t)c];
    if (x == LLAMA_CFFI_TRANS_UNKNOWN) x = compute_trans(g, start, c);
    if (x <= LLAMA_CFFI_GENGINE_WALK_ERR) return x;
    *s = x < 0 ? -1 : x;
    return 0;
}

/* the run of state s (below g's run tables' length) computed by g's engine and written
   into those tables (writeable: see llama_cffi.h); 0, or an engine error offset */
static int compute_run(const llama_cffi_trie_grammar *g, int32_t s) {
    /* (not its closed run: its search fills rows, which a walk that meets many states
       for the first time would pay for each; the plans' runs, made by Python, have theirs,
       and so do the states of a closure Python found, whose closed run is left as it is) */
    int32_t n = llama_cffi_gengine_run((llama_cffi_gengine *)g->engine, s, g->class_weight, g->run_cap,
                                       g->max_run_stacks, g->run_chain, (uint64_t *)g->run_words + (size_t)s * g->W,
                                       NULL, g->W);
    if (n < 0) return LLAMA_CFFI_GENGINE_WALK_ERR + n;
    ((int32_t *)g->run_len)[s] = n - 1;
    ((uint8_t *)g->run_known)[s] = 1;
    return 0;
}

static inline int in_set(const uint64_t *words, int32_t c) { return (int)((words[c >> 6] >> (c & 63)) & 1u); }
static inline int any_word(const uint64_t *words, int32_t W) {
    uint64_t any = 0;
    for (int32_t i = 0; i < W; i++) any |= words[i];
    return any != 0;
}

/* node n's class under g: the class of its code point (no per-grammar node array);
   -1 when the trie's code point index is out of g's range (bad data) */
static inline int32_t node_cls(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, int32_t n) {
    const uint32_t cpi = (uint32_t)t->nodes[n].cpi;
    return cpi < (uint32_t)g->n_cps ? g->cls_of_cpi[cpi] : -1;
}

/* a run's summary in the terms of the trie's below_asc and below_flags: the ASCII code
   points whose class is in the run (words 0, 1: the OR of the grammar's asc_table rows,
   one lookup per byte of the run's words); word 2: bit 0, every class holding a code
   point >= 128 of the vocabulary that is not special is in the run; bit 1, the partial
   bit (n_classes) is; bit 2, every class holding a special code point is (the bits of
   below_flags) */
static void run_summary(const llama_cffi_trie_grammar *g, const uint64_t *run, uint64_t out[3]) {
    uint64_t lo = 0, hi = 0;
    int na_ok = 1, sp_ok = 1;
    for (int32_t w = 0; w < g->W; w++) {
        const uint64_t word = run[w];
        if (g->na_classes[w] & ~word) na_ok = 0;
        if (g->na_classes[g->W + w] & ~word) sp_ok = 0;
        for (int32_t b = 0; b < 8; b++) {
            const uint64_t *row = g->asc_table + ((size_t)(8 * w + b) * 256 + ((word >> (8 * b)) & 255)) * 2;
            lo |= row[0];
            hi |= row[1];
        }
    }
    out[0] = lo;
    out[1] = hi;
    out[2] = (uint64_t)na_ok | ((uint64_t)in_set(run, g->n_classes) << 1) | ((uint64_t)sp_ok << 2);
}

/* is every character strictly below node of the summarized run's classes, and is a token
   ending inside a character at or below it allowed by it? A subtree with a code point
   >= 128 passes only when every class holding one of its kind (special or not: see
   llama_cffi_trie_special_cps) is in the run: conservative (a "no" makes the caller
   descend), so the answer is exact where it is "yes" */
static inline int covered(const llama_cffi_trie *t, int32_t node, const uint64_t *sum) {
    const llama_cffi_tnode *r = t->nodes + node;
    if ((r->below_asc[0] & ~sum[0]) | (r->below_asc[1] & ~sum[1])) return 0;
    return (r->below_flags & ~(uint8_t)sum[2]) == 0;
}

/* the summaries of the runs one walk reads, per state (a direct-mapped cache on the
   walk's stack: a state's run, once known, does not change) */
#define RUN_SUMS 64 /* a power of two */
typedef struct {
    int32_t state[RUN_SUMS];
    uint64_t sum[RUN_SUMS][6]; /* the run's summary, then its closed run's */
    /* per entry, the closed run's summary: 0 not made yet, 1 made, 2 none (no closed run) */
    uint8_t closed[RUN_SUMS];
} run_sums;

static inline void run_sums_init(run_sums *r) {
    for (int i = 0; i < RUN_SUMS; i++) r->state[i] = -1;
}

static inline const uint64_t *run_sum_of(const llama_cffi_trie_grammar *g, run_sums *r, int32_t s) {
    const int h = s & (RUN_SUMS - 1);
    if (r->state[h] != s) {
        run_summary(g, g->run_words + (size_t)s * (size_t)g->W, r->sum[h]);
        r->closed[h] = 0;
        r->state[h] = s;
    }
    return r->sum[h];
}

/* the summary of s's closed run (s's entry made by run_sum_of first), made when first
   asked for; NULL when s has none (or g no closed runs): most walks never ask */
static inline const uint64_t *closed_sum_of(const llama_cffi_trie_grammar *g, run_sums *r, int32_t s) {
    const int h = s & (RUN_SUMS - 1);
    if (!r->closed[h]) {
        r->closed[h] = 2;
        if (g->run_closed) {
            const uint64_t *w = g->run_closed + (size_t)s * (size_t)g->W;
            uint64_t any = 0;
            for (int32_t i = 0; i < g->W; i++) any |= w[i];
            if (any) {
                run_summary(g, w, r->sum[h] + 3);
                /* (bits 0 and 2 of word 2 alone, every class with a code point >= 128 of a
                   kind in it, say nothing when it holds no class) */
                if (r->sum[h][3] | r->sum[h][4]) r->closed[h] = 1;
            }
        }
    }
    return r->closed[h] == 1 ? r->sum[h] + 3 : NULL;
}

/* a counting sort of (node, group) pairs by group: group g's nodes are
   frontier[group_start[g] .. group_start[g + 1]] */
static void group_sort(const int32_t *pairs, int32_t nf, int64_t n_groups, int32_t *frontier, int32_t *group_start) {
    memset(group_start, 0, sizeof(int32_t) * (size_t)(n_groups + 1));
    for (int32_t i = 0; i < nf; i++) group_start[pairs[2 * (size_t)i + 1] + 1]++;
    for (int64_t g = 0; g < n_groups; g++) group_start[g + 1] += group_start[g];
    for (int32_t i = 0; i < nf; i++) frontier[group_start[pairs[2 * (size_t)i + 1]]++] = pairs[2 * (size_t)i];
    for (int64_t g = n_groups; g > 0; g--) group_start[g] = group_start[g - 1];
    group_start[0] = 0;
}

int llama_cffi_trie_run_scan(const llama_cffi_trie *t, const int32_t *cls, int32_t n_classes, const uint64_t *runs,
                             int32_t n_runs, int32_t k, uint32_t *mask, int32_t *frontier, int32_t frontier_cap, int32_t *n_frontier,
                             int32_t *group_start, int32_t *pt_tokens, int32_t *pt_depth, int32_t pt_cap, int32_t *n_pt,
                             int32_t *scratch, uint8_t *on_out) {
    if (!t || !cls || !runs || !mask || !frontier || !n_frontier || !group_start || !pt_tokens || !pt_depth || !n_pt ||
        !scratch || k < 0 || k > t->max_depth + 1 || n_classes < 0 || n_runs < 1 || n_runs > t->max_depth + 2)
        return -1;
    const int32_t n_nodes = t->n_nodes, n_vocab = t->n_vocab;
    const size_t W = (size_t)(n_classes / 64 + 1);
    const int64_t n_groups = (int64_t)(k + 1) * n_classes;
    if (n_groups >= (int64_t)1 << 30 || frontier_cap < n_nodes) return -1;
    int32_t nf = 0, np_ = 0;
    /* level by level (a parent's level comes before its children's): a node is on a run
       path when its parent is (the root is) and its class is in the run, at most k deep.
       Its whole tokens go into mask, its partial tokens (with their depth) into
       pt_tokens; a child of an on-path node that is not on the path is in the frontier,
       with its group (parent's depth * n_classes + class; scratch holds the pairs) */
    uint8_t *on = on_out ? on_out : (uint8_t *)calloc((size_t)n_nodes + 1, 1);
    if (!on) return -2;
    if (on_out) memset(on, 0, (size_t)n_nodes + 1);
    on[n_nodes] = 1;
    int rc = 0;
    for (int32_t i = 0; i < t->n_root_pt; i++) {
        if (np_ >= pt_cap) { rc = -3; goto done; }
        pt_depth[np_] = 0;
        pt_tokens[np_++] = t->root_pt[i];
    }
    /* locals: the byte writes to on and mask may alias anything, and would make the
       compiler reload every pointer of t after each one */
    const int32_t *const parent = t->parent, *const row_start = t->row_start, *const n_term = t->n_term;
    const int32_t *const order = t->order, *const pchar_slot = t->pchar_slot, *const level_base = t->level_base;
    const int32_t max_depth = t->max_depth;
    for (int32_t j = 0; j < max_depth; j++) {
        int32_t lo = level_base[j], hi = level_base[j + 1];
        if (lo < 0 || hi < lo || hi > n_nodes) { rc = -1; goto done; }
        int any = 0;
        const int in_run = j < k;
        const uint64_t *run = runs + (size_t)(j < n_runs ? j : n_runs - 1) * W; /* the classes of character j */
        for (int32_t n = lo; n < hi; n++) {
            const int32_t p = parent[n];
            if ((uint32_t)p > (uint32_t)n_nodes) { rc = -1; goto done; }
            if (!on[p]) continue;
            const int32_t c = cls[n];
            if ((uint32_t)c >= (uint32_t)n_classes) { rc = -1; goto done; }
            if (in_run && in_set(run, c)) {
                on[n] = 1;
                any = 1;
                const int32_t rs = row_start[n], nt = n_term[n];
                if (rs < 0 || nt < 0 || rs + nt > n_vocab) { rc = -1; goto done; }
                for (int32_t r = rs; r < rs + nt; r++) {
                    const int32_t tok = order[r];
                    if ((uint32_t)tok >= (uint32_t)n_vocab) { rc = -1; goto done; }
                    if (pchar_slot[tok] < 0) SET_BIT(mask, tok);
                    else {
                        if (np_ >= pt_cap) { rc = -3; goto done; }
                        pt_depth[np_] = j + 1;
                        pt_tokens[np_++] = tok;
                    }
                }
            } else if (j > 0) { /* (a root child that leaves the run is implicit: the root groups) */
                scratch[2 * (size_t)nf] = n;
                scratch[2 * (size_t)nf + 1] = j * n_classes + c;
                nf++;
            }
        }
        if (!any) break; /* nothing deeper hangs below an on-path node */
    }
done:
    if (!on_out) free(on);
    if (rc) return rc;
    group_sort(scratch, nf, n_groups, frontier, group_start);
    *n_frontier = nf;
    *n_pt = np_;
    return 0;
}

/* a pending entry: (node, state before the node's character, reason, detail) */
#define PEND(node_, ps_, why_, what_)                                                                                  \
    do {                                                                                                               \
        if (*n_pending >= pending_cap) return -3;                                                                      \
        int32_t *p_ = pending + 4 * (size_t)(*n_pending);                                                             \
        p_[0] = (node_);                                                                                               \
        p_[1] = (ps_);                                                                                                 \
        p_[2] = (why_);                                                                                                \
        p_[3] = (what_);                                                                                               \
        (*n_pending)++;                                                                                                \
    } while (0)

/* the tokens ending at node (reached in state s): 1 done, 0 pending (pchar of s unknown),
   -1 bad data */
static inline int node_tokens(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, int32_t node, int32_t s,
                              uint32_t *mask) {
    const llama_cffi_tnode *nd = t->nodes + node;
    int32_t rs = nd->row_start, nt = nd->n_term;
    if (rs < 0 || nt < 0 || rs + nt > t->n_vocab) return -1;
    const uint8_t *ok = NULL;
    if (nd->has_pt) {
        if (s >= g->n_pchar_states || !g->pchar_known[s]) return 0;
        ok = g->pchar_ok + (size_t)s * (size_t)t->n_pchars;
    }
    for (int32_t r = rs; r < rs + nt; r++) {
        int32_t tok = t->row_tok[2 * (size_t)r];
        if (tok < 0 || tok >= t->n_vocab) return -1;
        int32_t slot = t->row_tok[2 * (size_t)r + 1];
        if (slot < 0) SET_BIT(mask, tok);
        else {
            if (!ok || slot >= t->n_pchars) return -1;
            if (ok[slot]) SET_BIT(mask, tok);
        }
    }
    return 1;
}

/* after node's character, in live state s (reached from ps): absorb, or take the tokens
   ending here; 1: descend into the children, 0: done with this subtree, <0 error */
static inline int visit(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, int32_t node, int32_t ps,
                        int32_t s, uint32_t *mask, int32_t *pending, int32_t pending_cap, int32_t *n_pending,
                        int *moved, run_sums *sums, const uint64_t *pre) {
    const llama_cffi_tnode *nd = t->nodes + node;
    int32_t rs = nd->row_start, re = nd->row_end;
    if (rs < 0 || re < rs || re > t->n_vocab) return -1;
    /* reached by the premask's classes only (pre: their summary), and none other below:
       its tokens are in the plan's base already */
    if (pre && covered(t, node, pre)) return 0;
    const int in_tables = s < g->n_run_states;
    if (in_tables && !g->run_known[s] && re - rs >= g->absorb_min_rows && g->engine && g->class_weight &&
        g->run_chain) {
        /* the run of s, computed here (the arrays are the caller's writeable tables) */
        *moved = 1; /* the engine may have made states: its table may have moved */
        int rc = compute_run(g, s);
        if (rc) return rc;
        sums->state[s & (RUN_SUMS - 1)] = -1; /* (a summary made before, of no run, is stale) */
    }
    const int known = in_tables && g->run_known[s];
    /* (a state whose run is not known yet may have a closed run: a closure's, from Python) */
    if (known || (in_tables && g->run_closed && any_word(g->run_closed + (size_t)s * (size_t)g->W, g->W))) {
        const uint64_t *sum = run_sum_of(g, sums, s), *closed;
        if ((known && nd->height <= g->run_len[s] && covered(t, node, sum)) ||
            ((closed = closed_sum_of(g, sums, s)) && covered(t, node, closed))) {
            /* every token below continues in s's run, or in its closed run: the whole subtree */
            for (int32_t r = rs; r < re; r++) {
                int32_t tok = t->row_tok[2 * (size_t)r];
                if (tok < 0 || tok >= t->n_vocab) return -1;
                SET_BIT(mask, tok);
            }
            return 0;
        }
    }
    if (!known && re - rs >= g->absorb_min_rows) {
        PEND(node, ps, LLAMA_CFFI_PEND_RUN, s); /* worth knowing s's run */
        return 0;
    }
    int k = node_tokens(t, g, node, s, mask);
    if (k < 0) return -1;
    if (k == 0) {
        PEND(node, ps, LLAMA_CFFI_PEND_PCHAR, s);
        return 0;
    }
    return 1;
}

/* the subtree below node (its character taken: live state s, from ps), depth first */
/* a walk's premask (see llama_cffi_trie_plan): the classes' words and their summary
   (the partial-character bit left out: a token ending inside a character is not in a
   scan's base), and per frame of descend whether its path is of those classes only */
#define PRE_DEPTH 1024
typedef struct {
    const uint64_t *words;
    uint64_t sum[3];
    uint8_t in[PRE_DEPTH];
} premask_t;

/* the summary of a premask's classes (W words), its partial-character bit left out */
static void premask_summary(const llama_cffi_trie_grammar *g, const uint64_t *premask, uint64_t sum[3]) {
    run_summary(g, premask, sum);
    sum[2] &= ~(uint64_t)2;
}

int32_t llama_cffi_trie_premask_roots(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g,
                                      const uint64_t *premask, int32_t *nodes, int32_t cap, int32_t *group_start) {
    if (!t || !g || !premask || !nodes || !group_start || cap < 0 || !g->root_nodes || !g->root_start ||
        !t->below_asc || !t->below_flags || !g->asc_table || !g->na_classes)
        return -1;
    uint64_t sum[3];
    premask_summary(g, premask, sum);
    const int32_t nc = g->n_classes;
    int32_t n = 0;
    for (int32_t c = 0; c < nc; c++) {
        group_start[c] = n;
        if (!in_set(premask, c)) continue;
        int32_t a, b;
        if (root_group(t, g, c, &a, &b)) return -1;
        for (int32_t i = a; i < b; i++) {
            const int32_t node = g->root_nodes[i];
            if (node < 0 || node >= t->n_nodes) return -1;
            if (covered(t, node, sum)) continue;
            if (n >= cap) return -1;
            nodes[n++] = node;
        }
    }
    group_start[nc] = n;
    return n;
}

static int descend(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, int32_t node, int32_t ps, int32_t s,
                   int root, uint32_t *mask, int32_t *pending, int32_t pending_cap, int32_t *n_pending,
                   int32_t *f_node, int32_t *f_state, int32_t *f_next, int32_t depth_cap, run_sums *sums,
                   premask_t *pm) {
    const int32_t n_nodes = t->n_nodes, nc_ = g->n_classes;
    int moved = 0;
    /* (pm only when depth_cap <= PRE_DEPTH: the walk's check) */
    if (pm) {
        const int32_t c0 = root ? 0 : node_cls(t, g, node);
        if (c0 < 0 || c0 >= nc_) return -1;
        pm->in[0] = (uint8_t)(root || in_set(pm->words, c0));
    }
    if (!root) {
        int v = visit(t, g, node, ps, s, mask, pending, pending_cap, n_pending, &moved, sums,
                      pm && pm->in[0] ? pm->sum : NULL);
        if (v <= 0) return v;
    }
    const int32_t *tab = table_of(g);
    int32_t n_st = n_states_of(g);
    int32_t d = 0;
    f_node[0] = node;
    f_state[0] = s;
    f_next[0] = 0;
    while (d >= 0) {
        int32_t cur = f_node[d], cs = f_state[d];
        int32_t fc = t->nodes[cur].first_child, ncld = t->nodes[cur].n_child;
        if (fc < 0 || ncld < 0 || fc + ncld > n_nodes) return -1;
        /* a node with many children (a space before a word): its children by class, a
           class the state does not take skipped whole */
        const int32_t *kids = NULL, *knext = NULL;
        if (t->n_big > 0 && ncld >= t->big_min && big_of(t, g, cur, ncld, &kids, &knext) < 0) return -1;
        const int32_t kbase = kids ? (int32_t)(kids - g->big_kids) : 0;
        const int32_t *row = tab + (size_t)cs * (size_t)nc_;
        int32_t k = f_next[d];
        int descended = 0;
        while (k < ncld) {
            const int32_t at = k;
            int32_t ch = fc + k;
            if (kids) {
                ch = kids[k];
                if (ch < fc || ch >= fc + ncld) return -1;
            }
            k++;
            int32_t c = node_cls(t, g, ch);
            if (c < 0 || c >= nc_) return -1;
            int32_t s2 = row[c];
            if (s2 == LLAMA_CFFI_TRANS_UNKNOWN) {
                s2 = compute_trans(g, cs, c);
                if (s2 <= LLAMA_CFFI_GENGINE_WALK_ERR) return s2;
                if (s2 == LLAMA_CFFI_TRANS_UNKNOWN) {
                    PEND(ch, cs, LLAMA_CFFI_PEND_TRANS, c);
                    continue;
                }
                tab = table_of(g); /* the engine's table may have moved, and grown */
                n_st = n_states_of(g);
                row = tab + (size_t)cs * (size_t)nc_;
            }
            if (s2 < 0) {
                if (kids) { /* the rest of its class's group too */
                    const int32_t nx = knext[at] - kbase;
                    if (nx <= at || nx > ncld) return -1;
                    k = nx;
                }
                continue;
            }
            if (s2 >= n_st) return -1;
            const int in_pre = pm && pm->in[d] && in_set(pm->words, c);
            int v = visit(t, g, ch, cs, s2, mask, pending, pending_cap, n_pending, &moved, sums,
                          in_pre ? pm->sum : NULL);
            if (moved) {
                tab = table_of(g);
                n_st = n_states_of(g);
                row = tab + (size_t)cs * (size_t)nc_;
                moved = 0;
            }
            if (v < 0) return v;
            if (v == 0) continue;
            if (d + 1 >= depth_cap) return -1;
            f_next[d] = k;
            d++;
            f_node[d] = ch;
            f_state[d] = s2;
            f_next[d] = 0;
            if (pm) pm->in[d] = (uint8_t)in_pre;
            descended = 1;
            break;
        }
        if (!descended) d--;
    }
    return 0;
}

static int walk(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, const int32_t *nodes,
                const int32_t *states, int32_t n, const int32_t *group_start, const int32_t *depth_states,
                const uint64_t *run, int32_t k, int32_t start, const int32_t *live, int32_t n_live, uint32_t *mask,
                int32_t *pending, int32_t pending_cap, int32_t *n_pending, int32_t *frames, int32_t frames_cap,
                const uint64_t *premask);

int llama_cffi_trie_walk(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, const int32_t *nodes,
                         const int32_t *states, int32_t n, const int32_t *group_start, const int32_t *depth_states,
                         const uint64_t *run, int32_t k, int32_t start, uint32_t *mask, int32_t *pending, int32_t pending_cap,
                         int32_t *n_pending, int32_t *frames, int32_t frames_cap) {
    return walk(t, g, nodes, states, n, group_start, depth_states, run, k, start, NULL, 0, mask, pending, pending_cap,
                n_pending, frames, frames_cap, NULL);
}

/* a transition for derive_split: the table's, computed when unknown (LLAMA_CFFI_TRANS_UNKNOWN
   when the engine cannot give it now) */
static inline int32_t step_of(const llama_cffi_trie_grammar *g, int32_t s, int32_t c) {
    int32_t s2 = table_of(g)[(size_t)s * (size_t)g->n_classes + (size_t)c];
    if (s2 == LLAMA_CFFI_TRANS_UNKNOWN) s2 = compute_trans(g, s, c);
    return s2;
}

int32_t llama_cffi_trie_derive_split(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, int32_t start,
                                     int32_t gs, const int32_t *nodes, int32_t n, int32_t budget, int32_t *clear,
                                     int32_t *n_clear, int32_t *walk_nodes, int32_t *walk_states, int32_t cap) {
    if (!t || !g || (n && !nodes) || n < 0 || !clear || !n_clear || !walk_nodes || !walk_states || cap < 0 ||
        !t->nodes || t->max_depth < 0)
        return -1;
    const int32_t n_nodes = t->n_nodes, nc_ = g->n_classes;
    if (start < 0 || start >= n_states_of(g) || gs < 0 || gs >= n_states_of(g)) return -1;
    /* frames per depth: the node, the states before its children, the next child */
    const int32_t depth_cap = t->max_depth + 2;
    int32_t *fr = (int32_t *)malloc(sizeof(int32_t) * 4 * (size_t)depth_cap);
    if (!fr) return -1;
    int32_t nw = 0, ncl = 0, visited = 0, rc = 0;
#define SPLIT_OUT(arr_n, ...)                                                                                          \
    do {                                                                                                               \
        if ((arr_n) >= cap) {                                                                                          \
            rc = -2;                                                                                                   \
            goto done;                                                                                                 \
        }                                                                                                              \
        __VA_ARGS__;                                                                                                   \
    } while (0)
    for (int32_t i = 0; i < n; i++) {
        /* the pending node (entered from a before it and b), the frame stack below */
        int32_t d = -1, node = nodes[i], a = start, b = gs;
        for (;;) {
            if (node >= 0) {
                if (node >= n_nodes) {
                    rc = -1;
                    goto done;
                }
                if (++visited > budget) {
                    rc = -2;
                    goto done;
                }
                const int32_t c = node_cls(t, g, node);
                if (c < 0 || c >= nc_) {
                    rc = -1;
                    goto done;
                }
                const int32_t a2 = step_of(g, a, c);
                if (a2 <= LLAMA_CFFI_GENGINE_WALK_ERR) {
                    rc = a2;
                    goto done;
                }
                const int32_t b2 = a2 == LLAMA_CFFI_TRANS_UNKNOWN ? a2 : step_of(g, b, c);
                if (b2 <= LLAMA_CFFI_GENGINE_WALK_ERR) {
                    rc = b2;
                    goto done;
                }
                if (a2 == LLAMA_CFFI_TRANS_UNKNOWN || b2 == LLAMA_CFFI_TRANS_UNKNOWN ||
                    (a2 >= 0 && b2 >= 0 && a2 != b2 && t->nodes[node].has_pt)) {
                    /* walked whole from start's side */
                    SPLIT_OUT(ncl, clear[ncl++] = node);
                    SPLIT_OUT(nw, (walk_nodes[nw] = node, walk_states[nw++] = a));
                } else if (a2 == b2) {
                    /* gs's bits hold below */
                } else if (a2 < 0) {
                    SPLIT_OUT(ncl, clear[ncl++] = node);
                } else if (b2 < 0) { /* (gs's bits below are clear) */
                    SPLIT_OUT(nw, (walk_nodes[nw] = node, walk_states[nw++] = a));
                } else { /* both live, apart: the tokens ending here are allowed by both; below */
                    if (a2 >= n_states_of(g) || b2 >= n_states_of(g) || d + 1 >= depth_cap) {
                        rc = -1;
                        goto done;
                    }
                    d++;
                    fr[4 * d] = node;
                    fr[4 * d + 1] = a2;
                    fr[4 * d + 2] = b2;
                    fr[4 * d + 3] = 0;
                }
            }
            /* the next child of the deepest frame (a big node's by class: a class on which
               both states go to one state skipped whole) */
            node = -1;
            while (d >= 0) {
                const int32_t cur = fr[4 * d], k = fr[4 * d + 3];
                const int32_t fc = t->nodes[cur].first_child, ncld = t->nodes[cur].n_child;
                if (fc < 0 || ncld < 0 || fc + ncld > n_nodes) {
                    rc = -1;
                    goto done;
                }
                if (k >= ncld) {
                    d--;
                    continue;
                }
                const int32_t *kids = NULL, *knext = NULL;
                if (t->n_big > 0 && ncld >= t->big_min && big_of(t, g, cur, ncld, &kids, &knext) < 0) {
                    rc = -1;
                    goto done;
                }
                const int32_t ch = kids ? kids[k] : fc + k;
                if (ch < fc || ch >= fc + ncld) {
                    rc = -1;
                    goto done;
                }
                fr[4 * d + 3] = k + 1;
                if (kids) {
                    const int32_t c = node_cls(t, g, ch);
                    if (c < 0 || c >= nc_) {
                        rc = -1;
                        goto done;
                    }
                    const int32_t a3 = step_of(g, fr[4 * d + 1], c);
                    if (a3 <= LLAMA_CFFI_GENGINE_WALK_ERR) {
                        rc = a3;
                        goto done;
                    }
                    if (a3 != LLAMA_CFFI_TRANS_UNKNOWN) {
                        const int32_t b3 = step_of(g, fr[4 * d + 2], c);
                        if (b3 <= LLAMA_CFFI_GENGINE_WALK_ERR) {
                            rc = b3;
                            goto done;
                        }
                        if (a3 == b3) { /* the rest of its class's group too */
                            const int32_t nx = knext[k] - (int32_t)(kids - g->big_kids);
                            if (nx <= k || nx > ncld) {
                                rc = -1;
                                goto done;
                            }
                            fr[4 * d + 3] = nx;
                            continue;
                        }
                    }
                }
                node = ch;
                a = fr[4 * d + 1];
                b = fr[4 * d + 2];
                break;
            }
            if (d < 0) break;
        }
    }
done:
#undef SPLIT_OUT
    free(fr);
    *n_clear = rc < 0 ? 0 : ncl;
    return rc < 0 ? rc : nw;
}

int llama_cffi_trie_plan_groups(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, llama_cffi_trie_plan *p,
                                int32_t *buf, int32_t cap) {
    if (!t || !g || !p || !buf || !p->group_start || !p->run || !g->root_start || p->k < 0 ||
        p->k > t->max_depth + 1)
        return -1;
    const int32_t nc = g->n_classes;
    const int64_t n_groups = (int64_t)(p->k + 1) * nc;
    if (n_groups > cap) return -1;
    int32_t n = 0;
    for (int64_t gi = 0; gi < n_groups; gi++) {
        int32_t a = p->group_start[gi], b = p->group_start[gi + 1];
        if (a < 0 || b < a || b > p->n_frontier) return -1;
        int live = a < b;
        if (!live && gi < nc && ((p->k == 0 && !p->premask) || !in_set(p->run, (int32_t)gi))) {
            int32_t ra, rb;
            if (root_group(t, g, (int32_t)gi, &ra, &rb)) return -1;
            live = ra < rb;
        }
        if (live) buf[n++] = (int32_t)gi;
    }
    p->live_groups = buf;
    p->n_live_groups = n;
    return 0;
}

static int walk(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, const int32_t *nodes,
                const int32_t *states, int32_t n, const int32_t *group_start, const int32_t *depth_states,
                const uint64_t *run, int32_t k, int32_t start, const int32_t *live, int32_t n_live, uint32_t *mask,
                int32_t *pending, int32_t pending_cap, int32_t *n_pending, int32_t *frames, int32_t frames_cap,
                const uint64_t *premask) {
    if (!t || !g || (!nodes && n) || !mask || !pending || !n_pending || !frames) return -1;
    if (!t->below_asc || !t->below_flags || !t->nodes || !t->row_tok || !g->asc_table || !g->na_classes) return -1;
    if (!states && !group_start && (start < 0 || start >= n_states_of(g))) return -1;
    if (group_start && (!depth_states || !run || !g->root_nodes || !g->root_start || k < 0 || k > t->max_depth + 1))
        return -1;
    const int32_t n_nodes = t->n_nodes, nc_ = g->n_classes;
    const int32_t depth_cap = frames_cap / 3;
    if (depth_cap < t->max_depth + 2) return -1;
    int32_t *f_node = frames, *f_state = frames + depth_cap, *f_next = frames + 2 * depth_cap;
    *n_pending = 0;
    run_sums sums;
    run_sums_init(&sums);
    premask_t pm_, *pm = NULL;
    if (premask) {
        /* (a premask plan's run is its premask: its root groups of those classes are
           implicit no more, their children left to walk are the plan's frontier) */
        if (k != 0 || !run || memcmp(run, premask, sizeof(uint64_t) * (size_t)g->W)) return -1;
        if (depth_cap <= PRE_DEPTH) { /* (else each subtree is walked, its bits set again) */
            premask_summary(g, premask, pm_.sum);
            pm_.words = premask;
            pm = &pm_;
        }
    }
    if (group_start) {
        /* nodes grouped by (depth of the parent, class), entered from the state at that
           depth: a class that state does not take skips its group at once (with live, the
           plan's list of groups that hold nodes: only those) */
        const int64_t n_groups = (int64_t)(k + 1) * nc_;
        const int64_t n_iter = live ? n_live : n_groups;
        for (int64_t it = 0; it < n_iter; it++) {
            const int64_t gi = live ? live[it] : it;
            if (gi < 0 || gi >= n_groups) return -1;
            const int32_t d = (int32_t)(gi / nc_), c = (int32_t)(gi % nc_);
            int32_t ps = depth_states[d];
            if (ps < 0 || ps >= n_states_of(g)) return -1;
            {
                int32_t a = group_start[gi], b = group_start[gi + 1];
                if (a < 0 || b < a || b > n) return -1;
                /* at depth 0, the root's children of a class that leaves the run: implicit
                   (every class when k = 0, but a premask's) */
                int32_t ra = 0, rb = 0;
                if (d == 0 && ((k == 0 && !premask) || !in_set(run, c)) && root_group(t, g, c, &ra, &rb))
                    return -1;
                if (a == b && ra == rb) continue;
                /* (the table is read again for each class: a descent may move the engine's) */
                int32_t s = table_of(g)[(size_t)ps * (size_t)nc_ + (size_t)c];
                if (s == LLAMA_CFFI_TRANS_UNKNOWN) s = compute_trans(g, ps, c);
                if (s <= LLAMA_CFFI_GENGINE_WALK_ERR) return s;
                if (s == LLAMA_CFFI_TRANS_UNKNOWN) {
                    for (int32_t i = a; i < b; i++) PEND(nodes[i], ps, LLAMA_CFFI_PEND_TRANS, c);
                    for (int32_t i = ra; i < rb; i++) PEND(g->root_nodes[i], ps, LLAMA_CFFI_PEND_TRANS, c);
                    continue;
                }
                if (s < 0) continue;
                if (s >= n_states_of(g)) return -1;
                for (int32_t i = a; i < rb - ra + b; i++) {
                    int32_t node = i < b ? nodes[i] : g->root_nodes[ra + (i - b)];
                    if (node < 0 || node >= n_nodes || node_cls(t, g, node) != c) return -1;
                    int rc = descend(t, g, node, ps, s, 0, mask, pending, pending_cap, n_pending, f_node, f_state,
                                     f_next, depth_cap, &sums, d == 0 ? pm : NULL);
                    if (rc < 0) return rc;
                }
            }
        }
        return 0;
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t node = nodes[i];
        int32_t ps = states ? states[i] : start;
        if (node < 0 || node > n_nodes || ps < 0 || ps >= n_states_of(g)) return -1;
        int rc;
        if (node == n_nodes) { /* the root: no character (its partial tokens are decided by the caller) */
            rc = descend(t, g, node, ps, ps, 1, mask, pending, pending_cap, n_pending, f_node, f_state, f_next,
                         depth_cap, &sums, NULL);
        } else {
            int32_t c = node_cls(t, g, node);
            if (c < 0 || c >= nc_) return -1;
            int32_t s = table_of(g)[(size_t)ps * (size_t)nc_ + (size_t)c];
            if (s == LLAMA_CFFI_TRANS_UNKNOWN) s = compute_trans(g, ps, c);
            if (s <= LLAMA_CFFI_GENGINE_WALK_ERR) return s;
            if (s == LLAMA_CFFI_TRANS_UNKNOWN) {
                PEND(node, ps, LLAMA_CFFI_PEND_TRANS, c);
                continue;
            }
            if (s < 0) continue;
            if (s >= n_states_of(g)) return -1;
            rc = descend(t, g, node, ps, s, 0, mask, pending, pending_cap, n_pending, f_node, f_state, f_next,
                         depth_cap, &sums, NULL);
        }
        if (rc < 0) return rc;
    }
    return 0;
}

int llama_cffi_trie_mask(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, const llama_cffi_trie_plan *p,
                         uint32_t *mask, int32_t *pending, int32_t pending_cap, int32_t *n_pending, int32_t *frames,
                         int32_t frames_cap) {
    if (!t || !g || !p || !mask || !p->base || (!p->extra && p->n_extra) || p->n_extra < 0) return -1;
    memcpy(mask, p->base, sizeof(uint32_t) * (((size_t)t->n_vocab + 31) / 32));
    for (int32_t i = 0; i < p->n_extra; i++) {
        int32_t tok = p->extra[i];
        if (tok < 0 || tok >= t->n_vocab) return -1;
        SET_BIT(mask, tok);
    }
    if (p->n_live_groups < 0 || (p->n_live_groups && !p->live_groups)) return -1;
    return walk(t, g, p->frontier, NULL, p->n_frontier, p->group_start, p->depth_states, p->run, p->k, p->start,
                p->live_groups, p->n_live_groups, mask, pending, pending_cap, n_pending, frames, frames_cap,
                p->premask);
}

int llama_cffi_trie_position_mask(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g,
                                  const llama_cffi_trie_plan *tmpl, int32_t start, int32_t chain_max,
                                  const int32_t *pt, const int32_t *pt_depth, int32_t n_pt,
                                  const int32_t *eog, int32_t n_eog, const int64_t *pchars, uint8_t *pchar_buf,
                                  int32_t *chain, int32_t *extra, int32_t extra_cap, llama_cffi_trie_plan *out,
                                  uint32_t *mask, int32_t *pending, int32_t pending_cap, int32_t *n_pending,
                                  int32_t *frames, int32_t frames_cap) {
    if (!t || !g || !tmpl || !chain || !out || !mask || !pending || !n_pending || !frames || n_pt < 0 || n_eog < 0 ||
        extra_cap < 0 || (extra_cap && !extra) || (n_pt && (!pt || !pt_depth || !t->pchar_slot)) || (n_eog && !eog) ||
        (t->n_pchars && (!pchars || !pchar_buf)) || chain_max < 0 || !tmpl->run || tmpl->k < 0)
        return -1;
    if (!g->engine || !g->class_weight || !g->run_words || !g->run_len || !g->run_known) return -1;
    llama_cffi_gengine *e = (llama_cffi_gengine *)g->engine;
    const int32_t W = g->W, k = tmpl->k;
    *n_pending = 0;
    if (start < 0 || start >= n_states_of(g) || start >= g->n_run_states || k != g->run_cap) return 1;
    /* start's run, as Python's (closed run included), into chain and g's run tables */
    uint64_t *rw = (uint64_t *)g->run_words + (size_t)start * W;
    uint64_t *closed = g->run_closed ? (uint64_t *)g->run_closed + (size_t)start * W : NULL;
    /* (a closed run start has already, its closure's from Python, is kept when its own
       search finds none) */
    const int had_closed = closed && any_word(closed, W);
    int32_t n = llama_cffi_gengine_run(e, start, g->class_weight, g->run_cap, g->max_run_stacks, chain, rw,
                                       had_closed ? NULL : closed, W);
    if (n < 0) return LLAMA_CFFI_GENGINE_WALK_ERR + n;
    ((int32_t *)g->run_len)[start] = n - 1;
    ((uint8_t *)g->run_known)[start] = 1;
    /* tmpl's plan serves when the run is its run, as long, through distinct states for its
       first chain_max + 1 (a bounded string's position: no wider chain) */
    if (n != k + 1 || memcmp(rw, tmpl->run, sizeof(uint64_t) * (size_t)W)) return 1;
    for (int32_t i = 1; i <= chain_max && i < n; i++)
        for (int32_t j = 0; j < i; j++)
            if (chain[i] == chain[j]) return 1;
    for (int32_t i = 0; i < n; i++)
        if (chain[i] < 0 || chain[i] >= n_states_of(g)) return -1;
    /* the tokens besides the walk's */
    int32_t n_extra = 0;
    int32_t complete = llama_cffi_gengine_complete(e, start);
    if (complete < 0) return -1;
    if (complete) {
        if (n_eog > extra_cap) return -1;
        for (int32_t i = 0; i < n_eog; i++) extra[n_extra++] = eog[i];
    }
    int32_t at = -1; /* the state whose partial-character answers ok holds */
    const uint8_t *ok = NULL;
    for (int32_t i = 0; i < n_pt; i++) {
        const int32_t tok = pt[i], d = pt_depth[i];
        if (tok < 0 || tok >= t->n_vocab || d < 0 || d >= n) return -1;
        const int32_t slot = t->pchar_slot[tok];
        if (slot < 0 || slot >= t->n_pchars) return -1;
        const int32_t s = chain[d];
        if (s != at) {
            if (s < g->n_pchar_states && g->pchar_ok && g->pchar_known) {
                uint8_t *row = (uint8_t *)g->pchar_ok + (size_t)s * (size_t)t->n_pchars;
                if (!g->pchar_known[s]) {
                    int rc = llama_cffi_gengine_pchar_ok(e, s, pchars, t->n_pchars, row);
                    if (rc < 0) return LLAMA_CFFI_GENGINE_WALK_ERR + rc;
                    ((uint8_t *)g->pchar_known)[s] = 1;
                }
                ok = row;
            } else {
                int rc = llama_cffi_gengine_pchar_ok(e, s, pchars, t->n_pchars, pchar_buf);
                if (rc < 0) return LLAMA_CFFI_GENGINE_WALK_ERR + rc;
                ok = pchar_buf;
            }
            at = s;
        }
        if (ok[slot]) {
            if (n_extra >= extra_cap) return -1;
            extra[n_extra++] = tok;
        }
    }
    *out = *tmpl;
    out->start = start;
    out->depth_states = chain;
    out->extra = extra;
    out->n_extra = n_extra;
    return llama_cffi_trie_mask(t, g, out, mask, pending, pending_cap, n_pending, frames, frames_cap);
}

int llama_cffi_trie_first_mask(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, int32_t start,
                               int32_t root_plan_max, int64_t root_plan_tokens, int64_t heavy_min,
                               int32_t derive_share, const int32_t *eog, int32_t n_eog, const int64_t *pchars,
                               uint32_t *mask, int32_t *pending, int32_t pending_cap, int32_t *n_pending,
                               int32_t *frames, int32_t frames_cap) {
    if (!t || !g || !g->engine || !g->class_weight || !g->run_chain || !g->root_nodes || !g->root_start || !mask ||
        !pending || !n_pending || !frames || (n_eog && !eog) || (t->n_pchars && !pchars) || n_eog < 0 ||
        !t->below_asc || !t->below_flags || !t->nodes || !t->row_tok || !g->asc_table || !g->na_classes)
        return -1;
    llama_cffi_gengine *e = (llama_cffi_gengine *)g->engine;
    const int32_t W = g->W, nc_ = g->n_classes, n_nodes = t->n_nodes;
    const int32_t depth_cap = frames_cap / 3;
    if (depth_cap < t->max_depth + 2) return -1;
    if (start < 0 || start >= n_states_of(g)) return -1;
    *n_pending = 0;
    /* the run of start: a plan pays when it starts many tokens */
    if (start >= g->n_run_states || start >= g->n_pchar_states) return 1;
    if (!g->run_known[start]) {
        int rc = compute_run(g, start);
        if (rc) return rc;
    }
    const uint64_t *run = g->run_words + (size_t)start * W;
    int64_t starts = 0;
    for (int32_t c = 0; c < nc_; c++) {
        if (!in_set(run, c)) continue;
        int32_t a, b;
        if (root_group(t, g, c, &a, &b)) return -1;
        starts += b - a;
    }
    if (heavy_min >= 0) {
        /* the root's children of the classes start takes, and the successor on the class
           holding the most of them: heavy unless that is start itself (a run of
           self-loops, which its plan's scan serves) */
        int64_t live = 0, most = -1;
        int32_t to_most = -1, c_most = -1;
        for (int32_t c = 0; c < nc_; c++) {
            int32_t a, b, s;
            int rc = root_class_step(t, g, start, c, &a, &b, &s);
            if (rc) return rc;
            if (s < 0) continue;
            live += b - a;
            if (b - a > most) {
                most = b - a;
                to_most = s;
                c_most = c;
            }
        }
        if (live >= heavy_min && to_most != start) {
            /* a derivation takes the mask of to_most where the two agree; when to_most moves
               on again on the heaviest class (a bounded string's next position) and that
               class holds over 1/derive_share of the live root children, they differ on too
               much: not heavy, no round trip */
            if (derive_share > 0 && most * derive_share > live) {
                int32_t a2, b2, s2;
                int rc = root_class_step(t, g, to_most, c_most, &a2, &b2, &s2);
                if (rc) return rc;
                if (s2 == to_most) return 2;
            } else {
                return 2;
            }
        }
    }
    if (starts > root_plan_max) return 1;
    if (root_plan_tokens >= 0 && g->run_len[start] >= 4) {
        /* few first characters, but a long run over them (a letters loop): the tokens
           whose first two characters are of the run, which a walk from the root would
           descend one by one (two: a run such as hex digits starts many tokens that
           leave it at once) */
        int64_t toks = 0;
        for (int32_t c = 0; c < nc_ && toks <= root_plan_tokens; c++) {
            if (!in_set(run, c)) continue;
            int32_t a, b;
            if (root_group(t, g, c, &a, &b)) return -1;
            for (int32_t i = a; i < b; i++) {
                int32_t node = g->root_nodes[i];
                if (node < 0 || node >= n_nodes) return -1;
                int32_t fc = t->nodes[node].first_child, ncld = t->nodes[node].n_child;
                if (ncld < 0 || fc < 0 || (int64_t)fc + ncld > n_nodes) return -1;
                for (int32_t j = fc; j < fc + ncld; j++) {
                    int32_t cj = node_cls(t, g, j);
                    if (cj >= 0 && in_set(run, cj)) toks += (int64_t)t->nodes[j].row_end - t->nodes[j].row_start;
                }
            }
        }
        if (toks > root_plan_tokens) return 1;
    }
    /* the tokens besides the walk's: end-of-generation when start is complete, and the
       tokens that are only a partial character that start can complete */
    memset(mask, 0, sizeof(uint32_t) * (((size_t)t->n_vocab + 31) / 32));
    int32_t complete = llama_cffi_gengine_complete(e, start);
    if (complete < 0) return -1;
    if (complete)
        for (int32_t i = 0; i < n_eog; i++) {
            if (eog[i] < 0 || eog[i] >= t->n_vocab) return -1;
            SET_BIT(mask, eog[i]);
        }
    if (t->n_root_pt) {
        uint8_t *ok = (uint8_t *)g->pchar_ok + (size_t)start * (size_t)t->n_pchars;
        if (!g->pchar_known[start]) {
            int rc = llama_cffi_gengine_pchar_ok(e, start, pchars, t->n_pchars, ok);
            if (rc < 0) return LLAMA_CFFI_GENGINE_WALK_ERR + rc;
            ((uint8_t *)g->pchar_known)[start] = 1;
        }
        for (int32_t i = 0; i < t->n_root_pt; i++) {
            int32_t tok = t->root_pt[i];
            if (tok < 0 || tok >= t->n_vocab) return -1;
            int32_t slot = t->pchar_slot[tok];
            if (slot < 0 || slot >= t->n_pchars) return -1;
            if (ok[slot]) SET_BIT(mask, tok);
        }
    }
    /* the walk from the root, a class at a time through the root groups */
    int32_t *f_node = frames, *f_state = frames + depth_cap, *f_next = frames + 2 * depth_cap;
    run_sums sums;
    run_sums_init(&sums);
    for (int32_t c = 0; c < nc_; c++) {
        int32_t a, b, s;
        int rc = root_class_step(t, g, start, c, &a, &b, &s);
        if (rc) return rc;
        if (s < 0) continue;
        if (s >= n_states_of(g)) return -1;
        for (int32_t i = a; i < b; i++) {
            int32_t node = g->root_nodes[i];
            if (node < 0 || node >= n_nodes || node_cls(t, g, node) != c) return -1;
            int rc = descend(t, g, node, start, s, 0, mask, pending, pending_cap, n_pending, f_node, f_state, f_next,
                             depth_cap, &sums, NULL);
            if (rc < 0) return rc;
        }
    }
    return 0;
}

int llama_cffi_trie_run_scan_skip(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, const uint64_t *runs,
                                  int32_t n_runs, int32_t k, uint32_t *mask, int32_t *frontier, int32_t frontier_cap,
                                  int32_t *n_frontier, int32_t *group_start, int32_t *pt_tokens, int32_t *pt_depth,
                                  int32_t pt_cap, int32_t *n_pt, int32_t *scratch, uint8_t *on_out,
                                  int32_t *absorbed, int32_t absorbed_cap, int32_t *n_absorbed) {
    if ((on_out || absorbed) && (!on_out || !absorbed || !n_absorbed || absorbed_cap < 0 || n_runs != 1)) return -1;
    if (n_absorbed) *n_absorbed = 0;
    if (!t || !g || !runs || !mask || !frontier || !n_frontier || !group_start || !pt_tokens || !pt_depth || !n_pt ||
        !scratch || k < 0 || k > t->max_depth + 1 || n_runs < 1 || n_runs > t->max_depth + 2)
        return -1;
    const int32_t n_nodes = t->n_nodes, n_vocab = t->n_vocab, nc = g->n_classes;
    const int64_t n_groups = (int64_t)(k + 1) * nc;
    if (!t->below_asc || !t->below_flags || !t->nodes || !t->row_tok || !g->asc_table || !g->na_classes) return -1;
    if (n_groups >= (int64_t)1 << 30 || frontier_cap < n_nodes) return -1;
    const llama_cffi_tnode *const nodes = t->nodes;
    const int32_t *const row_tok = t->row_tok;
    int32_t nf = 0, np_ = 0;
    for (int32_t i = 0; i < t->n_root_pt; i++) {
        if (np_ >= pt_cap) return -3;
        pt_depth[np_] = 0;
        pt_tokens[np_++] = t->root_pt[i];
    }
    /* depth first over the run's paths, as llama_cffi_trie_run_scan, but a node whose
       whole subtree is made of the run's classes and ends within k characters has its
       tokens set at once (rows row_start .. row_end: no token below it ends inside a
       character, its below_flags say so) and is not descended into */
    /* the root's children on the run: its classes' root groups (the others are implicit,
       not listed: see llama_cffi.h) */
    if (!g->root_nodes || !g->root_start) return -1;
    const int32_t nroot = nodes[n_nodes].n_child;
    const int32_t depth_cap = t->max_depth + 2;
    /* the classes of character d: runs[min(d, n_runs - 1)]; a subtree whose characters
       start at index d is taken whole when they are all of the classes every run from d
       on holds (sums[min(d, n_runs - 1)]: those classes in the terms of the trie's
       below_asc and below_flags) */
    const uint64_t *const last = runs + (size_t)(n_runs - 1) * (size_t)g->W;
    uint64_t *sums = (uint64_t *)malloc(sizeof(uint64_t) * (3 * (size_t)n_runs + (size_t)g->W));
    if (!sums) return -2;
    {
        uint64_t *inter = sums + 3 * (size_t)n_runs;
        memcpy(inter, last, sizeof(uint64_t) * (size_t)g->W);
        for (int32_t j = n_runs - 1; j >= 0; j--) {
            for (int32_t w = 0; w < g->W; w++) inter[w] &= runs[(size_t)j * (size_t)g->W + (size_t)w];
            run_summary(g, inter, sums + 3 * (size_t)j);
        }
    }
    int32_t *fr_node = (int32_t *)malloc(sizeof(int32_t) * (2 * (size_t)depth_cap + (size_t)nroot + 1));
    if (!fr_node) {
        free(sums);
        return -2;
    }
    int32_t *fr_next = fr_node + depth_cap, *on_root = fr_node + 2 * depth_cap;
    int32_t n_on_root = 0;
    int rc = 0;
    if (k > 0)
        for (int32_t c = 0; c < nc; c++) {
            if (!in_set(runs, c)) continue;
            int32_t a, b;
            if (root_group(t, g, c, &a, &b) || n_on_root + (b - a) > nroot) { rc = -1; goto done; }
            memcpy(on_root + n_on_root, g->root_nodes + a, sizeof(int32_t) * (size_t)(b - a));
            n_on_root += b - a;
        }
    int32_t d = 0; /* the depth of fr_node[d] */
    fr_node[0] = n_nodes;
    fr_next[0] = 0;
    while (d >= 0) {
        const int32_t node = fr_node[d];
        const int32_t fc = nodes[node].first_child, ncld = d == 0 ? n_on_root : nodes[node].n_child;
        if (fc < 0 || ncld < 0 || (d > 0 && fc + ncld > n_nodes)) { rc = -1; break; }
        int32_t j = fr_next[d];
        int pushed = 0;
        while (j < ncld) {
            const int32_t ch = d == 0 ? on_root[j] : fc + j;
            j++;
            if ((uint32_t)ch >= (uint32_t)n_nodes) { rc = -1; goto done; }
            const int32_t c = node_cls(t, g, ch);
            if ((uint32_t)c >= (uint32_t)nc) { rc = -1; goto done; }
            if (d >= k || !in_set(d < n_runs ? runs + (size_t)d * (size_t)g->W : last, c)) {
                scratch[2 * (size_t)nf] = ch;
                scratch[2 * (size_t)nf + 1] = d * nc + c;
                nf++;
                continue;
            }
            /* on the run's path, d + 1 characters deep */
            const llama_cffi_tnode *const nd = nodes + ch;
            const int32_t rs = nd->row_start;
            if (d + 1 + nd->height <= k && covered(t, ch, sums + 3 * (size_t)(d + 1 < n_runs ? d + 1 : n_runs - 1))) {
                const int32_t re = nd->row_end;
                if (rs < 0 || re < rs || re > n_vocab) { rc = -1; goto done; }
                if (absorbed) { /* (node, level): its subtree is on the run's paths, unvisited */
                    if (*n_absorbed >= absorbed_cap) { rc = -3; goto done; }
                    absorbed[2 * (size_t)*n_absorbed] = ch;
                    absorbed[2 * (size_t)*n_absorbed + 1] = d;
                    (*n_absorbed)++;
                }
                for (int32_t r = rs; r < re; r++) {
                    const int32_t tok = row_tok[2 * (size_t)r];
                    if ((uint32_t)tok >= (uint32_t)n_vocab) { rc = -1; goto done; }
                    SET_BIT(mask, tok);
                }
                continue;
            }
            const int32_t nt = nd->n_term;
            if (rs < 0 || nt < 0 || rs + nt > n_vocab) { rc = -1; goto done; }
            for (int32_t r = rs; r < rs + nt; r++) {
                const int32_t tok = row_tok[2 * (size_t)r];
                if ((uint32_t)tok >= (uint32_t)n_vocab) { rc = -1; goto done; }
                if (row_tok[2 * (size_t)r + 1] < 0) SET_BIT(mask, tok);
                else {
                    if (np_ >= pt_cap) { rc = -3; goto done; }
                    pt_depth[np_] = d + 1;
                    pt_tokens[np_++] = tok;
                }
            }
            if (d + 1 >= depth_cap) { rc = -1; goto done; }
            if (on_out) on_out[ch] = 1; /* visited on the run's paths */
            fr_next[d] = j;
            d++;
            fr_node[d] = ch;
            fr_next[d] = 0;
            pushed = 1;
            break;
        }
        if (!pushed) d--;
    }
done:
    free(fr_node);
    free(sums);
    if (rc) return rc;
    group_sort(scratch, nf, n_groups, frontier, group_start);
    *n_frontier = nf;
    *n_pt = np_;
    return 0;
}

int llama_cffi_trie_run_scan_extend(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, const uint64_t *run,
                                    const uint8_t *base_key, int32_t key_len, const int32_t *base_nodes,
                                    const int32_t *base_depths, int32_t n_base, const int32_t *base_pt,
                                    const int32_t *base_pt_depth, int32_t n_base_pt, uint32_t *mask, int32_t *nodes,
                                    int32_t *depths, int32_t cap, int32_t *n_nodes_out, int32_t *pt_tokens,
                                    int32_t *pt_depth, int32_t pt_cap, int32_t *n_pt) {
    if (!t || !g || !t->nodes || !t->row_tok || !run || !base_key || !mask || !n_nodes_out || !n_pt || n_base < 0 ||
        n_base_pt < 0 || (n_base && (!base_nodes || !base_depths)) || (n_base_pt && (!base_pt || !base_pt_depth)) ||
        !nodes || !depths || !pt_tokens || !pt_depth || !g->asc_table || !g->na_classes || !g->root_nodes ||
        !g->root_start || key_len != (g->n_cps + 7) / 8 + 1)
        return -1;
    const int32_t n_nodes = t->n_nodes, n_vocab = t->n_vocab, nc = g->n_classes, k = t->max_depth + 1;
    const llama_cffi_tnode *const tn = t->nodes;
    const int32_t *const row_tok = t->row_tok;
    const int32_t depth_cap = t->max_depth + 2;
    uint64_t sum[3];
    run_summary(g, run, sum);
    int32_t nf = 0, np_ = 0;
    if (n_base_pt > pt_cap) return -3;
    for (int32_t i = 0; i < n_base_pt; i++) {
        if ((uint32_t)base_pt[i] >= (uint32_t)n_vocab || base_pt_depth[i] < 0 || base_pt_depth[i] > k) return -1;
        pt_tokens[np_] = base_pt[i];
        pt_depth[np_++] = base_pt_depth[i];
    }
    int32_t *fr_node = (int32_t *)malloc(sizeof(int32_t) * 3 * (size_t)depth_cap);
    if (!fr_node) return -2;
    int32_t *fr_next = fr_node + depth_cap, *fr_depth = fr_node + 2 * depth_cap;
    int rc = 0;
    /* the seeds: the base's frontier nodes on the run (the base stops there, the run goes
       on), then the root's children on the run that the base does not hold */
    const int32_t nroot = tn[n_nodes].n_child;
    for (int32_t i = 0; i < n_base + nroot && !rc; i++) {
        int32_t seed, d;
        if (i < n_base) {
            seed = base_nodes[i];
            d = base_depths[i];
            if ((uint32_t)seed >= (uint32_t)n_nodes || d < 0 || d > k) { rc = -1; break; }
            /* (node_cpi, not the records: 16 nodes a cache line, and most of a large base's
               frontier is only read here) */
            const uint32_t cpi = (uint32_t)t->node_cpi[seed];
            const int32_t c = cpi < (uint32_t)g->n_cps ? g->cls_of_cpi[cpi] : -1;
            if ((uint32_t)c >= (uint32_t)nc) { rc = -1; break; }
            if (d >= k || !in_set(run, c)) { /* it leaves the run too: still the frontier */
                if (nf >= cap) { rc = -3; break; }
                nodes[nf] = seed;
                depths[nf++] = d;
                continue;
            }
        } else {
            seed = tn[n_nodes].first_child + (i - n_base);
            d = 0;
            if ((uint32_t)seed >= (uint32_t)n_nodes) { rc = -1; break; }
            const uint32_t cpi = (uint32_t)t->node_cpi[seed]; /* (as above: Gemma 3's root has 19,244 children) */
            if (cpi >= (uint32_t)g->n_cps) { rc = -1; break; }
            if ((base_key[cpi >> 3] >> (cpi & 7)) & 1u) continue; /* the base's own path */
            const int32_t c = g->cls_of_cpi[cpi];
            if ((uint32_t)c >= (uint32_t)nc) { rc = -1; break; }
            if (!in_set(run, c)) continue; /* (the root's children off the run: implicit) */
        }
        /* seed is on the run's paths, d + 1 characters deep: as llama_cffi_trie_run_scan_skip
           from there, depth first */
        int32_t top = 0;
        fr_node[0] = seed;
        fr_depth[0] = d;
        fr_next[0] = -1; /* -1: the node itself not taken yet */
        while (top >= 0 && !rc) {
            const int32_t node = fr_node[top], dd = fr_depth[top];
            const llama_cffi_tnode *const nd = tn + node;
            if (fr_next[top] < 0) {
                const int32_t rs = nd->row_start, re = nd->row_end, nt = nd->n_term;
                if (rs < 0 || re < rs || re > n_vocab || nt < 0 || rs + nt > n_vocab) { rc = -1; break; }
                if (dd + 1 + nd->height <= k && covered(t, node, sum)) { /* wholly of the run: all its tokens */
                    for (int32_t r = rs; r < re; r++) {
                        const int32_t tok = row_tok[2 * (size_t)r];
                        if ((uint32_t)tok >= (uint32_t)n_vocab) { rc = -1; break; }
                        SET_BIT(mask, tok);
                    }
                    top--;
                    continue;
                }
                for (int32_t r = rs; r < rs + nt && !rc; r++) {
                    const int32_t tok = row_tok[2 * (size_t)r];
                    if ((uint32_t)tok >= (uint32_t)n_vocab) { rc = -1; break; }
                    if (row_tok[2 * (size_t)r + 1] < 0) SET_BIT(mask, tok);
                    else {
                        if (np_ >= pt_cap) { rc = -3; break; }
                        pt_depth[np_] = dd + 1;
                        pt_tokens[np_++] = tok;
                    }
                }
                fr_next[top] = 0;
                continue;
            }
            const int32_t fc = nd->first_child, ncld = nd->n_child;
            if (fc < 0 || ncld < 0 || fc + ncld > n_nodes) { rc = -1; break; }
            int pushed = 0;
            while (fr_next[top] < ncld) {
                const int32_t ch = fc + fr_next[top]++;
                const int32_t c = node_cls(t, g, ch);
                if ((uint32_t)c >= (uint32_t)nc) { rc = -1; break; }
                if (dd + 1 >= k || !in_set(run, c)) {
                    if (nf >= cap) { rc = -3; break; }
                    nodes[nf] = ch;
                    depths[nf++] = dd + 1;
                    continue;
                }
                if (top + 1 >= depth_cap) { rc = -1; break; }
                top++;
                fr_node[top] = ch;
                fr_depth[top] = dd + 1;
                fr_next[top] = -1;
                pushed = 1;
                break;
            }
            if (!pushed && !rc) top--;
        }
    }
    free(fr_node);
    if (rc) return rc;
    *n_nodes_out = nf;
    *n_pt = np_;
    return 0;
}

int llama_cffi_trie_run_derive(const llama_cffi_trie *t, const int32_t *cls, int32_t n_classes, const uint64_t *run,
                               int32_t k, const uint8_t *on, const int32_t *base_frontier, int32_t n_base,
                               const int32_t *base_group_start, int32_t base_k, int32_t *frontier,
                               int32_t frontier_cap, int32_t *n_frontier, int32_t *group_start) {
    if (!t || !cls || !run || !on || !base_frontier || !base_group_start || !frontier || !n_frontier ||
        !group_start || k < 0 || k >= base_k || base_k > t->max_depth + 1 || n_classes < 0)
        return -1;
    const int32_t nc = n_classes, n_nodes = t->n_nodes;
    /* groups of parents shallower than k: the base scan's */
    int32_t upto = base_group_start[(int64_t)k * nc];
    if (upto < 0 || upto > n_base || upto > frontier_cap) return -1;
    memcpy(frontier, base_frontier, sizeof(int32_t) * (size_t)upto);
    for (int64_t g = 0; g <= (int64_t)k * nc; g++) group_start[g] = base_group_start[g];
    /* parents k deep: a class off the run, as in the base scan; a class of the run, the
       nodes the base scan went on through (level k, on its paths) */
    int32_t n = upto;
    int32_t lo = 0, hi = 0;
    if (k < t->max_depth) {
        lo = t->level_base[k];
        hi = t->level_base[k + 1];
        if (lo < 0 || hi < lo || hi > n_nodes) return -1;
    }
    for (int32_t c = 0; c < nc; c++) {
        int64_t g = (int64_t)k * nc + c;
        group_start[g] = n;
        if (!in_set(run, c)) {
            int32_t a = base_group_start[g], b = base_group_start[g + 1];
            if (a < 0 || b < a || b > n_base || n + (b - a) > frontier_cap) return -1;
            memcpy(frontier + n, base_frontier + a, sizeof(int32_t) * (size_t)(b - a));
            n += b - a;
        } else if (k > 0) { /* (at depth 0 with k = 0, every root child is implicit) */
            for (int32_t x = lo; x < hi; x++) {
                if (!on[x] || cls[x] != c) continue;
                if (n >= frontier_cap) return -3;
                frontier[n++] = x;
            }
        }
    }
    group_start[(int64_t)(k + 1) * nc] = n;
    *n_frontier = n;
    return 0;
}

/* The block of nodes that absorbed pairs i, i + 1, ... make together: subtree roots of one
   level next to each other (a scan lists siblings it took whole in order), which the
   callers walk down level by level as one contiguous block instead of one by one (a
   letters run: ~8,600 pairs in ~2,500 blocks). Pair i (node a at level lvl) is checked by
   the caller; a pair joins only when it is the next node of the same level. Advances *i
   past the block; returns its end (exclusive). */
static int32_t absorbed_block(const int32_t *absorbed, int32_t n_absorbed, int32_t *i, int32_t a, int32_t lvl,
                              const int32_t *lb) {
    int32_t j = *i + 1, end = a + 1;
    while (j < n_absorbed && absorbed[2 * (size_t)j] == end && absorbed[2 * (size_t)j + 1] == lvl &&
           end < lb[lvl + 1]) {
        end++;
        j++;
    }
    *i = j;
    return end;
}

int llama_cffi_trie_run_derive_skip(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, const uint64_t *run,
                                    int32_t k, const uint8_t *on, const int32_t *absorbed, int32_t n_absorbed,
                                    const int32_t *base_frontier, int32_t n_base, const int32_t *base_group_start,
                                    int32_t base_k, int32_t *frontier, int32_t frontier_cap, int32_t *n_frontier,
                                    int32_t *group_start) {
    if (!t || !g || !t->nodes || !run || !on || (n_absorbed && !absorbed) || n_absorbed < 0 || !base_frontier ||
        !base_group_start || !frontier || !n_frontier || !group_start || k < 0 || k >= base_k ||
        base_k > t->max_depth + 1)
        return -1;
    const int32_t nc = g->n_classes, n_nodes = t->n_nodes;
    const int32_t *const lb = t->level_base;
    /* groups of parents shallower than k: the base scan's */
    int32_t upto = base_group_start[(int64_t)k * nc];
    if (upto < 0 || upto > n_base || upto > frontier_cap) return -1;
    memcpy(frontier, base_frontier, sizeof(int32_t) * (size_t)upto);
    for (int64_t gi = 0; gi <= (int64_t)k * nc; gi++) group_start[gi] = base_group_start[gi];
    /* the run's nodes of level k (those a parent k deep reaches on the run): visited by the
       base scan (on), or inside a subtree it took whole (absorbed: node, level), found by
       going down its contiguous blocks of nodes level by level */
    int32_t *level_nodes = NULL;
    int32_t n_level = 0;
    if (k > 0 && k < t->max_depth) {
        const int32_t lo = lb[k], hi = lb[k + 1];
        if (lo < 0 || hi < lo || hi > n_nodes) return -1;
        level_nodes = (int32_t *)malloc(sizeof(int32_t) * ((size_t)(hi - lo) + 1));
        if (!level_nodes) return -2;
        for (int32_t x = lo; x < hi; x++)
            if (on[x]) level_nodes[n_level++] = x;
        for (int32_t i = 0; i < n_absorbed;) {
            int32_t a = absorbed[2 * (size_t)i], lvl = absorbed[2 * (size_t)i + 1];
            if (a < 0 || a >= n_nodes || lvl < 0 || lvl >= t->max_depth || a < lb[lvl] || a >= lb[lvl + 1]) {
                free(level_nodes);
                return -1;
            }
            int32_t blo = a, bhi = absorbed_block(absorbed, n_absorbed, &i, a, lvl, lb);
            if (lvl > k) continue;
            for (int32_t j = lvl; j < k && blo < bhi; j++) { /* the block's children: the next level's block */
                int32_t f = blo, l = bhi - 1;
                while (f < bhi && t->n_child[f] == 0) f++;
                while (l >= f && t->n_child[l] == 0) l--;
                if (f > l) {
                    blo = bhi = 0;
                    break;
                }
                blo = t->first_child[f];
                bhi = t->first_child[l] + t->n_child[l];
                if (blo < lb[j + 1] || bhi > lb[j + 2 <= t->max_depth ? j + 2 : t->max_depth] || bhi < blo) {
                    free(level_nodes);
                    return -1;
                }
            }
            if (bhi - blo + n_level > hi - lo) { /* more than the level holds: bad data */
                free(level_nodes);
                return -1;
            }
            for (int32_t x = blo; x < bhi; x++) level_nodes[n_level++] = x;
        }
    }
    /* groups of parents k deep: a class off the run, the base's nodes; a class of the run,
       its nodes of level k (counting sort by class) */
    int32_t n = upto;
    int32_t *count = (int32_t *)calloc((size_t)nc + 1, sizeof(int32_t));
    if (!count) {
        free(level_nodes);
        return -2;
    }
    int rc = 0;
    for (int32_t i = 0; i < n_level; i++) {
        int32_t c = node_cls(t, g, level_nodes[i]);
        if (c < 0 || c >= nc || !in_set(run, c)) { rc = -1; goto out; }
        count[c]++;
    }
    for (int32_t c = 0; c < nc; c++) {
        int64_t gi = (int64_t)k * nc + c;
        group_start[gi] = n;
        if (!in_set(run, c)) {
            int32_t a = base_group_start[gi], b = base_group_start[gi + 1];
            if (a < 0 || b < a || b > n_base || n + (b - a) > frontier_cap) { rc = -1; goto out; }
            memcpy(frontier + n, base_frontier + a, sizeof(int32_t) * (size_t)(b - a));
            n += b - a;
        } else {
            if (n + count[c] > frontier_cap) { rc = -3; goto out; }
            int32_t here = count[c];
            count[c] = n; /* from now on: where class c's next node goes */
            n += here;
        }
    }
    group_start[(int64_t)(k + 1) * nc] = n;
    for (int32_t i = 0; i < n_level; i++) frontier[count[node_cls(t, g, level_nodes[i])]++] = level_nodes[i];
    *n_frontier = n;
out:
    free(count);
    free(level_nodes);
    return rc;
}

int llama_cffi_trie_densify_on(const llama_cffi_trie *t, uint8_t *on, const int32_t *absorbed, int32_t n_absorbed) {
    if (!t || !on || n_absorbed < 0 || (n_absorbed && !absorbed)) return -1;
    const int32_t n_nodes = t->n_nodes, max_depth = t->max_depth;
    const int32_t *lb = t->level_base;
    for (int32_t i = 0; i < n_absorbed;) {
        int32_t a = absorbed[2 * (size_t)i], lvl = absorbed[2 * (size_t)i + 1];
        if (a < 0 || a >= n_nodes || lvl < 0 || lvl >= max_depth || a < lb[lvl] || a >= lb[lvl + 1]) return -1;
        int32_t blo = a, bhi = absorbed_block(absorbed, n_absorbed, &i, a, lvl, lb);
        for (int32_t j = lvl; blo < bhi; j++) { /* the block, then its children: the next level's block */
            memset(on + blo, 1, (size_t)(bhi - blo));
            if (j + 1 >= max_depth) break;
            int32_t f = blo, l = bhi - 1;
            while (f < bhi && t->n_child[f] == 0) f++;
            while (l >= f && t->n_child[l] == 0) l--;
            if (f > l) break;
            int32_t nlo = t->first_child[f], nhi = t->first_child[l] + t->n_child[l];
            if (nlo < lb[j + 1] || nhi > lb[j + 2] || nhi < nlo) return -1;
            blo = nlo;
            bhi = nhi;
        }
    }
    return 0;
}

int llama_cffi_trie_group(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, const int32_t *nodes,
                          const int32_t *depths, int32_t n, int32_t k, int32_t *frontier, int32_t *group_start) {
    if (!t || !g || !t->nodes || n < 0 || (n && (!nodes || !depths || !frontier)) || !group_start || k < 0 ||
        k > t->max_depth + 1)
        return -1;
    const int32_t nc = g->n_classes;
    const int64_t n_groups = (int64_t)(k + 1) * nc;
    if (nc <= 0 || n_groups >= (int64_t)1 << 30) return -1;
    int32_t *pairs = (int32_t *)malloc(sizeof(int32_t) * (2 * (size_t)n + 1));
    if (!pairs) return -2;
    for (int32_t i = 0; i < n; i++) {
        int32_t node = nodes[i], d = depths[i];
        if (node < 0 || node >= t->n_nodes || d < 0 || d > k) {
            free(pairs);
            return -1;
        }
        int32_t c = node_cls(t, g, node);
        if (c < 0 || c >= nc) {
            free(pairs);
            return -1;
        }
        pairs[2 * (size_t)i] = node;
        pairs[2 * (size_t)i + 1] = d * nc + c;
    }
    group_sort(pairs, n, n_groups, frontier, group_start);
    free(pairs);
    return 0;
}

int32_t llama_cffi_mask_logits(int32_t n, float *logits, const int32_t *ids, const uint32_t *words, int32_t n_vocab) {
    if (n < 0 || (n && (!logits || !words)) || n_vocab < 0 || (!ids && n > n_vocab)) return -1;
    int32_t banned = 0;
    const float ninf = -__builtin_inff();
    if (!ids) {
        for (int32_t i = 0; i < n; i++) {
            if (!((words[(uint32_t)i >> 5] >> ((uint32_t)i & 31u)) & 1u)) {
                logits[i] = ninf;
                banned++;
            }
        }
        return banned;
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t t = ids[i];
        if (t < 0 || t >= n_vocab) return -1;
        if (!((words[(uint32_t)t >> 5] >> ((uint32_t)t & 31u)) & 1u)) {
            logits[i] = ninf;
            banned++;
        }
    }
    return banned;
}

/* ------------------------------------------------------------------ many masks at once */


#define TW_MAX_THREADS 64

typedef struct {
    const llama_cffi_trie *t;
    const llama_cffi_trie_job *const *jobs;
    uint32_t *masks;
    int64_t stride;
    const int32_t *rows;
    int32_t *pending;
    int32_t pending_cap;
    int32_t *n_pending;
    int32_t *frames;
    int32_t frames_cap;
    int32_t *rcs;
    const int32_t *order; /* NULL, or the jobs in the order they are handed out */
    int32_t n;
    int32_t next; /* atomic */
} tw_batch;

static int tw_key_cmp(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* take masks until none is left (on any thread of the pool) */
static void tw_task(void *arg, int worker) {
    tw_batch *b = (tw_batch *)arg;
    (void)worker;
    for (;;) {
        int32_t i = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
        if (i >= b->n) return;
        if (b->order) i = b->order[i];
        b->n_pending[i] = 0;
        llama_cffi_trie_grammar g = *b->jobs[i]->g;
        g.engine = NULL; /* the threads share engines: transitions not computed yet stay pending */
        b->rcs[i] = llama_cffi_trie_mask(b->t, &g, b->jobs[i]->p, b->masks + (size_t)b->rows[i] * (size_t)b->stride,
                                         b->pending + (size_t)i * 4 * (size_t)b->pending_cap, b->pending_cap,
                                         &b->n_pending[i], b->frames + (size_t)i * (size_t)b->frames_cap,
                                         b->frames_cap);
    }
}

int llama_cffi_trie_masks(const llama_cffi_trie *t, int32_t n, const llama_cffi_trie_job *const *jobs, uint32_t *masks,
                          int64_t stride, int32_t n_rows, const int32_t *rows, int32_t *pending, int32_t pending_cap,
                          int32_t *n_pending, int32_t *frames, int32_t frames_cap, int32_t *rcs, int32_t n_threads) {
    if (!t || n < 0 || (n && (!jobs || !masks || !rows || !pending || !n_pending || !frames || !rcs)) ||
        pending_cap < 1 || frames_cap < 3 * (t->max_depth + 2) || stride < ((int64_t)t->n_vocab + 31) / 32 ||
        n_rows < 0)
        return -1;
    for (int32_t i = 0; i < n; i++)
        if (!jobs[i] || !jobs[i]->g || !jobs[i]->p || rows[i] < 0 || rows[i] >= n_rows) return -1;
    if (n == 0) return 0;
    if (n_threads > TW_MAX_THREADS) n_threads = TW_MAX_THREADS;
    if (n_threads > n) n_threads = n;
    /* shared among threads: the walks of most frontier nodes first (the longest ones, as
       far as the plan tells), so that one long walk does not start last and run alone */
    int64_t *keys = n_threads > 1 ? (int64_t *)malloc((sizeof(int64_t) + sizeof(int32_t)) * (size_t)n) : NULL;
    int32_t *order = keys ? (int32_t *)(keys + n) : NULL;
    if (keys) {
        for (int32_t i = 0; i < n; i++) {
            const int64_t f = jobs[i]->p->n_frontier < 0 ? 0 : jobs[i]->p->n_frontier;
            keys[i] = ((INT64_C(0x7fffffff) - f) << 32) | i; /* most frontier first, then by job */
        }
        qsort(keys, (size_t)n, sizeof(int64_t), tw_key_cmp);
        for (int32_t i = 0; i < n; i++) order[i] = (int32_t)(keys[i] & 0x7fffffff);
    }
    tw_batch b = {t, jobs, masks, stride, rows, pending, pending_cap, n_pending, frames, frames_cap, rcs, order, n, 0};
    llama_cffi_pool_run(n_threads - 1, tw_task, &b); /* the process's pool (pool.c) */
    free(keys);
    int32_t redo = 0;
    for (int32_t i = 0; i < n; i++) redo += rcs[i] != 0 || n_pending[i] != 0;
    return redo;
}

/* ------------------------------------------------------------------ one token's check */

int llama_cffi_trie_tokens_allowed(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g,
                                   const int32_t *token_node, int32_t n, const int32_t *states, const int32_t *tokens,
                                   int8_t *out) {
    if (!t || !g || !token_node || n < 0 || (n && (!states || !tokens || !out)) || !g->trans || !g->cls_of_cpi)
        return -1;
    enum { CAP = 256 }; /* the code points of a longer token are left to the caller */
    int32_t path[CAP];
    const int32_t nc = g->n_classes;
    for (int32_t i = 0; i < n; i++) {
        const int32_t tok = tokens[i];
        int32_t s = states[i];
        out[i] = -1;
        if ((uint32_t)tok >= (uint32_t)t->n_vocab || s < 0 || s >= g->n_states) continue;
        const int32_t node = token_node[tok];
        if (node < 0 || node >= t->n_nodes || t->pchar_slot[tok] >= 0) continue; /* not a whole-character path */
        int32_t d = 0, x = node;
        while (x != t->n_nodes && d < CAP) { /* up to the root: the token's characters, last first */
            if ((uint32_t)x > (uint32_t)t->n_nodes) return -1;
            path[d++] = t->node_cpi[x];
            x = t->parent[x];
        }
        if (x != t->n_nodes) continue;
        int8_t ok = 1;
        while (d > 0) {
            const int32_t cpi = path[--d];
            if ((uint32_t)cpi >= (uint32_t)g->n_cps) return -1;
            const int32_t c = g->cls_of_cpi[cpi];
            if ((uint32_t)c >= (uint32_t)nc) return -1;
            const int32_t nx = g->trans[(size_t)s * (size_t)nc + (size_t)c];
            if (nx == LLAMA_CFFI_TRANS_UNKNOWN) {
                ok = -1; /* not computed yet: the caller's engine decides */
                break;
            }
            if (nx < 0) {
                ok = 0;
                break;
            }
            if (nx >= g->n_states) {
                ok = -1;
                break;
            }
            s = nx;
        }
        out[i] = ok;
    }
    return 0;
}
