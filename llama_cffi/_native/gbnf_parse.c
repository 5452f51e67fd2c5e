/* GBNF text parsed as llama.cpp's llama_grammar_parser::parse parses it (the same rules,
 * rule ids and generated names), for the texts it is sure of: anything else (any error,
 * a named or numbered token, a value past what the arrays hold) answers "unsure" and
 * llama_cffi.gbnf parses the text in Python (_FastParser, then _Parser, the reference
 * port of llama.cpp's parser, which says what is wrong).
 *
 * Nested groups are parsed on an explicit stack of frames, not by recursion. Rules are
 * built in `scratch` (a group's rule above the rule it is in) and copied into `elems`
 * once finished; every write is checked against the array's capacity. */
#include <stdint.h>
#include <string.h>

#include "llama_cffi.h"

enum { P_END = 0, P_ALT = 1, P_REF = 2, P_CHAR = 3, P_CHAR_NOT = 4, P_RNG = 5, P_CHAR_ALT = 6, P_ANY = 7 };
#define P_MAX_REPETITION 2000 /* llama.cpp's MAX_REPETITION_THRESHOLD */
#define P_MAX_DEPTH 64 /* groups nested deeper: unsure (the reference parses them) */
#define P_UNSURE 1

typedef struct {
    int64_t rule_start;  /* where this rule's elements begin in scratch (pairs) */
    int64_t last;        /* last_sym_start */
    uint64_t n_prev;     /* n_prev_rules */
    int32_t rule_id;
    int32_t n_before;    /* a group's: the symbol count before its id */
    int nested;
} p_frame;

typedef struct {
    const unsigned char *s;
    int64_t n;
    uint32_t *elems;
    int64_t cap_elems, n_elems;
    uint32_t *scratch;
    int64_t cap_scratch, n_scratch;
    int32_t *rule_off, *rule_len, *sym;
    int32_t cap_syms, n_syms;
    int32_t *hash;
    int32_t hash_mask;
    int64_t name_off, name_len; /* the rule being defined: the base of generated names */
} p_parser;

static int at(const p_parser *g, int64_t p) { return p < g->n ? g->s[p] : 0; }

static int is_digit(int c) { return '0' <= c && c <= '9'; }

static int is_word(int c) { return ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || c == '-' || is_digit(c); }

static int64_t parse_space(const p_parser *g, int64_t p, int newline_ok) {
    for (;;) {
        const int c = at(g, p);
        if (c == '#') {
            while (p < g->n && g->s[p] != '\r' && g->s[p] != '\n') p++;
        } else if (c == ' ' || c == '\t' || (newline_ok && (c == '\r' || c == '\n'))) {
            p++;
        } else {
            return p;
        }
    }
}

static uint32_t name_hash(const unsigned char *s, int64_t len) {
    uint32_t h = 2166136261u;
    for (int64_t i = 0; i < len; i++) h = (h ^ s[i]) * 16777619u;
    return h;
}

/* the id of a symbol: its name's, made when new (get_symbol_id); -1 past the arrays */
static int32_t plain_symbol(p_parser *g, int64_t off, int64_t len) {
    uint32_t slot = name_hash(g->s + off, len) & (uint32_t)g->hash_mask;
    for (;;) {
        const int32_t id = g->hash[slot];
        if (id < 0) break;
        const int32_t *e = g->sym + 3 * (int64_t)id;
        if (e[1] == len && memcmp(g->s + e[0], g->s + off, (size_t)len) == 0) return id;
        slot = (slot + 1) & (uint32_t)g->hash_mask;
    }
    if (g->n_syms >= g->cap_syms || 2 * (int64_t)(g->n_syms + 1) > (int64_t)g->hash_mask + 1) return -1;
    const int32_t id = g->n_syms++;
    g->hash[slot] = id;
    g->sym[3 * (int64_t)id] = (int32_t)off;
    g->sym[3 * (int64_t)id + 1] = (int32_t)len;
    g->sym[3 * (int64_t)id + 2] = -1;
    g->rule_off[id] = -1;
    g->rule_len[id] = 0;
    return id;
}

