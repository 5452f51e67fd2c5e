/* The grammar engine's core: llama.cpp's stack advance, the interning of stacks and of
 * stack sets (parser states), and transitions, for samplers.grammar.engine (whose Python
 * version is the reference this one is tested against, state for state).
 *
 * A stack is interned as a cons cell (below, top): the stack below it and the element
 * position on top; cell 0 is the empty stack. Pushing and popping are then O(1) and two
 * equal stacks are the same cell, so a stack set is a sorted array of cell ids and a state
 * is such an array interned. advance(cell) (llama_grammar_advance_stack: expand rule
 * references on top until a terminal or nothing is on top) is cached per cell.
 *
 * A transition of state s on character class c is llama_grammar_accept_chr then advance
 * over s's stacks; the caller's table (int32, rows x n_classes, owned by Python) receives
 * it. Classes that the same stacks accept share a successor, so a row is computed once
 * per group of classes (llama_cffi_gengine_fill_row).
 *
 * Budgets: a state of more than max_stacks stacks (or one advance visiting more than
 * max_stacks + the grammar's size stacks) ends the call with LLAMA_CFFI_GENGINE_BUDGET,
 * more than max_cells stacks (or states) in all with LLAMA_CFFI_GENGINE_CELLS (an ambiguous grammar can multiply its
 * stacks with every character); the engine is left consistent. Every index read from
 * the grammar arrays was checked when the engine was made. Not thread-safe: the caller
 * serialises calls (samplers.grammar.engine holds its lock). */
#include <stdlib.h>
#include <string.h>

#include "llama_cffi.h"

/* (internal.h pulls in llama.cpp's headers, which this file does not need) */
#define LLAMA_CFFI_GENGINE_WALK_ERR (-100) /* as internal.h: engine errors of walk_step, offset */
int32_t llama_cffi_gengine_walk_step(llama_cffi_gengine *e, int32_t state, int32_t cls);
const int32_t *llama_cffi_gengine_table(const llama_cffi_gengine *e);

enum { T_END = 0, T_ALT = 1, T_REF = 2, T_CHAR = 3, T_CHAR_NOT = 4, T_RNG = 5, T_CHAR_ALT = 6, T_ANY = 7,
       T_TOKEN = 8, T_TOKEN_NOT = 9 };

typedef struct {
    int32_t *v;
    int64_t n, cap;
} ivec;

static int iv_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        int64_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *p = (int32_t *)realloc(a->v, sizeof(int32_t) * (size_t)cap);
        if (!p) return -1;
        a->v = p;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

static int iv_reserve(ivec *a, int64_t n) {
    if (n <= a->cap) return 0;
    int64_t cap = a->cap ? a->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *p = (int32_t *)realloc(a->v, sizeof(int32_t) * (size_t)cap);
    if (!p) return -1;
    a->v = p;
    a->cap = cap;
    return 0;
}

/* open addressing: slots hold id + 1 (0 empty) */
typedef struct {
    int32_t *slot;
    int64_t cap; /* a power of two */
    int64_t n;
} htab;

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

struct llama_cffi_gengine {
    /* the grammar, flattened (checked at creation) */
    int32_t n_elems, n_rules, n_rows, n_classes, n_mrows;
    int32_t *types, *values, *rule_start, *char_row, *after;
    uint8_t *member;       /* n_mrows x n_classes: the multi rows' membership */
    int32_t *single_class; /* n_rows - n_mrows: each single row's one class (-1: none) */
    int64_t max_stacks, max_cells;
    /* cells */
    ivec below, top, adv_off, adv_len, mark;
    ivec adv_pool;
    htab cells;
    int32_t gen;
    /* states, and their transitions (n_states x n_classes, LLAMA_CFFI_TRANS_UNKNOWN where
       not computed yet); rows changed since the last llama_cffi_gengine_sync_known are listed
       in dirty (row_dirty: whether a row is listed) */
    ivec st_off, st_len, st_pool;
    htab states;
    ivec trans, dirty, row_dirty;
    /* scratch */
    ivec todo, out, live, hits, sig_rep, cells_buf, succ, chain;
    uint64_t *sig;
    int64_t sig_cap;
    int32_t *group;
    uint8_t *pos_seen; /* n_elems flags, all 0 between calls */
    int32_t out_gen;
};

static int32_t grammar_is_end(const llama_cffi_gengine *e, int32_t pos) {
    return e->types[pos] == T_END || e->types[pos] == T_ALT;
}

/* id into the first free slot from hash (cap: a power of two, with a free slot) */
static void slot_put(int32_t *slot, int64_t cap, uint64_t hash, int32_t id) {
    const uint64_t m = (uint64_t)(cap - 1);
    uint64_t j = hash & m;
    while (slot[j]) j = (j + 1) & m;
    slot[j] = id + 1;
}

static int htab_grow(htab *h, int64_t need, uint64_t (*hash)(const llama_cffi_gengine *, int32_t),
                     const llama_cffi_gengine *e) {
    if ((need + 1) * 2 <= h->cap) return 0;
    int64_t cap = h->cap ? h->cap : 1024;
    while ((need + 1) * 2 > cap) cap *= 2;
    int32_t *slot = (int32_t *)calloc((size_t)cap, sizeof(int32_t));
    if (!slot) return -1;
    for (int64_t i = 0; i < h->cap; i++)
        if (h->slot[i]) slot_put(slot, cap, hash(e, h->slot[i] - 1), h->slot[i] - 1);
    free(h->slot);
    h->slot = slot;
    h->cap = cap;
    return 0;
}

static uint64_t cell_key_hash(int32_t below, int32_t top) {
    return mix64(((uint64_t)(uint32_t)below << 32) | (uint32_t)top);
}

static uint64_t cell_hash(const llama_cffi_gengine *e, int32_t id) {
    return cell_key_hash(e->below.v[id], e->top.v[id]);
}

static uint64_t set_key_hash(const int32_t *a, int64_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) h = mix64(h ^ (uint32_t)a[i]) + 0x9e3779b97f4a7c15ULL;
    return h;
}

static uint64_t words_hash(const uint64_t *a, int64_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) h = mix64(h ^ a[i]) + 0x9e3779b97f4a7c15ULL;
    return h;
}

static uint64_t state_hash(const llama_cffi_gengine *e, int32_t id) {
    return set_key_hash(e->st_pool.v + e->st_off.v[id], e->st_len.v[id]);
}

