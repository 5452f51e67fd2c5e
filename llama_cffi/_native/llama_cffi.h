/* llama_cffi's own C API: the helpers the extension adds beside llama.h.
 *
 * build_ffi.py reads the declarations of this header into the cffi cdef (preprocessor
 * lines dropped), so everything declared here is reachable from Python as
 * llama_cffi._binding.lib.<name>; the definitions are in the .c files beside it. Keep it
 * to declarations cffi can parse: no macros, no inline code. */
#ifndef LLAMA_CFFI_H
#define LLAMA_CFFI_H

#include <stdbool.h>
#include <stdint.h>

struct gguf_context;

/* log routing (log.c): llama.cpp/ggml -> level filter in C -> Python logging. Messages
   below llama_cffi_log_min_level, or any while llama_cffi_log_enabled is 0, never reach
   Python (no GIL taken). */
extern int llama_cffi_log_min_level;
extern int llama_cffi_log_enabled;
void llama_cffi_log_install(void);

/* abort (abort.c): ggml polls the callback after every graph node, on the thread that
   called llama_decode. The combined callback checks a flag (settable from any thread)
   and, at most once per interval, calls Python (a user callable; also lets Ctrl-C
   through). */
typedef struct {
    volatile int flag;      /* nonzero: abort now */
    void *py;               /* ffi.new_handle of the Python state, or NULL */
    int64_t interval_us;    /* minimum time between Python polls */
    int64_t next_us;        /* next time Python may be polled */
} llama_cffi_abort_state;
bool llama_cffi_abort_combined(void *state);
bool llama_cffi_abort_flag(void *flag_int_ptr);

/* softmax kernels over one float32 row (kernels.c; see llama_cffi.kernels) */
double llama_cffi_softmax_sum(int n, float *y, const float *x, float max);
double llama_cffi_softmax_dot(int n, const float *y, const float *x, float max);
const char *llama_cffi_softmax_impl(void);
/* positions of the k largest values of a NaN-free row summarised by 64 interleaved
   group maxima (kernels.c; see samplers.candidates.Candidates.top); k or -1 */
int llama_cffi_top_k_grouped(int n, const float *row, int cols, const float *gmax, int k, int64_t *out);
/* the k best of row's n values among the positions whose bit is set in words (bit p % 32 of
   word p / 32; (n + 31) / 32 words), descending, ties by lower position, into ids/logits;
   then, when fewer than k of those are above -inf, the lowest positions the mask leaves at
   -inf (bit clear, or -inf in the row), with -inf: a stable sort of the masked row by
   -value, cut to k (kernels.c; see llama_cffi.kernels.masked_top_k). Returns how many
   above -inf it wrote first, -1 bad arguments or out of memory, -2 a NaN at an allowed
   position */
int32_t llama_cffi_masked_top_k(int32_t n, const float *row, const uint32_t *words, int32_t k, int32_t *ids,
                                float *logits);
/* llama_cffi_masked_top_k of n_rows rows (rows[r], words[r]) into row r of ids/logits
   (n_rows x k, contiguous), its count in n_finite[r]: each distinct mask (by address)
   scanned once for its nonzero words, which its rows then read alone; on up to n_threads
   threads (the caller's and the process's pool), as many as the nonzero words to read
   warrant: 0, or the first row's error (-1, -2) */
int32_t llama_cffi_masked_top_k_rows(int32_t n_rows, int32_t n, const float *const *rows, const uint32_t *const *words,
                                     int32_t k, int32_t *ids, float *logits, int32_t *n_finite, int32_t n_threads);

/* many logits rows at once (rows.c; see llama_cffi.kernels.RowMeasures). Row r (n
   floats at rows[r]) writes slot dest[r] (r when dest is NULL): its max (NaN when it
   holds NaN), status (0 ok, 1 NaN, 2 +inf, 3 every value -inf), and, where measure[r] is
   nonzero (every row when measure is NULL), the
   log-normaliser log(sum(exp(x - max))) and the entropy (nats; NaN unless status is 0;
   where measure[r] is 0 the slot's earlier ones are left as they were);
   and its k[r] best candidates (at most k_stride; none for a NaN row): ids and logits,
   descending, ties by lower id, into top_ids/top_logits[slot * k_stride ...], their
   number in out_n_top[slot]. Rows are shared among n_threads threads (the caller's and a
   pool kept for the process). 0, -1 on bad arguments, -2 out of memory. */
int llama_cffi_rows_measure(int n_rows, const float *const *rows, int n, const int32_t *k, const int32_t *dest,
                            int k_stride, const int32_t *measure, int n_threads, float *out_max, double *out_log_norm,
                            double *out_entropy, int32_t *out_status, int32_t *out_n_top, int32_t *top_ids,
                            float *top_logits);
/* worker threads the process's pool holds now (pool.c: shared by the rows and the grammar
   masks; it grows on demand, never shrinks) */
int llama_cffi_rows_pool_size(void);
/* log(sum(exp(x - max[r]))) over the first n[r] of each stride floats of x, the sum
   with llama_cffi_softmax_sum (samplers.chain_batch: a chain's sampling surprisal for
   many rows); 0, -1 bad arguments, -2 out of memory */
int llama_cffi_rows_log_sum(int n_rows, const float *x, int stride, const int32_t *n, const float *max, double *out);
/* samplers.chain_batch's top-p and dist steps on many rows of k sorted candidates, in
   numpy's arithmetic (float32 running sums, then float32 divisions and running sums; the
   draw's float64 running sum): its numpy code stays the reference the tests compare to.
   top_p_rows: pr holds exp(x - x[r][0]) for the candidates still in (0 past n[r]); n[r]
   becomes the count of the shortest prefix whose normalised running sum reaches p, taken
   at position min_keep - 1 or later (unchanged when none does), and x[r][j] for j past it
   -inf. dist_rows: sel[r] = the first position j whose float64 running sum of pr reaches
   that sum at n[r] - 1 times u[r] (at most n[r] - 1). Both: 0, -1 on bad arguments (an
   n[r] outside [1, k] included) */
int llama_cffi_top_p_rows(int n_rows, int k, float *x, const float *pr, int32_t *n, float p, int min_keep);
int llama_cffi_dist_rows(int n_rows, int k, const float *pr, const int32_t *n, const double *u, int32_t *sel);

/* llama-perplexity's KL-divergence rows (kl_rows.c; see llama_cffi.kernels.kl_base_rows
   and kl_divergence_rows): row r of logits (n_vocab floats at logits + r*logits_stride)
   scored against tokens[r], in perplexity.cpp's arithmetic. kl_base_rows writes the
   base-file row r (row_stride uint16: scale, min_log_prob, n_vocab values, zeroed padding)
   to out + r*row_stride and -log p(tokens[r]) to out_nll[r] (NaN, row untouched, when the
   row holds NaN or its maximum is not finite). kl_rows compares row r with base row r:
   nll, nll_base, the KL divergence, whether the top tokens agree and p - p_base; status[r]
   1 for a NaN or non-finite row (its values unwritten), else 0. Rows are shared among
   n_threads threads. 0, or -1 on bad arguments (a token outside [0, n_vocab) included). */