/* a generated symbol: "<rule name>_<id>" (generate_symbol_id); -1 past the arrays */
static int32_t generated_symbol(p_parser *g) {
    if (g->n_syms >= g->cap_syms) return -1;
    const int32_t id = g->n_syms++;
    g->sym[3 * (int64_t)id] = (int32_t)g->name_off;
    g->sym[3 * (int64_t)id + 1] = (int32_t)g->name_len;
    g->sym[3 * (int64_t)id + 2] = id;
    g->rule_off[id] = -1;
    g->rule_len[id] = 0;
    return id;
}

/* one (type, value) pair at the end of an array of cap pairs holding *n: -1 when full */
static int put(uint32_t *pairs, int64_t cap, int64_t *n, uint32_t type, uint32_t value) {
    if (*n >= cap) return -1;
    pairs[2 * *n] = type;
    pairs[2 * *n + 1] = value;
    (*n)++;
    return 0;
}

/* onto the rule under construction (scratch), or onto the finished rules (elems) */
static int push(p_parser *g, uint32_t type, uint32_t value) {
    return put(g->scratch, g->cap_scratch, &g->n_scratch, type, value);
}

static int out(p_parser *g, uint32_t type, uint32_t value) { return put(g->elems, g->cap_elems, &g->n_elems, type, value); }

/* the scratch pairs [from, to) into elems (n_elems at the start) */
static int out_copy(p_parser *g, int64_t from, int64_t to) {
    if (to - from > g->cap_elems - g->n_elems) return -1;
    memcpy(g->elems + 2 * g->n_elems, g->scratch + 2 * from, (size_t)(to - from) * 2 * sizeof(uint32_t));
    g->n_elems += to - from;
    return 0;
}

/* one character of a literal or class at p (parse_char): its value, p moved past it */
static int parse_char(const p_parser *g, int64_t *p, uint32_t *value) {
    const int c = at(g, *p);
    if (c == '\\') {
        const int e = at(g, *p + 1);
        int size = 0;
        switch (e) {
            case 'x': size = 2; break;
            case 'u': size = 4; break;
            case 'U': size = 8; break;
            case 't': *value = '\t'; *p += 2; return 0;
            case 'r': *value = '\r'; *p += 2; return 0;
            case 'n': *value = '\n'; *p += 2; return 0;
            case '\\': case '"': case '[': case ']': case '-': *value = (uint32_t)e; *p += 2; return 0;
            default: return P_UNSURE; /* an unknown escape */
        }
        uint32_t v = 0;
        for (int i = 0; i < size; i++) {
            const int h = at(g, *p + 2 + i);
            if ('a' <= h && h <= 'f') v = (v << 4) + (uint32_t)(h - 'a' + 10);
            else if ('A' <= h && h <= 'F') v = (v << 4) + (uint32_t)(h - 'A' + 10);
            else if (is_digit(h)) v = (v << 4) + (uint32_t)(h - '0');
            else return P_UNSURE; /* fewer hex digits than the escape takes */
        }
        *value = v;
        *p += 2 + size;
        return 0;
    }
    if (c == 0) return P_UNSURE;
    /* well-formed UTF-8 (the caller's text is): one code point */
    const int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (*p + len > g->n) return P_UNSURE;
    uint32_t v = len == 1 ? (uint32_t)c : len == 2 ? (uint32_t)(c & 0x1F) : len == 3 ? (uint32_t)(c & 0x0F) : (uint32_t)(c & 0x07);
    for (int i = 1; i < len; i++) v = (v << 6) | (uint32_t)(g->s[*p + i] & 0x3F);
    *value = v;
    *p += len;
    return 0;
}

/* digits at p (at most 18), their value; p moved past them */
static int parse_int(const p_parser *g, int64_t *p, uint64_t *value) {
    uint64_t v = 0;
    int n = 0;
    while (is_digit(at(g, *p))) {
        if (++n > 18) return P_UNSURE;
        v = v * 10 + (uint64_t)(at(g, *p) - '0');
        (*p)++;
    }
    if (n == 0) return P_UNSURE;
    *value = v;
    return 0;
}