/* the cell (below, top), made if new; -2 out of memory, -6 over the cell budget */
static int32_t cons(llama_cffi_gengine *e, int32_t below, int32_t top) {
    uint64_t h = cell_key_hash(below, top);
    uint64_t m = (uint64_t)(e->cells.cap - 1);
    for (uint64_t j = h & m;; j = (j + 1) & m) {
        int32_t id1 = e->cells.slot[j];
        if (!id1) break;
        if (e->below.v[id1 - 1] == below && e->top.v[id1 - 1] == top) return id1 - 1;
    }
    if (e->below.n >= e->max_cells) return LLAMA_CFFI_GENGINE_CELLS;
    int32_t id = (int32_t)e->below.n;
    if (iv_push(&e->below, below) || iv_push(&e->top, top) || iv_push(&e->adv_off, -1) ||
        iv_push(&e->adv_len, 0) || iv_push(&e->mark, 0))
        return -2;
    if (htab_grow(&e->cells, e->below.n, cell_hash, e)) return -2;
    slot_put(e->cells.slot, e->cells.cap, h, id);
    e->cells.n++;
    return id;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* the state of the (sorted, distinct) cells a[0..n): -1 (DEAD) when n == 0 */
static int32_t intern_sorted(llama_cffi_gengine *e, const int32_t *a, int64_t n) {
    if (n == 0) return -1;
    uint64_t h = set_key_hash(a, n);
    uint64_t m = (uint64_t)(e->states.cap - 1);
    for (uint64_t j = h & m;; j = (j + 1) & m) {
        int32_t id1 = e->states.slot[j];
        if (!id1) break;
        int32_t id = id1 - 1;
        if (e->st_len.v[id] == n && !memcmp(e->st_pool.v + e->st_off.v[id], a, sizeof(int32_t) * (size_t)n))
            return id;
    }
    if (e->st_off.n >= INT32_MAX - 1) return -2;
    /* the memory bound: as many states as cells at most, 8 state entries per cell, and a
       transition table (states x classes) of 16 entries per cell (a word list's thousands
       of classes make each row large) */
    if (e->st_off.n >= e->max_cells || e->st_pool.n + n > 8 * e->max_cells ||
        (e->st_off.n + 1) * (int64_t)e->n_classes > 16 * e->max_cells)
        return LLAMA_CFFI_GENGINE_CELLS;
    int32_t id = (int32_t)e->st_off.n;
    int64_t off = e->st_pool.n;
    if (off > INT32_MAX - n) return -2;
    /* reserve everything first: a failure leaves the engine as it was */
    if (iv_reserve(&e->st_pool, off + n) || iv_reserve(&e->st_off, id + 1) || iv_reserve(&e->st_len, id + 1) ||
        iv_reserve(&e->row_dirty, id + 1) || iv_reserve(&e->trans, (int64_t)(id + 1) * e->n_classes) ||
        htab_grow(&e->states, id + 1, state_hash, e))
        return -2;
    memcpy(e->st_pool.v + off, a, sizeof(int32_t) * (size_t)n);
    e->st_pool.n = off + n;
    e->st_off.v[e->st_off.n++] = (int32_t)off;
    e->st_len.v[e->st_len.n++] = (int32_t)n;
    e->row_dirty.v[e->row_dirty.n++] = 0;
    for (int32_t c = 0; c < e->n_classes; c++) e->trans.v[e->trans.n++] = LLAMA_CFFI_TRANS_UNKNOWN;
    slot_put(e->states.slot, e->states.cap, h, id);
    e->states.n++;
    return id;
}

/* advance(cell) into the cache (adv_pool[adv_off[cell] ..][adv_len[cell]]); 0, -2, -3 */
static int advance(llama_cffi_gengine *e, int32_t cell) {
    if (e->adv_off.v[cell] >= 0) return 0;
    if (++e->gen == INT32_MAX) {
        memset(e->mark.v, 0, sizeof(int32_t) * (size_t)e->mark.n);
        e->gen = 1;
    }
    const int32_t gen = e->gen;
    int64_t start = e->adv_pool.n, visited = 0;
    /* a left-recursive grammar (one made without check_grammar, which refuses it) would
       expand forever: the stacks one advance visits are bounded */
    const int64_t max_visit = e->max_stacks + e->n_elems;
    e->todo.n = 0;
    if (iv_push(&e->todo, cell)) return -2;
    while (e->todo.n) {
        int32_t cur = e->todo.v[--e->todo.n];
        if (e->mark.v[cur] == gen) continue;
        e->mark.v[cur] = gen;
        if (++visited > max_visit) {
            e->adv_pool.n = start;
            return -3;
        }
        if (cur == 0) {
            if (iv_push(&e->adv_pool, 0)) return -2;
            continue;
        }
        int32_t pos = e->top.v[cur];
        int32_t t = e->types[pos];
        if (t == T_REF) {
            int32_t base = e->below.v[cur];
            if (!grammar_is_end(e, pos + 1)) {
                base = cons(e, base, pos + 1);
                if (base < 0) return base;
            }
            int32_t sub = e->rule_start[e->values[pos]];
            for (;;) {
                int32_t s = grammar_is_end(e, sub) ? base : cons(e, base, sub);
                if (s < 0) return s;
                if (iv_push(&e->todo, s)) return -2;
                while (!grammar_is_end(e, sub)) sub++;
                if (e->types[sub] == T_END) break;
                sub++;
            }
        } else {
            if (iv_push(&e->adv_pool, cur)) return -2;
        }
        if (e->adv_pool.n - start > e->max_stacks) {
            e->adv_pool.n = start;
            return -3;
        }
    }
    if (e->adv_pool.n > INT32_MAX) return -2;
    if (e->adv_pool.n > 8 * e->max_cells) { /* the memory bound: 8 advanced entries per cell */
        e->adv_pool.n = start;
        return LLAMA_CFFI_GENGINE_CELLS;
    }
    e->adv_off.v[cell] = (int32_t)start;
    e->adv_len.v[cell] = (int32_t)(e->adv_pool.n - start);
    return 0;
}

/* add advance(cell) to the output set e->out (seen: per cell, the out_gen at which it was
   added) */
static int out_add_advanced(llama_cffi_gengine *e, int32_t cell, ivec *seen) {
    int rc = advance(e, cell);
    if (rc) return rc;
    int32_t off = e->adv_off.v[cell], len = e->adv_len.v[cell];
    if (iv_reserve(seen, e->below.n)) return -2;
    while (seen->n < e->below.n) seen->v[seen->n++] = 0;
    for (int32_t i = 0; i < len; i++) {
        int32_t s = e->adv_pool.v[off + i];
        if (seen->v[s] == e->out_gen) continue;
        seen->v[s] = e->out_gen;
        if (iv_push(&e->out, s)) return -2;
        if (e->out.n > e->max_stacks) return -3;
    }
    return 0;
}

static int new_out(llama_cffi_gengine *e) {
    e->out.n = 0;
    if (++e->out_gen == INT32_MAX) {
        memset(e->hits.v, 0, sizeof(int32_t) * (size_t)e->hits.n);
        e->out_gen = 1;
    }
    return 0;
}

/* the state after the stacks whose top is a character element matched by class cls
   advance past it; the matching ones are given (cells) */
static int32_t successor(llama_cffi_gengine *e, const int32_t *cells, int64_t n) {
    new_out(e);
    for (int64_t i = 0; i < n; i++) {
        int32_t s = cells[i];
        int32_t pos = e->top.v[s];
        int32_t nxt = e->after[pos];
        int32_t b = e->below.v[s];
        int32_t ns = grammar_is_end(e, nxt) ? b : cons(e, b, nxt);
        if (ns < 0) return ns;
        int rc = out_add_advanced(e, ns, &e->hits);
        if (rc) return rc;
    }
    qsort(e->out.v, (size_t)e->out.n, sizeof(int32_t), cmp_i32);
    return intern_sorted(e, e->out.v, e->out.n);
}

static void htab_free(htab *h) { free(h->slot); }

void llama_cffi_gengine_free(llama_cffi_gengine *e) {
    if (!e) return;
    free(e->types);
    free(e->values);
    free(e->rule_start);
    free(e->char_row);
    free(e->after);
    free(e->member);
    free(e->single_class);
    ivec *vs[] = {&e->below, &e->top, &e->adv_off, &e->adv_len, &e->mark, &e->adv_pool, &e->st_off,
                  &e->st_len, &e->st_pool, &e->todo, &e->out, &e->live, &e->hits, &e->sig_rep, &e->cells_buf, &e->succ,
                  &e->trans, &e->dirty, &e->row_dirty, &e->chain};
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) free(vs[i]->v);
    htab_free(&e->cells);
    htab_free(&e->states);
    free(e->sig);
    free(e->group);
    free(e->pos_seen);
    free(e);
}