/* expf of each of n floats, as the C library computes it: with vector 1, 4 at a time in
   AVX2 where the CPU has it (kl_rows.c's fast path, handing the uncertain values to
   expf), with 0 by calling expf for each (the reference); 0, -1 on bad arguments */
int llama_cffi_expf(int n, const float *x, float *out, int vector);
int llama_cffi_kl_base_rows(int n_rows, int n_vocab, const float *logits, int64_t logits_stride,
                            const int32_t *tokens, uint16_t *out, int64_t row_stride, int n_threads, double *out_nll);
int llama_cffi_kl_rows(int n_rows, int n_vocab, const float *logits, int64_t logits_stride, const int32_t *tokens,
                       const uint16_t *base, int64_t row_stride, int n_threads, float *nll, float *nll_base,
                       double *kld, int32_t *same_top, float *p_diff, int32_t *status);

/* backend sampling (measure_sampler.c; see llama_cffi.kernels.RowMeasures.read_device and
   samplers.branch). llama_cffi_measure_sampler: a new sampler for the first place of a
   backend sampling chain; in llama.cpp's graph it sets the row's probs output to three
   floats [max, log(sum(exp(x - max))), entropy] and leaves the logits to the samplers
   after it (on the host it does nothing). llama_cffi_rows_from_device: after a decode,
   for output idx[r] (a batch index) of a sequence with such a chain, write slot dest[r]
   as llama_cffi_rows_measure would (max, log-normaliser, entropy, status; NaN measures
   when the output has none), and the candidates the chain left (at most k_stride; none
   when k[r] is 0), sorted by descending logit then ascending id; status 4 when the logit
   at position k[r] (a sampler's cut) is tied up to the last candidate that came back
   (tokens beyond may share it). 0, -1 on bad arguments, -2 out of memory. */
struct llama_sampler;
struct llama_context;
struct llama_sampler *llama_cffi_measure_sampler(void);
/* after backend_init: 1 when the sampler runs in the graph, 0 when its device cannot run
   it, -1 when it was not prepared for a graph (or has no backend implementation) */
int llama_cffi_sampler_on_backend(const struct llama_sampler *smpl);
int llama_cffi_rows_from_device(struct llama_context *ctx, int n_rows, const int32_t *idx, const int32_t *dest,
                                const int32_t *k, int k_stride, int n_vocab, float *out_max, double *out_log_norm,
                                double *out_entropy, int32_t *out_status, int32_t *out_n_top, int32_t *top_ids,
                                float *top_logits);

/* the whole vocabulary (vocab.c): every token's piece concatenated into buf, offsets
   (n_vocab + 1) and end-of-generation flags; the total bytes, minus the bytes needed
   when cap is too small, or INT64_MIN on a piece that cannot be read */
struct llama_vocab;
int64_t llama_cffi_vocab_pieces(const struct llama_vocab *vocab, bool special, char *buf, int64_t cap,
                                int64_t *offsets, uint8_t *eog);

/* backend libraries (backends.c; see llama_cffi.backends): ggml_backend_score() of the
   library at path (dlopen'd and closed again): > 0 usable on this CPU, 0 not, -1 cannot
   be opened, -2 exports no score; the last dlopen error; XCR0, the register state the OS
   saves (-1 off x86-64, 0 when OSXSAVE is clear); ask the kernel for AMX tile data
   (arch_prctl(ARCH_REQ_XCOMP_PERM): 0 granted, -1 refused or not Linux x86-64); and bind
   the CPU library loaded at path (its ggml-cpu.h functions and softmax kernel: 0 bound,
   -1 not loaded, -2 no softmax kernel in it) */
int llama_cffi_backend_score(const char *path);
const char *llama_cffi_dlerror(void);
int64_t llama_cffi_xcr0(void);
int llama_cffi_amx_request(void);
int llama_cffi_bind_cpu(const char *path);

/* GGUF (gguf_check.c): the index of a token string that repeats an earlier one in a
   GGUF string array (empty strings named "[EMPTY_<i>]" as llama.cpp's vocabulary loader
   names them), -1 if none, -2 when out of memory */
int64_t llama_cffi_gguf_duplicate_string(const struct gguf_context *g, int64_t key);
/* the shapes (ggml's ne[0..3]) of n named tensors of a GGUF file, read from its header
   (no tensor data; llama_cffi.mmproj_file): -1s for a tensor the file lacks; 0, or -1 when
   the file cannot be parsed or on bad arguments */
int llama_cffi_gguf_tensor_ne(const char *fname, int n, const char *const *names, int64_t *ne);

/* memory accounting (memory.cpp; see llama_cffi.memory_usage): what llama.cpp allocated
   for a context, read from its own objects (never estimated).
   llama_cffi_memory_buffers: llama.cpp's per-buffer-type breakdown (model weights, the
   context's memory modules, compute buffers), bytes; device is the buffer type's device
   ("" when it has none), host is ggml_backend_buft_is_host.
   llama_cffi_memory_tensors: every tensor (views excluded) of every buffer of the
   context's memory modules, plus one row per buffer (name "", type -1, bytes = the
   buffer's size). module counts the memory modules in a fixed order; kind is "kv",
   "kv_swa", "recurrent" or "other" (a module whose tensors are not listed: one buffer row
   per buffer type, from its memory_breakdown); cells is the module's size in cells.
   Both return the number of rows (write at most n_max; call again with a larger array
   when the result is larger), -1 when llama.cpp threw (the message in
   llama_cffi_memory_error()), or LLAMA_CFFI_MEMORY_UNAVAILABLE (-3) in a build whose
   llama.cpp source memory.cpp does not compile against (the reason, too, in
   llama_cffi_memory_error()). */
#define LLAMA_CFFI_MEMORY_UNAVAILABLE -3
typedef struct {
    char buffer_type[64];
    char device[64];
    int32_t host;
    uint64_t model;
    uint64_t context;
    uint64_t compute;
} llama_cffi_buffer_row;
typedef struct {
    int32_t module;
    char kind[16];
    char buffer_type[64];
    char device[64];
    int32_t host;
    char name[64];
    int32_t type;
    uint32_t cells;
    uint64_t bytes;
} llama_cffi_tensor_row;
struct llama_context;
int32_t llama_cffi_memory_buffers(const struct llama_context *ctx, llama_cffi_buffer_row *out, int32_t n_max);
int32_t llama_cffi_memory_tensors(const struct llama_context *ctx, llama_cffi_tensor_row *out, int32_t n_max);
const char *llama_cffi_memory_error(void);

/* grammar masks (trie_walk.c; see llama_cffi._trie_walk and samplers.grammar.compiled):
   walks of a vocabulary's code-point trie under a grammar's transition table. Trie
   nodes are numbered level by level, the root is n_nodes; arrays marked + have
   n_nodes + 1 entries. max_depth: the deepest level (the longest token, in code
   points). pchar_slot[token]: the token's partial UTF-8 character (an index below
   n_pchars), -1 for a token that ends on a whole character. root_pt: the tokens that
   are only a partial character. */