/* handle_repetitions on frame f: the last item repeated min to max (has_max) times */
static int repeat(p_parser *g, p_frame *f, uint64_t min, int has_max, uint64_t max) {
    const int64_t start = f->last, end = g->n_scratch, len = end - start;
    if (len == 0) return P_UNSURE; /* nothing before the operator */
    if (has_max && max < min) return P_UNSURE;
    const uint64_t total = (has_max && max > 0) ? max : min > 0 ? min : 1;
    if (f->n_prev * total > P_MAX_REPETITION) return P_UNSURE;
    if (min == 0) {
        g->n_scratch = start; /* the item's pairs stay where they are until the rules below are out */
    } else {
        for (uint64_t i = 1; i < min; i++) {
            if (len > g->cap_scratch - g->n_scratch) return -1;
            memcpy(g->scratch + 2 * g->n_scratch, g->scratch + 2 * start, (size_t)len * 2 * sizeof(uint32_t));
            g->n_scratch += len;
        }
    }
    const uint64_t n_opt = has_max ? max - min : 1;
    int32_t last_rec = 0;
    for (uint64_t i = 0; i < n_opt; i++) {
        const int32_t id = generated_symbol(g);
        if (id < 0) return -1;
        const int64_t off = g->n_elems;
        if (out_copy(g, start, end) != 0) return -1;
        if ((i > 0 || !has_max) && out(g, P_REF, (uint32_t)(has_max ? last_rec : id)) != 0) return -1;
        if (out(g, P_ALT, 0) != 0 || out(g, P_END, 0) != 0) return -1;
        g->rule_off[id] = (int32_t)off;
        g->rule_len[id] = (int32_t)(g->n_elems - off);
        last_rec = id;
    }
    if (n_opt > 0 && push(g, P_REF, (uint32_t)last_rec) != 0) return -1;
    f->n_prev *= total;
    return 0;
}

/* rule `id`: the scratch pairs from `from` on and END, into elems; scratch cut back */
static int finish_rule(p_parser *g, int32_t id, int64_t from) {
    if (push(g, P_END, 0) != 0) return -1;
    const int64_t off = g->n_elems;
    if (out_copy(g, from, g->n_scratch) != 0) return -1;
    g->rule_off[id] = (int32_t)off;
    g->rule_len[id] = (int32_t)(g->n_elems - off);
    g->n_scratch = from;
    return 0;
}