static void *dup(const void *p, size_t n) {
    void *q = malloc(n ? n : 1);
    if (q && n) memcpy(q, p, n);
    return q;
}

llama_cffi_gengine *llama_cffi_gengine_new(int32_t n_elems, const int32_t *types, const int32_t *values,
                                           int32_t n_rules, const int32_t *rule_start, const int32_t *char_row,
                                           const int32_t *after, int32_t n_rows, int32_t n_classes,
                                           int32_t n_mrows, const uint8_t *member, const int32_t *single_class,
                                           int64_t max_stacks, int64_t max_cells) {
    if (n_elems < 1 || n_rules < 1 || n_rows < 0 || n_classes < 1 || n_mrows < 0 || n_mrows > n_rows || !types ||
        !values || !rule_start || !char_row || !after || (n_mrows && !member) || (n_rows > n_mrows && !single_class) ||
        max_stacks < 1 || max_cells < 2 || max_cells > INT32_MAX - 1)
        return NULL;
    for (int32_t r = n_mrows; r < n_rows; r++)
        if (single_class[r - n_mrows] < -1 || single_class[r - n_mrows] >= n_classes) return NULL;
    /* every rule ends with END: walks to the end of an alternative stay inside */
    if (types[n_elems - 1] != T_END) return NULL;
    for (int32_t r = 0; r < n_rules; r++)
        if (rule_start[r] < 0 || rule_start[r] >= n_elems) return NULL;
    for (int32_t p = 0; p < n_elems; p++) {
        int32_t t = types[p];
        if (t < T_END || t > T_TOKEN_NOT) return NULL;
        if (t == T_REF) {
            if (values[p] < 0 || values[p] >= n_rules || p + 1 >= n_elems) return NULL;
        }
        if (t == T_CHAR || t == T_CHAR_NOT || t == T_ANY) {
            if (char_row[p] < 0 || char_row[p] >= n_rows || after[p] <= p || after[p] >= n_elems) return NULL;
        } else if (t == T_TOKEN || t == T_TOKEN_NOT) {
            return NULL; /* token elements stay with the Python engine */
        }
    }
    llama_cffi_gengine *e = (llama_cffi_gengine *)calloc(1, sizeof *e);
    if (!e) return NULL;
    e->n_elems = n_elems;
    e->n_rules = n_rules;
    e->n_rows = n_rows;
    e->n_classes = n_classes;
    e->n_mrows = n_mrows;
    e->max_stacks = max_stacks;
    e->max_cells = max_cells;
    size_t ne = sizeof(int32_t) * (size_t)n_elems;
    e->types = (int32_t *)dup(types, ne);
    e->values = (int32_t *)dup(values, ne);
    e->rule_start = (int32_t *)dup(rule_start, sizeof(int32_t) * (size_t)n_rules);
    e->char_row = (int32_t *)dup(char_row, ne);
    e->after = (int32_t *)dup(after, ne);
    e->member = (uint8_t *)dup(member, (size_t)n_mrows * (size_t)n_classes);
    e->single_class = (int32_t *)dup(single_class, sizeof(int32_t) * (size_t)(n_rows - n_mrows));
    e->group = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_classes);
    e->pos_seen = (uint8_t *)calloc((size_t)n_elems, 1);
    if (!e->types || !e->values || !e->rule_start || !e->char_row || !e->after || !e->member || !e->single_class ||
        !e->group ||
        !e->pos_seen ||
        htab_grow(&e->cells, 1024, cell_hash, e) || htab_grow(&e->states, 1024, state_hash, e) ||
        iv_push(&e->below, -1) || iv_push(&e->top, -1) || iv_push(&e->adv_off, -1) || iv_push(&e->adv_len, 0) ||
        iv_push(&e->mark, 0)) {
        llama_cffi_gengine_free(e);
        return NULL;
    }
    /* cell 0, the empty stack, is not in the table: cons never makes (below=-1, top=-1) */
    return e;
}

static int check_state(const llama_cffi_gengine *e, int32_t state) {
    return state >= 0 && state < e->st_off.n;
}

int32_t llama_cffi_gengine_n_states(const llama_cffi_gengine *e) { return e ? (int32_t)e->st_off.n : -1; }

int64_t llama_cffi_gengine_n_cells(const llama_cffi_gengine *e) { return e ? e->below.n : -1; }