#define LLAMA_CFFI_TRANS_UNKNOWN -2
#define LLAMA_CFFI_PEND_TRANS 1
#define LLAMA_CFFI_PEND_RUN 2
#define LLAMA_CFFI_PEND_PCHAR 3
/* one trie node's fields that the walks and scans read, in one record (the node arrays
   of llama_cffi_trie below, packed by llama_cffi_trie_pack): a walk that reaches a node
   reads one or two cache lines, not one per array; siblings are adjacent records. cpi is
   node_cpi (-1 for the root) */
typedef struct {
    int32_t first_child, n_child, row_start, row_end, n_term, height, cpi;
    uint8_t has_pt, below_flags, pad[2];
    uint64_t below_asc[2];
} llama_cffi_tnode;
typedef struct {
    int32_t n_nodes;
    int32_t n_vocab;
    int32_t max_depth;
    int32_t n_pchars;
    int32_t n_root_pt;
    const int32_t *level_base;  /* max_depth + 1: level j is nodes level_base[j] .. level_base[j + 1] */
    const int32_t *node_cpi;    /* per node: its code point's index */
    const int32_t *parent;      /* per node */
    const int32_t *first_child; /* + */
    const int32_t *n_child;     /* + */
    const int32_t *row_start;   /* + */
    const int32_t *row_end;     /* + */
    const int32_t *n_term;      /* + */
    const uint8_t *has_pt;      /* +: a token ending inside a character ends here */
    const int32_t *height;      /* +: the most code points below the node */
    const int32_t *order;       /* per row: the token */
    const int32_t *pchar_slot;  /* per token */
    const int32_t *root_pt;     /* n_root_pt tokens */
    /* +, 2 words per node: the ASCII code points strictly below it (bit cp % 64 of word cp / 64) */
    const uint64_t *below_asc;
    /* +: bit 0, a code point >= 128 strictly below that is not special
       (llama_cffi_trie_special_cps); bit 1, a token ending inside a character at or below
       (has_pt here or below); bit 2, a special code point strictly below */
    const uint8_t *below_flags;
    /* the nodes (not the root) with many children, increasing (n_big of them), and where
       each one's children start in a grammar's big_kids (n_big + 1 values from 0): a
       walk reaching one skips the children of a class its state does not take at once */
    int32_t n_big;
    int32_t big_min; /* every big node has at least this many children */
    const int32_t *big_nodes;
    const int32_t *big_base;
    /* the arrays above packed (llama_cffi_trie_pack): n_nodes + 1 records, and per row r
       the pair (order[r], pchar_slot[order[r]]); the walks read these */
    const llama_cffi_tnode *nodes;
    const int32_t *row_tok;
} llama_cffi_trie;
/* set the bits of tokens[0..n) in mask (n_words words, bit t % 32 of word t / 32); 0, or
   -1 for a token past the mask (nothing set from it on) */
int llama_cffi_mask_set(uint32_t *mask, int32_t n_words, const int32_t *tokens, int32_t n);
/* a run's code-point key (see samplers.grammar.compiled.CompiledGrammar._cp_key): bit i
   (byte i / 8, bit i % 8) of out set when class cls_of_cp[i] is in run (bit c of word c / 64;
   n_classes / 64 + 1 words), for i < n_cps, then one byte: run's bit n_classes (the
   partial-character bit). out: (n_cps + 7) / 8 + 1 bytes. 0, -1 for a class out of range */
int llama_cffi_cp_key(const int32_t *cls_of_cp, int32_t n_cps, int32_t n_classes, const uint64_t *run, uint8_t *out);
/* clear in mask (ceil(t->n_vocab / 32) words) the bits of the tokens below each of nodes
   (n_nodes trie nodes, their own included: rows row_start .. row_end) and of tokens
   (n_tokens ids); 0, or -1 for a node or token out of range (the mask partly cleared) */
int llama_cffi_trie_clear_below(const llama_cffi_trie *t, uint32_t *mask, const int32_t *nodes, int32_t n_nodes,
                                const int32_t *tokens, int32_t n_tokens);
/* fill nodes (n_nodes + 1 records) and row_tok (2 * n_vocab values) from t's node arrays
   (their indices checked: a row, token or slot out of range is -1, nothing else
   written past the buffers); 0 or -1 */
int llama_cffi_trie_pack(const llama_cffi_trie *t, llama_cffi_tnode *nodes, int32_t *row_tok);
/* one grammar on one trie. trans[state * n_classes + class]: the successor state, -1
   none, LLAMA_CFFI_TRANS_UNKNOWN not computed yet (n_states rows). A state s below
   n_run_states with run_known[s] has its run in run_words[s * W ..] and run_len[s]: every
   string of at most run_len[s] characters of those classes leaves it alive (see
   trie_walk.c); one below n_pchar_states with pchar_known[s] says in
   pchar_ok[s * n_pchars + slot] whether it can complete each partial character. */
typedef struct {
    int32_t n_classes;
    int32_t W;               /* n_classes / 64 + 1 words per class set */
    int32_t n_states;
    int32_t n_run_states;
    int32_t n_pchar_states;
    int32_t absorb_min_rows; /* a subtree this large waits for its state's run */
    const int32_t *cls_of_cpi; /* per code point index (the trie's node_cpi): its character class */
    int32_t n_cps;             /* the values of cls_of_cpi */
    /* 8 * W * 256 rows of 2 words: row (8 * w + b) * 256 + v, the ASCII code points (as in
       the trie's below_asc) of the classes 64 * w + 8 * b + i for the bits i of v */
    const uint64_t *asc_table;
    /* 2 * W words: the classes holding a code point >= 128 of the vocabulary that is not
       special (llama_cffi_trie_special_cps), then those holding a special one */
    const uint64_t *na_classes;
    const int32_t *trans;
    const uint8_t *run_known;
    const uint64_t *run_words;
    const int32_t *run_len;
    /* NULL, or per state below n_run_states with run_known: its closed run (W words, see
       llama_cffi_gengine_run): a subtree wholly of those classes is accepted whole from
       it, at any depth */
    const uint64_t *run_closed;
    const uint8_t *pchar_known;
    const uint8_t *pchar_ok;
    const int32_t *root_nodes; /* the root's children grouped by class (llama_cffi_trie_root_groups) */
    const int32_t *root_start; /* n_classes + 1: class c's are root_nodes[root_start[c] .. root_start[c + 1]] */
    /* NULL, or (llama_cffi_trie_big_groups) the children of the trie's big nodes grouped by
       class: big node i's are big_kids[big_base[i] .. big_base[i + 1]], and big_next[j]
       the position past the group holding position j */
    const int32_t *big_kids;
    const int32_t *big_next;
    /* NULL, or the grammar's llama_cffi_gengine: a walk of one mask (llama_cffi_trie_walk,
       llama_cffi_trie_mask; not llama_cffi_trie_masks, whose threads share the engine)
       then computes the transitions it meets instead of leaving them pending, reading
       them from the engine, not from trans, and may add states (the caller holds the
       engine; an engine error rc comes back as -100 + rc) */
    void *engine;
    /* with an engine and class_weight set, such a walk also computes the run of a state it
       needs (llama_cffi_gengine_run with these arguments, run_chain its scratch of
       run_cap + 1 values) when the state is below n_run_states, writing run_words, run_len
       and run_known (which must then be writeable), instead of leaving it pending */
    const double *class_weight;
    int32_t run_cap;
    int32_t max_run_stacks;
    int32_t *run_chain;
} llama_cffi_trie_grammar;
/* the root's children (n_child[root] of them) grouped by class (cls_of_cpi[node_cpi[node]]),
   for a grammar's llama_cffi_trie_grammar: out_nodes (n_child[root] values), out_start
   (n_classes + 1). 0, -1 bad data */