int llama_cffi_gbnf_parse(const char *text, int64_t n_text, uint32_t *elems, int64_t cap_elems, uint32_t *scratch,
                          int64_t cap_scratch, int32_t *rule_off, int32_t *rule_len, int32_t *sym, int32_t cap_syms,
                          int32_t *hash, int32_t hash_size, int32_t *counts) {
    if (!text || n_text < 0 || n_text > INT32_MAX || !elems || cap_elems < 0 || cap_elems > INT32_MAX || !scratch || cap_scratch < 0 ||
        !rule_off || !rule_len || !sym || cap_syms < 0 || !hash || hash_size < 2 || (hash_size & (hash_size - 1)) ||
        !counts)
        return -4;
    p_parser g = {(const unsigned char *)text, n_text, elems, cap_elems, 0, scratch, cap_scratch, 0,
                  rule_off, rule_len, sym, cap_syms, 0, hash, hash_size - 1, 0, 0};
    for (int32_t i = 0; i < hash_size; i++) hash[i] = -1;
    for (int64_t i = 0; i < n_text; i++)
        if (text[i] == 0) return P_UNSURE;
    p_frame frames[P_MAX_DEPTH + 1];
    int32_t max_nesting = 0;
    int64_t p = parse_space(&g, 0, 1);
    while (p < g.n) {
        /* parse_rule: a name, "::=", alternates, then a newline or the end */
        const int64_t name = p;
        while (is_word(at(&g, p))) p++;
        if (p == name) return P_UNSURE;
        g.name_off = name;
        g.name_len = p - name;
        const int32_t rule_id = plain_symbol(&g, name, p - name);
        if (rule_id < 0) return -1;
        p = parse_space(&g, p, 0);
        if (!(at(&g, p) == ':' && at(&g, p + 1) == ':' && at(&g, p + 2) == '=')) return P_UNSURE;
        p = parse_space(&g, p + 3, 1);
        int depth = 0;
        p_frame *f = &frames[0];
        *f = (p_frame){g.n_scratch, g.n_scratch, 1, rule_id, 0, 0};
        for (;;) {
            const int c = at(&g, p);
            if (c == '"') {
                p++;
                f->last = g.n_scratch;
                f->n_prev = 1;
                while (at(&g, p) != '"') {
                    uint32_t v;
                    if (at(&g, p) == 0 || parse_char(&g, &p, &v) != 0) return P_UNSURE;
                    if (push(&g, P_CHAR, v) != 0) return -1;
                }
                p = parse_space(&g, p + 1, f->nested);
            } else if (c == '[') {
                p++;
                uint32_t start_type = P_CHAR;
                if (at(&g, p) == '^') {
                    p++;
                    start_type = P_CHAR_NOT;
                }
                f->last = g.n_scratch;
                f->n_prev = 1;
                while (at(&g, p) != ']') {
                    uint32_t v;
                    if (at(&g, p) == 0 || parse_char(&g, &p, &v) != 0) return P_UNSURE;
                    if (push(&g, g.n_scratch > f->last ? P_CHAR_ALT : start_type, v) != 0) return -1;
                    if (at(&g, p) == '-' && at(&g, p + 1) != ']') {
                        p++;
                        if (at(&g, p) == 0 || parse_char(&g, &p, &v) != 0) return P_UNSURE;
                        if (push(&g, P_RNG, v) != 0) return -1;
                    }
                }
                p = parse_space(&g, p + 1, f->nested);
            } else if (c == '<' || c == '!') {
                return P_UNSURE; /* tokens: llama_cffi.gbnf keeps them by name */
            } else if (is_word(c)) {
                const int64_t ref = p;
                while (is_word(at(&g, p))) p++;
                const int32_t id = plain_symbol(&g, ref, p - ref);
                if (id < 0) return -1;
                p = parse_space(&g, p, f->nested);
                f->last = g.n_scratch;
                f->n_prev = 1;
                if (push(&g, P_REF, (uint32_t)id) != 0) return -1;
            } else if (c == '(') {
                p = parse_space(&g, p + 1, 1);
                if (depth + 1 > P_MAX_DEPTH) return P_UNSURE;
                const int32_t n_before = g.n_syms;
                const int32_t sub = generated_symbol(&g);
                if (sub < 0) return -1;
                f = &frames[++depth];
                *f = (p_frame){g.n_scratch, g.n_scratch, 1, sub, n_before, 1};
                if (depth > max_nesting) max_nesting = depth;
            } else if (c == '.') {
                f->last = g.n_scratch;
                f->n_prev = 1;
                if (push(&g, P_ANY, 0) != 0) return -1;
                p = parse_space(&g, p + 1, f->nested);
            } else if (c == '*' || c == '+' || c == '?') {
                p = parse_space(&g, p + 1, f->nested);
                const int rc = c == '*' ? repeat(&g, f, 0, 0, 0) : c == '+' ? repeat(&g, f, 1, 0, 0) : repeat(&g, f, 0, 1, 1);
                if (rc != 0) return rc;
            } else if (c == '{') {
                p = parse_space(&g, p + 1, f->nested);
                uint64_t min = 0, max = 0;
                int has_max = 1;
                if (parse_int(&g, &p, &min) != 0) return P_UNSURE;
                p = parse_space(&g, p, f->nested);
                if (at(&g, p) == '}') {
                    max = min;
                    p = parse_space(&g, p + 1, f->nested);
                } else if (at(&g, p) == ',') {
                    p = parse_space(&g, p + 1, f->nested);
                    has_max = 0;
                    if (is_digit(at(&g, p))) {
                        if (parse_int(&g, &p, &max) != 0) return P_UNSURE;
                        has_max = 1;
                        p = parse_space(&g, p, f->nested);
                    }
                    if (at(&g, p) != '}') return P_UNSURE;
                    p = parse_space(&g, p + 1, f->nested);
                } else {
                    return P_UNSURE;
                }
                if (min > P_MAX_REPETITION) return P_UNSURE;
                if (has_max && max > P_MAX_REPETITION) has_max = 0;
                const int rc = repeat(&g, f, min, has_max, max);
                if (rc != 0) return rc;
            } else if (c == '|') {
                if (push(&g, P_ALT, 0) != 0) return -1;
                p = parse_space(&g, p + 1, 1);
                f->last = g.n_scratch;
                f->n_prev = 1;
            } else {
                /* the end of the alternates: the rule is done */
                const p_frame done = *f;
                if (finish_rule(&g, done.rule_id, done.rule_start) != 0) return -1;
                if (depth == 0) break;
                if (c != ')') return P_UNSURE;
                f = &frames[--depth];
                const int32_t made = g.n_syms - done.n_before;
                f->n_prev = made > 1 ? (uint64_t)made : 1;
                f->last = g.n_scratch;
                if (push(&g, P_REF, (uint32_t)done.rule_id) != 0) return -1;
                p = parse_space(&g, p + 1, f->nested);
            }
        }
        const int c = at(&g, p);
        if (c == '\r') {
            p += at(&g, p + 1) == '\n' ? 2 : 1;
        } else if (c == '\n') {
            p++;
        } else if (p < g.n) {
            return P_UNSURE; /* expecting a newline or the end */
        }
        p = parse_space(&g, p, 1);
    }
    for (int32_t i = 0; i < g.n_syms; i++)
        if (rule_off[i] < 0) return P_UNSURE; /* used, never defined: the reference says where */
    counts[0] = (int32_t)g.n_elems;
    counts[1] = g.n_syms;
    counts[2] = max_nesting;
    return 0;
}