int32_t llama_cffi_gengine_start(llama_cffi_gengine *e, int32_t rule) {
    if (!e || rule < 0 || rule >= e->n_rules) return -4;
    new_out(e);
    int32_t sub = e->rule_start[rule];
    for (;;) {
        int32_t s = grammar_is_end(e, sub) ? 0 : cons(e, 0, sub);
        if (s < 0) return s;
        int rc = out_add_advanced(e, s, &e->hits);
        if (rc) return rc;
        while (!grammar_is_end(e, sub)) sub++;
        if (e->types[sub] == T_END) break;
        sub++;
    }
    qsort(e->out.v, (size_t)e->out.n, sizeof(int32_t), cmp_i32);
    return intern_sorted(e, e->out.v, e->out.n);
}

int32_t llama_cffi_gengine_n_stacks(const llama_cffi_gengine *e, int32_t state) {
    if (!e || !check_state(e, state)) return -4;
    return e->st_len.v[state];
}

/* whether some stack of state st is empty (the grammar may end there: sorted, cell 0 first) */
static inline uint8_t state_complete(const llama_cffi_gengine *e, int32_t st) {
    return e->st_len.v[st] > 0 && e->st_pool.v[e->st_off.v[st]] == 0;
}

int32_t llama_cffi_gengine_complete(const llama_cffi_gengine *e, int32_t state) {
    if (!e || !check_state(e, state)) return -4;
    return state_complete(e, state);
}

int64_t llama_cffi_gengine_stacks(const llama_cffi_gengine *e, int32_t state, int32_t *lens, int32_t *flat,
                                  int64_t flat_cap) {
    if (!e || !check_state(e, state) || !lens || (!flat && flat_cap)) return -4;
    const int32_t *cells = e->st_pool.v + e->st_off.v[state];
    int64_t total = 0;
    for (int32_t i = 0; i < e->st_len.v[state]; i++) {
        int32_t depth = 0;
        for (int32_t c = cells[i]; c != 0; c = e->below.v[c]) depth++;
        lens[i] = depth;
        if (total + depth <= flat_cap) { /* bottom first */
            int32_t k = depth;
            for (int32_t c = cells[i]; c != 0; c = e->below.v[c]) flat[total + --k] = e->top.v[c];
        }
        total += depth;
    }
    return total;
}

int32_t llama_cffi_gengine_intern(llama_cffi_gengine *e, int32_t n, const int32_t *lens, const int32_t *flat) {
    if (!e || n < 0 || (n && (!lens || !flat))) return -4;
    new_out(e);
    int64_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t s = 0;
        if (lens[i] < 0) return -4;
        for (int32_t k = 0; k < lens[i]; k++) {
            int32_t pos = flat[at + k];
            if (pos < 0 || pos >= e->n_elems) return -4;
            s = cons(e, s, pos);
            if (s < 0) return s;
        }
        at += lens[i];
        if (iv_reserve(&e->hits, e->below.n)) return -2;
        while (e->hits.n < e->below.n) e->hits.v[e->hits.n++] = 0;
        if (e->hits.v[s] == e->out_gen) continue;
        e->hits.v[s] = e->out_gen;
        if (iv_push(&e->out, s)) return -2;
    }
    qsort(e->out.v, (size_t)e->out.n, sizeof(int32_t), cmp_i32);
    return intern_sorted(e, e->out.v, e->out.n);
}

/* the state's stacks whose top is a character element, into e->live */
static int live_stacks(llama_cffi_gengine *e, int32_t state) {
    e->live.n = 0;
    const int32_t *cells = e->st_pool.v + e->st_off.v[state];
    int32_t n = e->st_len.v[state];
    if (iv_reserve(&e->live, n)) return -2;
    for (int32_t i = 0; i < n; i++) {
        int32_t c = cells[i];
        if (c == 0) continue;
        int32_t t = e->types[e->top.v[c]];
        if (t == T_CHAR || t == T_CHAR_NOT || t == T_ANY) e->live.v[e->live.n++] = c;
    }
    return 0;
}

/* record a transition in the engine's table (and its row as changed) */
static int set_trans(llama_cffi_gengine *e, int32_t state, int32_t cls, int32_t succ) {
    e->trans.v[(int64_t)state * e->n_classes + cls] = succ;
    if (!e->row_dirty.v[state]) {
        if (iv_push(&e->dirty, state)) return -2;
        e->row_dirty.v[state] = 1;
    }
    return 0;
}

/* whether the char element of row r matches class cls: a multi row's member cell, or a
   single row's one class */
static inline int row_matches(const llama_cffi_gengine *e, int32_t r, int32_t cls) {
    if (r < e->n_mrows) return e->member[(size_t)r * (size_t)e->n_classes + (size_t)cls];
    return e->single_class[r - e->n_mrows] == cls;
}

static int32_t step_(llama_cffi_gengine *e, int32_t state, int32_t cls) {
    int32_t known = e->trans.v[(int64_t)state * e->n_classes + cls];
    if (known != LLAMA_CFFI_TRANS_UNKNOWN) return known;
    int rc = live_stacks(e, state);
    if (rc) return rc;
    /* the matching stacks (live is scratch: compact it in place) */
    int64_t k = 0;
    for (int64_t i = 0; i < e->live.n; i++) {
        int32_t c = e->live.v[i];
        if (row_matches(e, e->char_row[e->top.v[c]], cls)) e->live.v[k++] = c;
    }
    int32_t s = k ? successor(e, e->live.v, k) : -1; /* successor() uses out/hits, not live */
    if (s < -1) return s;
    if (set_trans(e, state, cls, s)) return -2;
    return s;
}

int32_t llama_cffi_gengine_step(llama_cffi_gengine *e, int32_t state, int32_t cls) {
    if (!e || !check_state(e, state) || cls < 0 || cls >= e->n_classes) return -4;
    return step_(e, state, cls);
}

const int32_t *llama_cffi_gengine_table(const llama_cffi_gengine *e) { return e->trans.v; }

int32_t llama_cffi_gengine_walk_step(llama_cffi_gengine *e, int32_t state, int32_t cls) {
    if (!e || !check_state(e, state) || cls < 0 || cls >= e->n_classes) return LLAMA_CFFI_GENGINE_WALK_ERR - 4;
    int32_t s = step_(e, state, cls);
    return s < -1 ? LLAMA_CFFI_GENGINE_WALK_ERR + s : s;
}