int llama_cffi_trie_root_groups(const llama_cffi_trie *t, const int32_t *cls_of_cpi, int32_t n_cps, int32_t n_classes,
                                int32_t *out_nodes, int32_t *out_start);
/* the children of each of the trie's big nodes grouped by class under a grammar (as
   root groups: cls_of_cpi, n_cps values, classes below n_classes) into kids and next
   (big_base[n_big] values each: see llama_cffi_trie_grammar's big_kids); 0, -1 bad
   data, -2 out of memory */
int llama_cffi_trie_big_groups(const llama_cffi_trie *t, const int32_t *cls_of_cpi, int32_t n_cps, int32_t n_classes,
                               int32_t *kids, int32_t *next);
/* the special code points (>= 128: Unicode's white space and line separators, which
   regular expressions' \s, \S and . tell apart from the rest), increasing, into out (cap
   values at least): how many there are, or -1 when cap is too small. A trie node's
   below_flags tell them apart from the other code points >= 128 below it, so a run of
   \S (every code point >= 128 but these) takes a subtree of Cyrillic or CJK whole */
int32_t llama_cffi_trie_special_cps(int32_t *out, int32_t cap);
/* a grammar's binding to a trie in one call (the Python version: TrieGrammar(...) and
   samplers.grammar's CompiledGrammar): uniq_cps (n_cps increasing code points, the trie's
   node_cpi indexes them; the first n_ascii below 128) and cp_weight (the trie's nodes per
   code point); the grammar's classes as intervals (edges: n_int + 1 increasing code points
   from 0, interval i = [edges[i], edges[i + 1]) of class interval_class[i]) and ascii_cls
   (128). Writes cls_of_cpi (n_cps), class_weight (n_classes: the trie's nodes per class),
   na_classes (2 * W words, W = n_classes / 64 + 1: as in llama_cffi_trie_grammar),
   asc_table (8 * W * 256 * 2 words, as in llama_cffi_trie_grammar) and the root groups
   (llama_cffi_trie_root_groups). 0, -1 bad arguments, -2 out of memory */
int llama_cffi_trie_bind(const llama_cffi_trie *t, const int32_t *uniq_cps, const double *cp_weight, int32_t n_cps,
                         int32_t n_ascii, const int32_t *edges, const int32_t *interval_class, int32_t n_int,
                         int32_t n_classes, const int32_t *ascii_cls, int32_t *cls_of_cpi, double *class_weight,
                         uint64_t *na_classes, uint64_t *asc_table, int32_t *root_nodes, int32_t *root_start);
/* the tokens of at most k characters whose j-th character (from 0) is of a class in
   runs[min(j, n_runs - 1)] (n_runs rows of n_classes / 64 + 1 words, 1 <= n_runs <=
   max_depth + 2: a run of one class set, or a chain whose states each follow their own,
   the last repeating; "the run" below): whole ones as
   bits of mask (OR-ed), those ending inside a character into pt_tokens with their depth
   in characters (pt_depth); the nodes where such paths leave the run (a class not in it,
   or a (k+1)-th character) into frontier, grouped by the parent's depth d and the class
   c (group d * n_classes + c: frontier[group_start[g] .. group_start[g + 1]],
   (k + 1) * n_classes + 1 entries), except the root's children that leave it (their
   class is not in run, or k is 0): those are implicit, the grammar's root groups
   (root_nodes), the same for every run, and a walk adds them itself (a vocabulary's
   first characters are tens of thousands of nodes, which a scan per run would list
   again). scratch holds 2 * frontier_cap values. on_out
   (n_nodes + 1 bytes, or NULL): which nodes are on such paths.
   0, -1 bad data, -2 out of memory, -3 a buffer too small */
int llama_cffi_trie_run_scan(const llama_cffi_trie *t, const int32_t *cls, int32_t n_classes, const uint64_t *runs,
                             int32_t n_runs, int32_t k, uint32_t *mask, int32_t *frontier, int32_t frontier_cap, int32_t *n_frontier,
                             int32_t *group_start, int32_t *pt_tokens, int32_t *pt_depth, int32_t pt_cap, int32_t *n_pt,
                             int32_t *scratch, uint8_t *on_out);
/* llama_cffi_trie_run_scan without on_out, faster: a node whose whole subtree is of the
   run's classes and within k characters has its tokens set at once, unvisited (as the
   trie's below_asc and below_flags tell with g's asc_table and na_classes: a subtree with
   a code point >= 128 only when every class holding one of its kind, special or not, is
   in the run).
   The same mask, partial tokens and groups (the nodes within a group may come in another
   order).
   With on_out (n_nodes + 1 bytes, zeroed by the caller) and absorbed (2 * absorbed_cap
   values), it also keeps what llama_cffi_trie_run_derive_skip needs: the nodes on the
   run's paths it visited (on_out), and those whose whole subtree it took unvisited, with
   their level (absorbed, *n_absorbed pairs); all NULL: neither (and only they when
   n_runs > 1: derivations are of one class set). */
int llama_cffi_trie_run_scan_skip(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, const uint64_t *runs,
                                  int32_t n_runs, int32_t k, uint32_t *mask, int32_t *frontier, int32_t frontier_cap,
                                  int32_t *n_frontier, int32_t *group_start, int32_t *pt_tokens, int32_t *pt_depth,
                                  int32_t pt_cap, int32_t *n_pt, int32_t *scratch, uint8_t *on_out,
                                  int32_t *absorbed, int32_t absorbed_cap, int32_t *n_absorbed);
/* the full-length (k = max_depth + 1) scan of run (W words, one class set) from the
   shared scan of a smaller set of code points (base_key: a bit per code point index, as
   samplers.grammar's _cp_key; base_nodes/base_depths its frontier, the root's children
   apart; base_pt/base_pt_depth its partial tokens): the base's frontier nodes and root
   children whose code points run holds, and base does not, are scanned below as
   llama_cffi_trie_run_scan_skip would (subtrees wholly of the run taken at once), the
   others kept. mask holds the base's mask and receives the tokens found; nodes/depths
   (cap values) the frontier with each node's parent depth; pt_tokens/pt_depth (pt_cap) the
   base's partial tokens and those found. 0, -1 bad arguments or data, -2 out of memory,
   -3 a buffer too small */