/* What llama_cffi_gbnf_parse left, for Python: the rules' elements in rule order as
 * indexes (idx) into the distinct (type, value) pairs met (dist, in the order met), and the
 * symbols' names (generated ones with "_<id>") one per line into names. Every offset read
 * is checked against what it indexes, every write against its array. out: the number of
 * indexes, of distinct pairs, of name bytes. 0, -1 past a capacity, -4 bad arguments. */
int llama_cffi_gbnf_unpack(const char *text, int64_t n_text, const uint32_t *elems, int64_t n_elems,
                           const int32_t *rule_off, const int32_t *rule_len, const int32_t *sym, int32_t n_syms,
                           int32_t *idx, int64_t cap_idx, uint32_t *dist, int64_t cap_dist, int32_t *hash,
                           int64_t hash_size, char *names, int64_t cap_names, int64_t *out) {
    if (!text || n_text < 0 || !elems || n_elems < 0 || !rule_off || !rule_len || !sym || n_syms < 0 || !idx ||
        cap_idx < 0 || !dist || cap_dist < 0 || !hash || hash_size < 2 || (hash_size & (hash_size - 1)) || !names ||
        cap_names < 0 || !out)
        return -4;
    for (int32_t i = 0; i < n_syms; i++) {
        const int64_t o = rule_off[i], k = rule_len[i], so = sym[3 * (int64_t)i], sl = sym[3 * (int64_t)i + 1];
        if (o < 0 || k < 0 || o + k > n_elems || so < 0 || sl < 0 || so + sl > n_text) return -4;
    }
    for (int64_t i = 0; i < hash_size; i++) hash[i] = -1;
    const uint64_t mask = (uint64_t)hash_size - 1;
    int64_t n_idx = 0, n_dist = 0, n_names = 0;
    for (int32_t r = 0; r < n_syms; r++) {
        const uint32_t *e = elems + 2 * (int64_t)rule_off[r];
        for (int32_t j = 0; j < rule_len[r]; j++) {
            const uint32_t t = e[2 * j], v = e[2 * j + 1];
            uint64_t slot = (((uint64_t)t << 32 | v) * 0x9E3779B97F4A7C15ull) >> 17 & mask;
            int32_t d;
            for (;;) {
                d = hash[slot];
                if (d < 0 || (dist[2 * (int64_t)d] == t && dist[2 * (int64_t)d + 1] == v)) break;
                slot = (slot + 1) & mask;
            }
            if (d < 0) {
                if (n_dist >= cap_dist || 2 * (n_dist + 1) > hash_size || n_dist >= INT32_MAX) return -1;
                d = (int32_t)n_dist++;
                dist[2 * (int64_t)d] = t;
                dist[2 * (int64_t)d + 1] = v;
                hash[slot] = d;
            }
            if (n_idx >= cap_idx) return -1;
            idx[n_idx++] = d;
        }
    }
    for (int32_t i = 0; i < n_syms; i++) {
        const int64_t so = sym[3 * (int64_t)i], sl = sym[3 * (int64_t)i + 1];
        const int32_t gen = sym[3 * (int64_t)i + 2];
        char digits[12];
        int nd = 0;
        if (gen >= 0) {
            uint32_t x = (uint32_t)gen;
            do {
                digits[nd++] = (char)('0' + x % 10);
                x /= 10;
            } while (x);
        }
        const int64_t need = sl + (gen >= 0 ? 1 + nd : 0) + (i + 1 < n_syms ? 1 : 0);
        if (need > cap_names - n_names) return -1;
        memcpy(names + n_names, text + so, (size_t)sl);
        n_names += sl;
        if (gen >= 0) {
            names[n_names++] = '_';
            while (nd) names[n_names++] = digits[--nd];
        }
        if (i + 1 < n_syms) names[n_names++] = '\n';
    }
    out[0] = n_idx;
    out[1] = n_dist;
    out[2] = n_names;
    return 0;
}