/* per class, which live stacks match it (words per class), the classes grouped by it:
   group[c] the group, sig_rep[g] a class of group g; returns the number of groups */
static int64_t class_groups(llama_cffi_gengine *e, int64_t *words_out) {
    const int64_t nl = e->live.n, nc = e->n_classes;
    const int64_t words = (nl + 63) / 64;
    *words_out = words;
    if (words * nc > e->sig_cap) {
        uint64_t *p = (uint64_t *)realloc(e->sig, sizeof(uint64_t) * (size_t)(words * nc));
        if (!p) return -2;
        e->sig = p;
        e->sig_cap = words * nc;
    }
    memset(e->sig, 0, sizeof(uint64_t) * (size_t)(words * nc));
    for (int64_t i = 0; i < nl; i++) {
        const int32_t r = e->char_row[e->top.v[e->live.v[i]]];
        const uint64_t bit = (uint64_t)1 << (i & 63);
        uint64_t *col = e->sig + i / 64;
        if (r >= e->n_mrows) { /* a single row: one class */
            const int32_t c = e->single_class[r - e->n_mrows];
            if (c >= 0) col[(int64_t)c * words] |= bit;
            continue;
        }
        const uint8_t *row = e->member + (size_t)r * (size_t)nc;
        for (int64_t c = 0; c < nc; c++)
            if (row[c]) col[c * words] |= bit;
    }
    /* group equal signatures: a small hash table over classes */
    int64_t cap = 16;
    while (cap < 2 * nc) cap *= 2;
    int32_t *tab = (int32_t *)calloc((size_t)cap, sizeof(int32_t));
    if (!tab) return -2;
    e->sig_rep.n = 0;
    for (int64_t c = 0; c < nc; c++) {
        const uint64_t *s = e->sig + c * words;
        uint64_t h = words_hash(s, words);
        uint64_t j = h & (uint64_t)(cap - 1);
        for (;;) {
            int32_t g1 = tab[j];
            if (!g1) {
                if (iv_push(&e->sig_rep, (int32_t)c)) {
                    free(tab);
                    return -2;
                }
                tab[j] = (int32_t)e->sig_rep.n;
                e->group[c] = (int32_t)e->sig_rep.n - 1;
                break;
            }
            if (!memcmp(e->sig + (int64_t)e->sig_rep.v[g1 - 1] * words, s, sizeof(uint64_t) * (size_t)words)) {
                e->group[c] = g1 - 1;
                break;
            }
            j = (j + 1) & (uint64_t)(cap - 1);
        }
    }
    free(tab);
    return e->sig_rep.n;
}

/* the successor of group g (its stacks: the bits of its signature); -1 when none match */
static int32_t group_successor(llama_cffi_gengine *e, int32_t g, int64_t words, ivec *cells) {
    const uint64_t *s = e->sig + (int64_t)e->sig_rep.v[g] * words;
    cells->n = 0;
    for (int64_t i = 0; i < e->live.n; i++)
        if ((s[i / 64] >> (i & 63)) & 1u)
            if (iv_push(cells, e->live.v[i])) return -2;
    if (!cells->n) return -1;
    return successor(e, cells->v, cells->n);
}

static int fill_row_(llama_cffi_gengine *e, int32_t state) {
    const int32_t *row = e->trans.v + (int64_t)state * e->n_classes;
    int32_t c0 = 0;
    while (c0 < e->n_classes && row[c0] != LLAMA_CFFI_TRANS_UNKNOWN) c0++;
    if (c0 == e->n_classes) return 0; /* known already */
    int rc = live_stacks(e, state);
    if (rc) return rc;
    if (!e->live.n) {
        for (int32_t c = 0; c < e->n_classes; c++)
            if (set_trans(e, state, c, -1)) return -2;
        return 0;
    }
    int64_t words;
    int64_t ng = class_groups(e, &words);
    if (ng < 0) return (int)ng;
    /* successors per group, then the row (the successors' interning may add cells and
       states, but leaves live, sig and group alone) */
    if (iv_reserve(&e->succ, ng)) return -2;
    for (int64_t g = 0; g < ng; g++) {
        int32_t s = group_successor(e, (int32_t)g, words, &e->cells_buf);
        if (s < -1) return s;
        e->succ.v[g] = s;
    }
    for (int32_t c = 0; c < e->n_classes; c++)
        if (set_trans(e, state, c, e->succ.v[e->group[c]])) return -2;
    return 0;
}