int llama_cffi_trie_run_scan_extend(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, const uint64_t *run,
                                    const uint8_t *base_key, int32_t key_len, const int32_t *base_nodes,
                                    const int32_t *base_depths, int32_t n_base, const int32_t *base_pt,
                                    const int32_t *base_pt_depth, int32_t n_base_pt, uint32_t *mask, int32_t *nodes,
                                    int32_t *depths, int32_t cap, int32_t *n_nodes_out, int32_t *pt_tokens,
                                    int32_t *pt_depth, int32_t pt_cap, int32_t *n_pt);
/* llama_cffi_trie_run_derive from a llama_cffi_trie_run_scan_skip base (its on_out and
   absorbed): the same frontier and groups (the nodes within a group may come in another
   order), reading only the nodes of level k, not the whole trie: the run's nodes of level
   k are those the base visited there and the level-k blocks below the subtrees it took
   whole. 0, -1 bad data, -2 out of memory, -3 frontier_cap too small */
int llama_cffi_trie_run_derive_skip(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, const uint64_t *run,
                                    int32_t k, const uint8_t *on, const int32_t *absorbed, int32_t n_absorbed,
                                    const int32_t *base_frontier, int32_t n_base, const int32_t *base_group_start,
                                    int32_t base_k, int32_t *frontier, int32_t frontier_cap, int32_t *n_frontier,
                                    int32_t *group_start);
/* a scan's frontier grouped for grammar g (as llama_cffi_trie_run_scan groups it): nodes
   (n, each < n_nodes) with their parent's depth (0 .. k) into frontier (n values) and
   group_start ((k + 1) * n_classes + 1 values), group d * n_classes + c holding the nodes
   of parent depth d and class c in g, in the order given. The scan itself (which nodes)
   depends only on the run's code points: this lets grammars share it.
   0, -1 bad data, -2 out of memory */
int llama_cffi_trie_group(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, const int32_t *nodes,
                          const int32_t *depths, int32_t n, int32_t k, int32_t *frontier, int32_t *group_start);
/* a llama_cffi_trie_run_scan_skip base's paths made whole: every node of the subtrees it
   took whole (absorbed: n_absorbed (node, level) pairs) marked in on (n_nodes + 1 bytes),
   level by level through their contiguous blocks, so that llama_cffi_trie_run_derive_skip
   with no absorbed pairs reads one level of on instead of expanding every pair down to it
   (a bounded string's positions are each a derivation). 0, -1 bad data */
int llama_cffi_trie_densify_on(const llama_cffi_trie *t, uint8_t *on, const int32_t *absorbed, int32_t n_absorbed);
/* the frontier of the same run for a shorter length k < base_k, from a scan of length
   base_k (its frontier, group_start and on_out): groups of depth below k copied, those of
   depth k made of the base's off-run nodes and of its on-path nodes of level k. (The
   mask and partial tokens of length k are the base's limited to k characters.)
   0, -1 bad data, -3 frontier_cap too small */
int llama_cffi_trie_run_derive(const llama_cffi_trie *t, const int32_t *cls, int32_t n_classes, const uint64_t *run,
                               int32_t k, const uint8_t *on, const int32_t *base_frontier, int32_t n_base,
                               const int32_t *base_group_start, int32_t base_k, int32_t *frontier,
                               int32_t frontier_cap, int32_t *n_frontier, int32_t *group_start);
/* the tokens allowed below the given nodes, OR-ed into mask (bit t % 32 of word t / 32).
   Node i is entered from state states[i] (start when states is NULL; the root is
   entered with no character); with group_start the nodes are grouped as
   llama_cffi_trie_run_scan leaves them, those of depth d entered from depth_states[d]
   (d = 0 .. k), and the implicit root groups of g added at depth 0 (the classes not in
   run, or every class when k is 0; run: W words). A subtree the walk cannot decide yet is left untouched and reported in
   pending, 4 values each: (node, state before it, LLAMA_CFFI_PEND_*, the class / the
   state whose run or partial characters are missing). frames: 3 * (max_depth + 2)
   values or more. 0, -1 bad data, -3 pending full (the mask is then incomplete) */
int llama_cffi_trie_walk(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, const int32_t *nodes,
                         const int32_t *states, int32_t n, const int32_t *group_start, const int32_t *depth_states,
                         const uint64_t *run, int32_t k, int32_t start, uint32_t *mask, int32_t *pending, int32_t pending_cap,
                         int32_t *n_pending, int32_t *frames, int32_t frames_cap);
/* A derived mask's split (samplers.grammar.compiled.CompiledGrammar._derivation): the mask
   of start equals the mask of gs except below the root's children nodes[0..n) (of the
   classes on which their transitions differ). Walked from (start, gs) in step, a subtree
   where both reach the same state keeps gs's bits, one where start's dies is cleared, one
   where gs's dies is walked from start, and where both live apart the step goes on below
   (walked whole instead: a node where a token ends inside a character, or a transition the
   engine cannot give now). The nodes whose subtrees' tokens to clear go to clear
   (*n_clear), the (node, state before its character) pairs to walk into walk_nodes /
   walk_states; at most cap each. Returns the number of walk pairs; -2 when more than cap
   entries or budget nodes would be needed (the caller walks nodes whole), an engine error
   (<= LLAMA_CFFI_GENGINE_WALK_ERR, as llama_cffi_trie_walk's), or -1 bad data */
int32_t llama_cffi_trie_derive_split(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, int32_t start,
                                     int32_t gs, const int32_t *nodes, int32_t n, int32_t budget, int32_t *clear,
                                     int32_t *n_clear, int32_t *walk_nodes, int32_t *walk_states, int32_t cap);
/* a mask from one start state in one call: base (the run scan's mask) copied into mask,
   the extra tokens set, then the walk of the scan's frontier (llama_cffi_trie_walk with
   group_start). Same results. */
typedef struct {
    int32_t start;
    int32_t k;
    const int32_t *depth_states; /* k + 1 states */
    const int32_t *frontier;
    int32_t n_frontier;
    const int32_t *group_start;  /* (k + 1) * n_classes + 1 */
    const uint64_t *run;         /* the run's classes, W words */
    const uint32_t *base;        /* ceil(n_vocab / 32) words */
    const int32_t *extra;        /* tokens set besides the walk's */
    int32_t n_extra;
    /* the groups (d * n_classes + c) the walk enters, increasing: those with frontier nodes
       and, at depth 0, the classes off the run (every class when k = 0) with root children
       (llama_cffi_trie_plan_groups); NULL: the walk tries all (k + 1) * n_classes */
    const int32_t *live_groups;
    int32_t n_live_groups;
    /* NULL, or (W words) classes whose code points base holds every token of (the
       full-length scan of their code points: a closed run of start's, whose every string
       leaves start alive): a subtree the walk reaches by characters of these classes
       only, and that holds no other below, is in base already, and is not walked. Then
       k = 0, run is premask, and the frontier holds the root's children of those classes
       left to walk (llama_cffi_trie_premask_roots); the others' are implicit */
    const uint64_t *premask;
} llama_cffi_trie_plan;
/* p's live groups (see llama_cffi_trie_plan) written into buf (cap values, at least
   (k + 1) * n_classes) and p->live_groups / n_live_groups set to them: a walk from a deep
   run (k + 1 = 33 depths of tens of classes) then enters only the few groups that hold
   nodes. 0, -1 bad data */