/* Whether no rule can reach itself before matching a character: check_grammar's first
 * question (llama_cffi.gbnf: _Leading, its successors, then _acyclic), for the C parser's
 * grammars. The n_rules rules' elements in rule order (types[j], values[j]; rule r is
 * rule_len[r] of them). A rule derives the empty string when one of its alternatives is
 * empty or made only of references to such rules; a rule's successors are, in each of its
 * alternatives, the leading references up to the first to a rule that does not. 1: that
 * graph has no cycle; 0: it has one (the Python checks then say where); -1: work holds
 * fewer than 6 n_elems + 5 n_rules + 2 ints; -4: bad arguments, a reference to no rule
 * among them (checked before anything else is read). */
int llama_cffi_gbnf_no_left_cycle(const uint8_t *types, const uint32_t *values, int64_t n_elems,
                                  const int32_t *rule_len, int32_t n_rules, int32_t *work, int64_t cap_work) {
    if (!types || !values || n_elems < 0 || n_elems > INT32_MAX || !rule_len || n_rules < 0 || !work || cap_work < 0)
        return -4;
    int64_t total = 0;
    for (int32_t r = 0; r < n_rules; r++) {
        if (rule_len[r] < 0) return -4;
        total += rule_len[r];
    }
    if (total != n_elems) return -4;
    for (int64_t j = 0; j < n_elems; j++)
        if (types[j] == P_REF && values[j] >= (uint32_t)n_rules) return -4;
    if (cap_work < 6 * n_elems + 5 * (int64_t)n_rules + 2) return -1;
    int32_t *alt_rule = work, *alt_s = alt_rule + n_elems, *alt_e = alt_s + n_elems, *pending = alt_e + n_elems;
    int32_t *occ = pending + n_elems, *succ = occ + n_elems;
    int32_t *occ_start = succ + n_elems, *succ_start = occ_start + n_rules + 1;
    int32_t *nullable = succ_start + n_rules + 1, *todo = nullable + n_rules, *count = todo + n_rules;
    /* the alternatives that start with references or are empty */
    int64_t n_alt = 0, j = 0;
    for (int32_t r = 0; r < n_rules; r++) {
        const int64_t end = j + rule_len[r];
        int64_t a = j;
        while (a < end) {
            int64_t e = a;
            while (e < end && types[e] == P_REF) e++;
            const int whole = e < end && (types[e] == P_END || types[e] == P_ALT);
            if (e > a || whole) {
                alt_rule[n_alt] = r;
                alt_s[n_alt] = (int32_t)a;
                alt_e[n_alt] = (int32_t)e;
                pending[n_alt] = whole ? (int32_t)(e - a) : -1;
                n_alt++;
            }
            int64_t q = e;
            while (q < end && types[q] != P_END && types[q] != P_ALT) q++;
            a = q + 1;
        }
        j = end;
    }
    /* the rules that derive the empty string (a worklist; _Leading._nullable) */
    int64_t n_todo = 0;
    for (int32_t r = 0; r < n_rules; r++) nullable[r] = count[r] = 0;
    for (int64_t k = 0; k < n_alt; k++) {
        if (pending[k] == 0) {
            if (!nullable[alt_rule[k]]) {
                nullable[alt_rule[k]] = 1;
                todo[n_todo++] = alt_rule[k];
            }
        } else if (pending[k] > 0) {
            for (int64_t i = alt_s[k]; i < alt_e[k]; i++) count[values[i]]++;
        }
    }
    occ_start[0] = 0;
    for (int32_t r = 0; r < n_rules; r++) {
        occ_start[r + 1] = occ_start[r] + count[r];
        count[r] = occ_start[r]; /* (now each rule's next free slot) */
    }
    for (int64_t k = 0; k < n_alt; k++)
        if (pending[k] > 0)
            for (int64_t i = alt_s[k]; i < alt_e[k]; i++) occ[count[values[i]]++] = (int32_t)k;
    while (n_todo) {
        const int32_t r = todo[--n_todo];
        for (int32_t i = occ_start[r]; i < occ_start[r + 1]; i++) {
            const int32_t k = occ[i];
            if (--pending[k] == 0 && !nullable[alt_rule[k]]) {
                nullable[alt_rule[k]] = 1;
                todo[n_todo++] = alt_rule[k];
            }
        }
    }
    /* each rule's successors (the alternatives are in rule order: so are these) */
    int64_t n_succ = 0;
    for (int32_t r = 0; r <= n_rules; r++) succ_start[r] = 0;
    for (int64_t k = 0; k < n_alt; k++) {
        for (int64_t i = alt_s[k]; i < alt_e[k]; i++) {
            succ[n_succ++] = (int32_t)values[i];
            succ_start[alt_rule[k] + 1]++;
            if (!nullable[values[i]]) break;
        }
    }
    for (int32_t r = 0; r < n_rules; r++) succ_start[r + 1] += succ_start[r];
    /* Kahn's algorithm over the rules that have successors (_acyclic) */
    for (int32_t r = 0; r < n_rules; r++) count[r] = 0; /* (now the in-degrees) */
    for (int64_t i = 0; i < n_succ; i++) count[succ[i]]++;
    int64_t n_with = 0, done = 0;
    n_todo = 0;
    for (int32_t r = 0; r < n_rules; r++) {
        if (succ_start[r + 1] == succ_start[r]) continue;
        n_with++;
        if (count[r] == 0) todo[n_todo++] = r;
    }
    while (n_todo) {
        const int32_t r = todo[--n_todo];
        done++;
        for (int32_t i = succ_start[r]; i < succ_start[r + 1]; i++) {
            const int32_t v = succ[i];
            if (--count[v] == 0 && succ_start[v + 1] > succ_start[v]) todo[n_todo++] = v;
        }
    }
    return done == n_with ? 1 : 0;
}