int llama_cffi_gengine_fill_row(llama_cffi_gengine *e, int32_t state) {
    if (!e || !check_state(e, state)) return -4;
    return fill_row_(e, state);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* see the header */
int32_t llama_cffi_gengine_derive_pick(llama_cffi_gengine *e, int32_t state, const int32_t *root_count,
                                       int32_t n_classes, int64_t min_root, int32_t share, int32_t *differ,
                                       int32_t *n_differ) {
    if (!e || !check_state(e, state) || !root_count || !differ || !n_differ || n_classes != e->n_classes ||
        share < 1)
        return -4;
    *n_differ = 0;
    const int64_t nc = e->n_classes;
    for (int64_t c = 0; c < nc; c++)
        if (root_count[c] < 0) return -4;
    int rc = fill_row_(e, state);
    if (rc) return rc;
    const int32_t *row = e->trans.v + (int64_t)state * nc;
    int64_t total = 0, n_live = 0;
    for (int64_t c = 0; c < nc; c++)
        if (row[c] >= 0) {
            total += root_count[c];
            n_live++;
        }
    if (total < min_root || !n_live) return -1;
    /* (successor, class) pairs sorted: each successor's classes in a run, its first class first */
    int64_t *pairs = (int64_t *)malloc(sizeof(int64_t) * (size_t)n_live);
    if (!pairs) return -2;
    int64_t k = 0;
    for (int64_t c = 0; c < nc; c++)
        if (row[c] >= 0) pairs[k++] = ((int64_t)row[c] << 32) | c;
    qsort(pairs, (size_t)n_live, sizeof(int64_t), cmp_i64);
    int32_t g = -1;
    int64_t best_w = -1, best_c = nc;
    for (int64_t i = 0; i < n_live;) {
        const int32_t s = (int32_t)(pairs[i] >> 32);
        const int64_t first = pairs[i] & 0xffffffff;
        int64_t w = 0;
        for (; i < n_live && (int32_t)(pairs[i] >> 32) == s; i++) w += root_count[pairs[i] & 0xffffffff];
        if (w > best_w || (w == best_w && first < best_c)) {
            best_w = w;
            best_c = first;
            g = s;
        }
    }
    free(pairs);
    if (g == state) return -1;
    rc = fill_row_(e, g);
    if (rc) return rc;
    row = e->trans.v + (int64_t)state * nc; /* (the table may have moved) */
    const int32_t *row_g = e->trans.v + (int64_t)g * nc;
    int64_t w_differ = 0;
    int32_t n = 0;
    for (int64_t c = 0; c < nc; c++)
        if (row[c] != row_g[c]) {
            w_differ += root_count[c];
            differ[n++] = (int32_t)c;
        }
    if (w_differ * share > total) return -1;
    *n_differ = n;
    return g;
}

/* see the header: the successor shared by classes[0..n), -5 when they have none in common
   for certain */
static int32_t group_step_(llama_cffi_gengine *e, int32_t state, const int32_t *classes, int32_t n) {
    const int32_t *row = e->trans.v + (int64_t)state * e->n_classes;
    int all_known = 1;
    for (int32_t i = 0; i < n && all_known; i++) all_known = row[classes[i]] != LLAMA_CFFI_TRANS_UNKNOWN;
    if (all_known) {
        for (int32_t i = 1; i < n; i++)
            if (row[classes[i]] != row[classes[0]]) return -5;
        return row[classes[0]];
    }
    int rc = live_stacks(e, state);
    if (rc) return rc;
    if (!e->live.n) {
        for (int32_t c = 0; c < e->n_classes; c++)
            if (set_trans(e, state, c, -1)) return -2;
        return -1;
    }
    int64_t words;
    int64_t ng = class_groups(e, &words);
    if (ng < 0) return (int32_t)ng;
    int32_t g = e->group[classes[0]];
    for (int32_t i = 1; i < n; i++)
        if (e->group[classes[i]] != g) return -5;
    int32_t s = group_successor(e, g, words, &e->cells_buf);
    if (s < -1) return s;
    for (int32_t c = 0; c < e->n_classes; c++)
        if (e->group[c] == g && set_trans(e, state, c, s)) return -2;
    return s;
}

int32_t llama_cffi_gengine_group_step(llama_cffi_gengine *e, int32_t state, const int32_t *classes, int32_t n) {
    if (!e || !check_state(e, state) || n < 1 || !classes) return -4;
    for (int32_t i = 0; i < n; i++)
        if (classes[i] < 0 || classes[i] >= e->n_classes) return -4;
    return group_step_(e, state, classes, n);
}

int llama_cffi_gengine_fill(llama_cffi_gengine *e, int64_t n, const int32_t *states, const int32_t *classes) {
    if (!e || n < 0 || (n && (!states || !classes))) return -4;
    for (int64_t i = 0; i < n; i++) {
        int32_t st = states[i], c = classes[i];
        if (st < 0) continue;
        if (!check_state(e, st) || c < 0 || c >= e->n_classes) return -4;
        int32_t s = step_(e, st, c);
        if (s < -1) return s;
    }
    return 0;
}

/* the rows changed since the last sync copied into table (rows of n_classes); how many */
static int32_t copy_dirty_rows(llama_cffi_gengine *e, int32_t *table) {
    const int64_t nc = e->n_classes;
    for (int64_t i = 0; i < e->dirty.n; i++) {
        int32_t st = e->dirty.v[i];
        memcpy(table + (int64_t)st * nc, e->trans.v + (int64_t)st * nc, sizeof(int32_t) * (size_t)nc);
        e->row_dirty.v[st] = 0;
    }
    int32_t copied = (int32_t)e->dirty.n;
    e->dirty.n = 0;
    return copied;
}

int32_t llama_cffi_gengine_sync_known(llama_cffi_gengine *e, int32_t *table, int32_t n_rows, int32_t n_known,
                                      uint8_t *complete, int32_t cap) {
    if (!e || !table || n_rows < 0 || n_known < 0 || cap < 0 || (cap && !complete)) return -4;
    const int32_t n = (int32_t)e->st_off.n;
    if (n > n_known) {
        if (n - n_known <= cap)
            for (int32_t i = n_known; i < n; i++) complete[i - n_known] = state_complete(e, i);
        return LLAMA_CFFI_GENGINE_NEW_STATES - n;
    }
    if (n > n_rows) return -5;
    return copy_dirty_rows(e, table);
}

int32_t llama_cffi_gengine_completes(const llama_cffi_gengine *e, int32_t first, int32_t n, uint8_t *out) {
    if (!e || first < 0 || n < 0 || (int64_t)first + n > e->st_off.n || (n && !out)) return -4;
    for (int32_t i = 0; i < n; i++) out[i] = state_complete(e, first + i);
    return 0;
}

#define CLOSED_MAX 8     /* states a closed run may visit (llama_cffi_gengine_run's search) */
#define CLOSED_BIG 256   /* states llama_cffi_gengine_closed's search may visit */
#define CLOSED_TRIES 32  /* searches for one (each after removing classes) */
#define CLOSED_BIG_TRIES 8 /* ... by llama_cffi_gengine_closed (a searched pattern's takes 1-2) */

/* see llama_cffi_gengine_run: the closed run of state into words (W words). From the
   classes that leave state alive, a search over the states they lead to; a state that
   some of them kill costs either those classes or the class it was reached by,
   whichever weighs less (class_weight: a key's closing quote leads to a state that
   kills every letter, and goes), and the search starts again. Left empty after
   max_tries searches, past max_states states (a bounded string's positions), or at a
   state with more than max_run_stacks stacks or a transition past the engine's budget.
   With states (room for max_states), the states of the closure found go there (their
   number in *n_states: every one of them has the same closed run). 0, or an engine error */
static int closed_run(llama_cffi_gengine *e, int32_t state, const double *class_weight, int32_t max_run_stacks,
                      int32_t max_states, int max_tries, uint64_t *words, int32_t W, int32_t *states,
                      int32_t *n_states) {
    const int64_t nc = e->n_classes;
    int32_t seen[CLOSED_BIG], via[CLOSED_BIG];
    if (max_states > CLOSED_BIG) max_states = CLOSED_BIG;
    if (n_states) *n_states = 0;
    memset(words, 0, sizeof(uint64_t) * (size_t)W);
    int rc = e->st_len.v[state] > max_run_stacks ? -3 : fill_row_(e, state);
    if (rc == -3 || rc == -6) return 0; /* an ambiguous state, past the budget: no closed run */
    if (rc) return rc;
    const int32_t *row = e->trans.v + (int64_t)state * nc;
    for (int64_t c = 0; c < nc; c++)
        if (row[c] >= 0) words[c / 64] |= (uint64_t)1 << (c % 64);
#define IN_L(c) ((words[(c) / 64] >> ((c) % 64)) & 1u)
#define DROP(c) (words[(c) / 64] &= ~((uint64_t)1 << ((c) % 64)))
    for (int tries = 0; tries < max_tries; tries++) {
        int32_t n_seen = 1;
        seen[0] = state;
        via[0] = -1;
        int again = 0;
        for (int32_t i = 0; i < n_seen && !again; i++) {
            const int32_t r = seen[i];
            rc = e->st_len.v[r] > max_run_stacks ? -3 : fill_row_(e, r);
            if (rc == -3 || rc == -6) break;
            if (rc) return rc;
            row = e->trans.v + (int64_t)r * nc; /* (read after fill_row_: the table may have moved) */
            double killed = 0.0;
            int any = 0;
            for (int64_t c = 0; c < nc; c++)
                if (IN_L(c) && row[c] < 0) {
                    killed += class_weight[c];
                    any = 1;
                }
            if (any) {
                if (i > 0 && class_weight[via[i]] < killed) DROP(via[i]);
                else
                    for (int64_t c = 0; c < nc; c++)
                        if (IN_L(c) && row[c] < 0) DROP(c);
                again = 1;
                break;
            }
            for (int64_t c = 0; c < nc && !again && !rc; c++) {
                if (!IN_L(c)) continue;
                const int32_t nx = row[c];
                if (nx < 0 || nx >= e->st_off.n) { /* (not after the check above; never read as a state) */
                    DROP(c);
                    again = 1;
                    break;
                }
                int known = 0;
                for (int32_t j = 0; j < n_seen && !known; j++) known = seen[j] == nx;
                if (known) continue;
                if (n_seen == max_states) { /* too many states (a bounded string's positions): none */
                    rc = -3;
                    break;
                }
                via[n_seen] = (int32_t)c;
                seen[n_seen++] = nx;
            }
            if (rc) break;
        }
        if (rc == -3 || rc == -6) break;
        if (!again) { /* every state reached stays alive on every class left */
            if (states) {
                memcpy(states, seen, sizeof(int32_t) * (size_t)n_seen);
                *n_states = n_seen;
            }
            return 0;
        }
    }
#undef IN_L
#undef DROP
    memset(words, 0, sizeof(uint64_t) * (size_t)W); /* none found within the bounds */
    return 0;
}

/* the weights (class_weight) of state's live classes in its run (run_words) and off it;
   state's row filled */
static void run_weights(const llama_cffi_gengine *e, int32_t state, const uint64_t *run_words,
                        const double *class_weight, double *w_run, double *w_off) {
    const int32_t *row = e->trans.v + (int64_t)state * e->n_classes;
    *w_run = *w_off = 0.0;
    for (int64_t c = 0; c < e->n_classes; c++)
        if (row[c] >= 0) {
            if ((run_words[c / 64] >> (c % 64)) & 1u) *w_run += class_weight[c];
            else *w_off += class_weight[c];
        }
}

int32_t llama_cffi_gengine_closure_pays(const llama_cffi_gengine *e, int32_t state, const uint64_t *run_words,
                                        int32_t W, const double *class_weight, double min_off) {
    if (!e || !check_state(e, state) || !run_words || !class_weight || W != e->n_classes / 64 + 1) return -4;
    if ((int64_t)state * e->n_classes + e->n_classes > e->trans.n) return 0; /* (its row not filled: no run) */
    double w_run, w_off;
    run_weights(e, state, run_words, class_weight, &w_run, &w_off);
    return w_off >= min_off && w_run >= 4.0 * w_off;
}

int32_t llama_cffi_gengine_closed(llama_cffi_gengine *e, int32_t state, const double *class_weight,
                                  int32_t max_run_stacks, int32_t max_states, uint64_t *words, int32_t W,
                                  int32_t *states, int32_t *n_states) {
    if (!e || !check_state(e, state) || !class_weight || !words || !states || !n_states || max_states < 1 ||
        max_states > CLOSED_BIG || W != e->n_classes / 64 + 1)
        return -4;
    return closed_run(e, state, class_weight, max_run_stacks, max_states, CLOSED_BIG_TRIES, words, W, states,
                      n_states);
}

static int32_t run_chain(llama_cffi_gengine *e, int32_t state, const double *class_weight, int32_t cap,
                         int32_t max_run_stacks, int32_t *chain, uint64_t *run_words, int32_t W);

int32_t llama_cffi_gengine_run(llama_cffi_gengine *e, int32_t state, const double *class_weight, int32_t cap,
                               int32_t max_run_stacks, int32_t *chain, uint64_t *run_words, uint64_t *closed_words,
                               int32_t W) {
    if (!e || !check_state(e, state) || !class_weight || cap < 0 || !chain || !run_words ||
        W != e->n_classes / 64 + 1)
        return -4;
    int rc = fill_row_(e, state);
    if (rc) return rc;
    if (closed_words) memset(closed_words, 0, sizeof(uint64_t) * (size_t)W);
    int32_t len = run_chain(e, state, class_weight, cap, max_run_stacks, chain, run_words, W);
    if (len < 0) return len;
    if (closed_words) {
        /* (not past a chain of more than CLOSED_MAX states: a bounded string's positions,
           whose closure is never closed, would cost a search of CLOSED_MAX rows each) */
        int32_t distinct = 1;
        for (int32_t i = 1; i < len && distinct <= CLOSED_MAX; i++) distinct += chain[i] != chain[i - 1];
        /* nor when the classes state takes off its run weigh under a quarter of the run's
           (JSON punctuation after a value, a string's closing quote): a closed run could
           add little, and its search would fill rows in every walk that meets the state */
        double w_run, w_off;
        run_weights(e, state, run_words, class_weight, &w_run, &w_off);
        if (distinct <= CLOSED_MAX && w_off > 0.0 && 4.0 * w_off >= w_run) {
            rc = closed_run(e, state, class_weight, max_run_stacks, CLOSED_MAX, CLOSED_TRIES, closed_words, W, NULL,
                            NULL);
            if (rc) return rc;
            /* one that adds nothing to a run of any length is left out: a walk would test
               each node it descends into against it again (a string's loop: the same) */
            uint64_t extra = 0;
            for (int32_t w = 0; w < W; w++) extra |= closed_words[w] & ~run_words[w];
            if (!extra && len == cap + 1 && chain[cap] == chain[cap - (cap > 0)])
                memset(closed_words, 0, sizeof(uint64_t) * (size_t)W);
        }
    }
    return len;
}

/* llama_cffi_gengine_run's chain and run (state's row filled); its length, or an error */
static int32_t run_chain(llama_cffi_gengine *e, int32_t state, const double *class_weight, int32_t cap,
                         int32_t max_run_stacks, int32_t *chain, uint64_t *run_words, int32_t W) {
    const int64_t nc = e->n_classes;
    memset(run_words, 0, sizeof(uint64_t) * (size_t)W);
    int32_t len = 0;
    chain[len++] = state;
    const int32_t *row = e->trans.v + (int64_t)state * nc;
    /* the successor whose classes weigh most (the state itself on a tie, then the lowest id) */
    int32_t best = -1;
    double best_w = -1.0;
    e->cells_buf.n = 0; /* scratch: the distinct successors */
    for (int64_t c = 0; c < nc; c++) {
        int32_t s = row[c];
        if (s < 0) continue;
        int seen = 0;
        for (int64_t i = 0; i < e->cells_buf.n; i++)
            if (e->cells_buf.v[i] == s) seen = 1;
        if (seen) continue;
        if (iv_push(&e->cells_buf, s)) return -2;
        double w = s == state ? 0.5 : 0.0;
        for (int64_t d = c; d < nc; d++)
            if (row[d] == s) w += class_weight[d];
        if (w > best_w || (w == best_w && s < best)) {
            best_w = w;
            best = s;
        }
    }
    if (best < 0) { /* nothing follows: the empty run covers the leaves of any length */
        while (len <= cap) chain[len++] = state;
        return len;
    }
    e->chain.n = 0;
    for (int64_t c = 0; c < nc; c++)
        if (row[c] == best) {
            if (iv_push(&e->chain, (int32_t)c)) return -2;
            run_words[c / 64] |= (uint64_t)1 << (c % 64);
        }
    int32_t cur = state;
    while (len <= cap) {
        if (e->st_len.v[cur] > max_run_stacks) break; /* an ambiguous grammar: a shorter run is as correct */
        int32_t nx = group_step_(e, cur, e->chain.v, (int32_t)e->chain.n);
        if (nx == -5 || nx == -1) break;
        if (nx < -1) return nx;
        if (nx == cur) { /* a self-loop: the chain stays here */
            while (len <= cap) chain[len++] = cur;
            break;
        }
        chain[len++] = nx;
        cur = nx;
    }
    return len;
}

int llama_cffi_gengine_pchar_ok(llama_cffi_gengine *e, int32_t state, const int64_t *pchars, int32_t n,
                                uint8_t *out) {
    if (!e || !check_state(e, state) || n < 0 || (n && (!pchars || !out))) return -4;
    memset(out, 0, (size_t)n);
    int rc = live_stacks(e, state);
    if (rc) return rc;
    for (int64_t i = 0; i < e->live.n; i++) {
        int32_t top = e->top.v[e->live.v[i]];
        if (e->pos_seen[top]) continue; /* the same position on several stacks answers the same */
        e->pos_seen[top] = 1;
        const int positive = e->types[top] == T_CHAR || e->types[top] == T_ANY;
        for (int32_t k = 0; k < n; k++) {
            if (out[k]) continue;
            int64_t value = pchars[k] >> 2, remain = pchars[k] & 3;
            /* llama_grammar_match_partial_char */
            if (remain <= 0 || (remain == 1 && value < 2)) continue;
            int64_t low = value << (remain * 6);
            int64_t high = low | (((int64_t)1 << (remain * 6)) - 1);
            if (low == 0) {
                if (remain == 2) low = 1 << 11;
                else if (remain == 3) low = 1 << 16;
            }
            int32_t pos = top;
            int overlap = 0, any = 0;
            for (;;) {
                if (e->types[pos + 1] == T_RNG) {
                    overlap |= e->values[pos] <= high && low <= e->values[pos + 1];
                    pos += 2;
                } else if (e->types[pos] == T_ANY) {
                    any = 1;
                    break;
                } else {
                    overlap |= low <= e->values[pos] && e->values[pos] <= high;
                    pos += 1;
                }
                if (e->types[pos] != T_CHAR_ALT) break;
            }
            out[k] = any ? 1 : (uint8_t)(positive ? overlap : !overlap);
        }
    }
    for (int64_t i = 0; i < e->live.n; i++) e->pos_seen[e->top.v[e->live.v[i]]] = 0;
    return 0;
}

int llama_cffi_gengine_partial_mask(llama_cffi_gengine *e, int32_t state, const int32_t *classes, int32_t n_exact,
                                    int32_t n_longer, const int32_t *ex_w, const uint32_t *ex_b,
                                    const int64_t *pchars, int32_t n_short, const int32_t *sh_w,
                                    const uint32_t *sh_b, uint32_t *out, int32_t n_words, uint8_t *live_longer) {
    if (!e || !check_state(e, state) || n_exact < 0 || n_longer < 0 || n_short < 0 || n_words < 0 || !out ||
        ((n_exact || n_longer) && !classes) || (n_exact && (!ex_w || !ex_b)) || (n_longer && !live_longer) ||
        (n_short && (!pchars || !sh_w || !sh_b)))
        return -4;
    const int64_t n_cls = (int64_t)n_exact + n_longer;
    for (int64_t i = 0; i < n_cls; i++) { /* every index checked before anything is written */
        if (classes[i] < 0 || classes[i] >= e->n_classes) return -4;
        if (i < n_exact && (ex_w[i] < 0 || ex_w[i] >= n_words)) return -4;
    }
    for (int32_t k = 0; k < n_short; k++)
        if (sh_w[k] < 0 || sh_w[k] >= n_words) return -4;
    for (int64_t i = 0; i < n_cls; i++) {
        int32_t s = step_(e, state, classes[i]);
        if (s < -1) return s;
        if (i < n_exact) {
            if (s >= 0) out[ex_w[i]] |= ex_b[i];
        } else {
            live_longer[i - n_exact] = (uint8_t)(s >= 0);
        }
    }
    if (n_short) {
        uint8_t *ok = (uint8_t *)malloc((size_t)n_short);
        if (!ok) return -2;
        int rc = llama_cffi_gengine_pchar_ok(e, state, pchars, n_short, ok);
        if (!rc)
            for (int32_t k = 0; k < n_short; k++)
                if (ok[k]) out[sh_w[k]] |= sh_b[k];
        free(ok);
        if (rc) return rc;
    }
    return 0;
}