/* the root's children of premask's classes (W words) whose subtrees hold a character of
   another class, or a token ending inside a character, into nodes (cap at most), grouped
   by class: class c's are nodes[group_start[c] .. group_start[c + 1]] (n_classes + 1
   values); their number, or -1 (bad data, cap too small) */
int32_t llama_cffi_trie_premask_roots(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g,
                                      const uint64_t *premask, int32_t *nodes, int32_t cap, int32_t *group_start);
int llama_cffi_trie_plan_groups(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, llama_cffi_trie_plan *p,
                                int32_t *buf, int32_t cap);
int llama_cffi_trie_mask(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, const llama_cffi_trie_plan *p,
                         uint32_t *mask, int32_t *pending, int32_t pending_cap, int32_t *n_pending, int32_t *frames,
                         int32_t frames_cap);
/* the plan of start made from tmpl, the plan of another state of the same run (a bounded
   string's earlier position), then its mask as llama_cffi_trie_mask. g needs an engine
   and the runs' arguments; start's run is computed (as llama_cffi_gengine_run with
   closed words: its chain into chain, run_cap + 1 values, its classes, closed run and
   length into g's run tables, start below n_run_states). When that run is not tmpl's (other
   classes, another length than tmpl->k = run_cap, or a state repeated within its first
   chain_max + 1: no bounded position), 1 is returned and nothing else is done. Else *out
   becomes tmpl with start, depth_states = chain and extra = the tokens written into extra
   (extra_cap values): eog (n_eog) when start is complete, then each of pt (n_pt tokens
   ending inside a character, pt_depth[i] characters down the chain, their partial
   character pchars[t->pchar_slot[pt[i]]]) whose state there can complete it (g's pchar tables read
   and written below n_pchar_states; pchar_buf, t->n_pchars bytes, scratch for a state
   past them); then the mask into mask, pending as llama_cffi_trie_mask. out, chain and
   extra must outlive every use of *out. 0, 1, -1 bad data, -3 pending full, -100 + an
   engine error */
int llama_cffi_trie_position_mask(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g,
                                  const llama_cffi_trie_plan *tmpl, int32_t start, int32_t chain_max,
                                  const int32_t *pt, const int32_t *pt_depth, int32_t n_pt,
                                  const int32_t *eog, int32_t n_eog, const int64_t *pchars, uint8_t *pchar_buf,
                                  int32_t *chain, int32_t *extra, int32_t extra_cap, llama_cffi_trie_plan *out,
                                  uint32_t *mask, int32_t *pending, int32_t pending_cap, int32_t *n_pending,
                                  int32_t *frames, int32_t frames_cap);
/* the first mask from start, without a plan, for a grammar with an engine (and the
   runs' arguments): start's run computed if unknown; when it starts more than
   root_plan_max of the root's children, or (root_plan_tokens >= 0) when its run holds for
   at least 4 characters and more than root_plan_tokens tokens start with two of its
   characters (a walk from the root would descend them one by one: a letters loop),
   nothing is written and 1 is returned (a plan pays: see samplers.grammar.compiled).
   Otherwise mask (overwritten) gets eog (n_eog
   tokens) when start is complete, the tokens that are only a partial character that
   start can complete (pchars: t->n_pchars values, value << 2 | bytes still needed; the
   answers written into g's pchar tables), and the walk from the root through the root
   groups; pending as llama_cffi_trie_walk. start must lie below g's run and pchar
   tables' lengths (else 1). With heavy_min >= 0, when the classes start takes (by a
   transition, computed if unknown) hold at least heavy_min of the root's children and
   the class holding the most of them leads elsewhere than start, nothing is written and
   2 is returned, before the run's test (the caller may derive the mask from another
   state's), unless derive_share > 0, that class holds over 1/derive_share of the root
   children the classes start takes hold, and its successor goes elsewhere than itself on
   it (the two states differ on too much for a derivation: a bounded string).
   0, 1, 2, -1 bad data, -3 pending full, -100 + an engine error */
int llama_cffi_trie_first_mask(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g, int32_t start,
                               int32_t root_plan_max, int64_t root_plan_tokens, int64_t heavy_min,
                               int32_t derive_share, const int32_t *eog, int32_t n_eog, const int64_t *pchars,
                               uint32_t *mask, int32_t *pending, int32_t pending_cap, int32_t *n_pending,
                               int32_t *frames, int32_t frames_cap);
/* whether each token[i] is allowed from states[i] by the grammar's transition table (out[i]:
   1 yes, 0 no, -1 undecided: a transition not computed yet, a token the table cannot tell
   alone (not on a whole-character path of the trie: end-of-generation, ending inside a
   character, never produced; or over 256 characters), a state outside the table). token_node
   (n_vocab values): the node where each token's path ends, -1 none. Tokens of grammars
   with token elements are the caller's. 0, -1 bad data */
int llama_cffi_trie_tokens_allowed(const llama_cffi_trie *t, const llama_cffi_trie_grammar *g,
                                   const int32_t *token_node, int32_t n, const int32_t *states, const int32_t *tokens,
                                   int8_t *out);
/* a job of llama_cffi_trie_masks: a grammar and a plan of its */
typedef struct {
    const llama_cffi_trie_grammar *g;
    const llama_cffi_trie_plan *p;
} llama_cffi_trie_job;
/* many masks in one call, shared among n_threads threads (the caller's and a pool kept for
   the process): job i is llama_cffi_trie_mask(t, jobs[i]->g, jobs[i]->p, masks + rows[i] *
   stride, ...) (row rows[i], below n_rows, of a C-contiguous array of n_rows rows of
   stride >= ceil(n_vocab / 32) words) with its own pending (4 * pending_cap values at
   pending + i * 4 * pending_cap, their number in n_pending[i]) and frames (frames_cap
   values at frames + i * frames_cap); its result in rcs[i]. Jobs may share a grammar
   (walks only read it); with threads, those of larger frontiers are handed out first.
   Returns how many jobs are to be done again (a result not 0, or subtrees pending), -1
   bad arguments (nothing walked) */
int llama_cffi_trie_masks(const llama_cffi_trie *t, int32_t n, const llama_cffi_trie_job *const *jobs, uint32_t *masks,
                          int64_t stride, int32_t n_rows, const int32_t *rows, int32_t *pending, int32_t pending_cap,
                          int32_t *n_pending, int32_t *frames, int32_t frames_cap, int32_t *rcs, int32_t n_threads);
/* a mask applied to candidates: logits[i] = -inf where the bit of token ids[i] (of i when
   ids is NULL) is clear in words (ceil(n_vocab / 32) words). Returns how many were set,
   -1 for an id outside [0, n_vocab) (logits before it already masked) or bad arguments */
int32_t llama_cffi_mask_logits(int32_t n, float *logits, const int32_t *ids, const uint32_t *words, int32_t n_vocab);

/* the grammar engine's core (grammar_engine.c; see samplers.grammar.engine, whose Python
   version is the reference): stacks interned as cells, states as sorted sets of cells,
   transitions into the caller's table. The grammar, flattened: per element position its
   llama_gretype and value, rule_start per rule, and for each character element its row
   (char_row, in [0, n_rows); -1 elsewhere) and the position after it (after). Rows below
   n_mrows are multi rows (sets, ranges, negations): their line of member (n_mrows x
   n_classes bytes) says which classes they match; the others are single rows (one
   literal character): single_class[r - n_mrows] is the one class they match (-1: none). Grammars with token elements are refused
   (NULL), as are inconsistent arrays. Returns below -1: -2 out of memory,
   LLAMA_CFFI_GENGINE_BUDGET a state past max_stacks stacks (or an advance visiting more than
   max_stacks + n_elems stacks), LLAMA_CFFI_GENGINE_CELLS more than max_cells stacks kept in
   all, -4 bad arguments, -5 (group_step) the classes are not in one group. -1 is DEAD. */
#define LLAMA_CFFI_GENGINE_BUDGET -3
#define LLAMA_CFFI_GENGINE_CELLS -6
/* a grammar's character classes (grammar_classes.c; samplers.grammar.engine's
   Engine._build_classes is the reference): from the flattened grammar's types and values
   (int64: GBNF characters go up to 0xFFFFFFFF), per position the row of the char element
   starting there and the position after it (char_row, after: -1 elsewhere); rows below
   n_mrows are multi rows (sets, ranges, negations) with a line of member (n_mrows x
   n_classes), the others single rows (one literal character each, by increasing value)
   with their one class in single_class (-1: a value past every code point); the classes
   as intervals (edges: n_int + 1 increasing code points from 0, interval_class: n_int).
   NULL with *rc -4 for inconsistent arrays, -2 out of memory, -7 for more than max_cells
   cells of multi rows x classes. Free with llama_cffi_gclasses_free. */
typedef struct {
    int32_t n_rows, n_mrows, n_classes, n_int;
    int32_t *char_row, *after, *edges, *interval_class, *single_class;
    uint8_t *member;
} llama_cffi_gclasses;
llama_cffi_gclasses *llama_cffi_gclasses_build(int32_t n, const int32_t *types, const int64_t *values,
                                               int64_t max_cells, int32_t *rc);
void llama_cffi_gclasses_free(llama_cffi_gclasses *c);
typedef struct llama_cffi_gengine llama_cffi_gengine;
llama_cffi_gengine *llama_cffi_gengine_new(int32_t n_elems, const int32_t *types, const int32_t *values,
                                           int32_t n_rules, const int32_t *rule_start, const int32_t *char_row,
                                           const int32_t *after, int32_t n_rows, int32_t n_classes,
                                           int32_t n_mrows, const uint8_t *member, const int32_t *single_class,
                                           int64_t max_stacks, int64_t max_cells);
void llama_cffi_gengine_free(llama_cffi_gengine *e);
int32_t llama_cffi_gengine_n_states(const llama_cffi_gengine *e);
int64_t llama_cffi_gengine_n_cells(const llama_cffi_gengine *e);
/* the start state: the alternatives of rule advanced */
int32_t llama_cffi_gengine_start(llama_cffi_gengine *e, int32_t rule);
int32_t llama_cffi_gengine_n_stacks(const llama_cffi_gengine *e, int32_t state);
/* 1 when some stack of the state is empty */
int32_t llama_cffi_gengine_complete(const llama_cffi_gengine *e, int32_t state);
/* the state's stacks (in its order), each as positions bottom first: their lengths into
   lens (n_stacks values), the positions into flat when they fit flat_cap; returns how many
   positions there are in all */
int64_t llama_cffi_gengine_stacks(const llama_cffi_gengine *e, int32_t state, int32_t *lens, int32_t *flat,
                                  int64_t flat_cap);
/* the state of n stacks (lens[i] positions each, laid end to end in flat, bottom first) */
int32_t llama_cffi_gengine_intern(llama_cffi_gengine *e, int32_t n, const int32_t *lens, const int32_t *flat);
/* The engine keeps its own table of transitions; the caller's copy (rows x n_classes
   int32, LLAMA_CFFI_TRANS_UNKNOWN where not computed) is brought up to date by
   llama_cffi_gengine_sync_known. The successor of state on class cls (computed once): */
int32_t llama_cffi_gengine_step(llama_cffi_gengine *e, int32_t state, int32_t cls);
/* every successor of state (computed once per group of classes the same stacks take) */
int llama_cffi_gengine_fill_row(llama_cffi_gengine *e, int32_t state);
/* when classes[0..n) lead state to one successor, it (computing, when some are unknown,
   only the group of classes[0]); -5 when they do not, or when their group differs */
int32_t llama_cffi_gengine_group_step(llama_cffi_gengine *e, int32_t state, const int32_t *classes, int32_t n);
/* the transitions (states[i], classes[i]) computed (pairs with a negative state skipped) */
int llama_cffi_gengine_fill(llama_cffi_gengine *e, int64_t n, const int32_t *states, const int32_t *classes);
/* the caller's copy of the table brought up to date, when it already knows every state
   (the engine has at most n_known states, and at most n_rows): the rows changed since the
   last sync copied into table, their number returned. When the engine has n > n_known states, no row is
   copied and LLAMA_CFFI_GENGINE_NEW_STATES - n comes back, the completeness of the new
   states n_known .. n - 1 written into complete when they are at most cap (the caller
   takes it, grows its table, then syncs again); -5 (nothing done) when n_rows < n, -4 bad
   arguments */
#define LLAMA_CFFI_GENGINE_NEW_STATES -16
int32_t llama_cffi_gengine_sync_known(llama_cffi_gengine *e, int32_t *table, int32_t n_rows, int32_t n_known,
                                      uint8_t *complete, int32_t cap);
/* whether each of the states first .. first + n - 1 is complete, into out (n bytes);
   0, -4 bad arguments */
int32_t llama_cffi_gengine_completes(const llama_cffi_gengine *e, int32_t first, int32_t n, uint8_t *out);
/* the run of state (see samplers.grammar.compiled.CompiledGrammar._run): the classes that
   lead it to the successor whose classes weigh most (class_weight per class; the state
   itself on a tie, then the lowest id) as bits of run_words (W = n_classes / 64 + 1
   words), and the chain of states those classes lead to, chain[0] = state, followed while
   every class of the run leads the state reached to one successor and the state has at
   most max_run_stacks stacks, filled up to cap + 1 states when it reaches a self-loop (or
   when nothing follows state); returns the chain's length (at most cap + 1). With
   closed_words (W words, or NULL), also its closed run: classes L such that every state
   that strings over L lead state to (at most 8 of them, each with at most max_run_stacks
   stacks) stays alive on every class of L, so that every string over L, of any length,
   leaves state alive (empty when there is none within those bounds, or when it holds
   no class but the run's and the run is a self-loop: it would add nothing; not searched
   for when the classes state takes off its run weigh under a quarter of the run's
   class_weight, or the chain passes more than 8 states). A key that must
   match \\w: a word character leads to another state than the others, so no single
   successor's classes make a long run, but every string character keeps the key alive */
int32_t llama_cffi_gengine_run(llama_cffi_gengine *e, int32_t state, const double *class_weight, int32_t cap,
                               int32_t max_run_stacks, int32_t *chain, uint64_t *run_words, uint64_t *closed_words,
                               int32_t W);
/* A closed run of state as llama_cffi_gengine_run's (the classes from state's live ones
   that every state strings over them lead to stays alive on), searched over at most
   max_states states (1 .. 256) and 8 tries, whatever its run or the classes' weights: into words (W
   words; all zero when none is found), and the states of its closure into states (room
   for max_states; their number in *n_states), each of which has it as a closed run too.
   For a state whose run leaves much of the vocabulary to a walk (a searched pattern:
   ".*(top|bottom).*" leaves every token with a "t" or a "b"). 0, or an error (as
   llama_cffi_gengine_run's) */
/* Whether a closure search (llama_cffi_gengine_closed) pays for state, whose run's classes
   are run_words (W words; its row filled, as after llama_cffi_gengine_run): 1 when the
   classes it takes off its run weigh at least min_off (class_weight: trie nodes per class;
   a walk descends them all) and its run's at least 4 times as much (a string's content);
   0 when not, or when its row is not filled; -4 bad arguments */
int32_t llama_cffi_gengine_closure_pays(const llama_cffi_gengine *e, int32_t state, const uint64_t *run_words,
                                        int32_t W, const double *class_weight, double min_off);
int32_t llama_cffi_gengine_closed(llama_cffi_gengine *e, int32_t state, const double *class_weight,
                                  int32_t max_run_stacks, int32_t max_states, uint64_t *words, int32_t W,
                                  int32_t *states, int32_t *n_states);
/* A derivation's choice for state (samplers.grammar.compiled.CompiledGrammar._derivation):
   its row filled, root_count[c] the root's children of class c (n_classes of them); G the
   successor the most root children lead to (of the heaviest, the one the first class leads
   to), its row filled; the classes on which state's and G's rows differ into differ (room
   for n_classes; their number in *n_differ). Returns G; -1 when no derivation serves (the
   live classes hold under min_root root children, G is state itself, or the differing
   classes hold over 1/share of them; *n_differ 0); an engine error (-2, -3, -6), or -4
   bad arguments */
int32_t llama_cffi_gengine_derive_pick(llama_cffi_gengine *e, int32_t state, const int32_t *root_count,
                                       int32_t n_classes, int64_t min_root, int32_t share, int32_t *differ,
                                       int32_t *n_differ);
/* per partial UTF-8 character (pchars[k]: value << 2 | bytes still needed), whether some
   stack of state can take a completion of it (llama_grammar_match_partial_char), into out */
int llama_cffi_gengine_pchar_ok(llama_cffi_gengine *e, int32_t state, const int64_t *pchars, int32_t n,
                                uint8_t *out);
/* The mask of state with a partial UTF-8 character pending, over the continuation tokens
   sorted for that character: exact token i (of n_exact) completes it into a code point of
   class classes[i] and is set (out[ex_w[i]] |= ex_b[i]) when state's transition on that
   class is live (computed when unknown); longer token j (of n_longer) completes it with
   class classes[n_exact + j] and goes on: live_longer[j] = whether that transition is live
   (the caller checks those tokens whole); short token k (of n_short) ends inside it, the
   longer partial character pchars[k]: set (out[sh_w[k]] |= sh_b[k]) when some stack of
   state can take a completion of it. Every index is checked first (ex_w, sh_w < n_words).
   0, -4 for bad arguments, -2 out of memory, or an engine error as llama_cffi_gengine_step. */
int llama_cffi_gengine_partial_mask(llama_cffi_gengine *e, int32_t state, const int32_t *classes, int32_t n_exact,
                                    int32_t n_longer, const int32_t *ex_w, const uint32_t *ex_b,
                                    const int64_t *pchars, int32_t n_short, const int32_t *sh_w,
                                    const uint32_t *sh_b, uint32_t *out, int32_t n_words, uint8_t *live_longer);

/* GBNF text (n_text bytes of UTF-8, no NUL) parsed as llama.cpp's parser parses it, for the
   texts it is sure of (samplers: llama_cffi.gbnf._FastParser is the Python path, _Parser the
   reference). Out: the finished rules' (type, value) pairs in elems (cap_elems pairs; scratch
   holds rules under construction, cap_scratch pairs), rule i at pair rule_off[i], rule_len[i]
   pairs long; symbol i's name at sym[3i] (byte offset in text), sym[3i + 1] (length), and
   sym[3i + 2] = -1, or for a generated name (<that name>_<i>) i; cap_syms symbols at most;
   hash: hash_size (a power of two, at least 2 cap_syms) ints of working space; counts: the
   number of pairs, of symbols, and the deepest nesting of groups. 0: parsed; 1: unsure (an
   error, a token, a construct it leaves to Python); -1: past a capacity; -4: bad arguments.
   Every write is checked against its array's capacity. */
int llama_cffi_gbnf_parse(const char *text, int64_t n_text, uint32_t *elems, int64_t cap_elems, uint32_t *scratch,
                          int64_t cap_scratch, int32_t *rule_off, int32_t *rule_len, int32_t *sym, int32_t cap_syms,
                          int32_t *hash, int32_t hash_size, int32_t *counts);

/* What llama_cffi_gbnf_parse left (rule i at rule_off[i], rule_len[i] pairs of elems;
   symbol i's name as sym[3i..3i+2] say), for Python: the elements in rule order as indexes
   (idx, cap_idx) into the distinct (type, value) pairs in the order met (dist, cap_dist
   pairs), and the names (generated ones with "_<id>") separated by newlines (names,
   cap_names bytes); hash: hash_size (a power of two, at least 2 cap_dist) ints of working
   space; out: the number of indexes, of distinct pairs and of name bytes. Every offset is
   checked against what it indexes first. 0, -1 past a capacity, -4 bad arguments. */
int llama_cffi_gbnf_unpack(const char *text, int64_t n_text, const uint32_t *elems, int64_t n_elems,
                           const int32_t *rule_off, const int32_t *rule_len, const int32_t *sym, int32_t n_syms,
                           int32_t *idx, int64_t cap_idx, uint32_t *dist, int64_t cap_dist, int32_t *hash,
                           int64_t hash_size, char *names, int64_t cap_names, int64_t *out);

/* Whether no rule of a parsed grammar reaches itself before matching a character (its
   rules' elements in rule order: types[j], values[j]; rule r is rule_len[r] of them): 1 no
   such cycle, 0 one (llama_cffi.gbnf's checks say where), -1 work holds fewer than
   6 n_elems + 5 n_rules + 2 ints, -4 bad arguments (a reference to no rule among them,
   checked first). llama_cffi.gbnf._Leading and _acyclic are the reference. */
int llama_cffi_gbnf_no_left_cycle(const uint8_t *types, const uint32_t *values, int64_t n_elems,
                                  const int32_t *rule_len, int32_t n_rules, int32_t *work, int64_t cap_work);

#endif
