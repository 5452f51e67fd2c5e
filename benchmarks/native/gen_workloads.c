/* Native side of benchmarks/bench_peer.py: its workloads written directly against llama.h,
 * linked with the shared-library build of the pinned llama.cpp (native_tools.
 * llama_shared_lib_dir: the very libllama the peer llama-cpp-python loads there).
 *
 * usage: gen_workloads MODEL THREADS REPS N_TOK TG SEED GRAMMAR_FILE PROMPT_FILE N_CTX N_CTX_PAR WORKLOADS
 *   WORKLOADS: comma separated, among greedy, sampled, grammar, parallelN (N sequences)
 * prints one JSON line: {"tps": {workload: [tok/s per repetition]}, "tokens": {workload: [tokens per rep]},
 *                        "ids": {workload: [the tokens generated in the first repetition]}} (ids: not parallel)
 *
 * The contract (the same on every side of bench_peer.py):
 *  - a generation context (n_ctx N_CTX, n_batch = n_ubatch = 512, flash attention on) and a
 *    parallel one (n_ctx N_CTX_PAR, n_seq_max = max NS, unified KV); a one-token warm-up;
 *    here both decode on one ggml thread pool of THREADS threads, as llama-bench's contexts
 *    and llama_cffi's do (llama-cpp-python attaches none: each decode starts its threads);
 *  - greedy / sampled / grammar: memory cleared, the prompt decoded (not timed), then N_TOK
 *    times: pick a token from the last logits, decode it (timed). greedy: argmax;
 *    sampled: chain top-k 40 -> temp 0.8 -> dist(SEED); grammar: chain grammar(json.gbnf) ->
 *    top-k 40 -> temp 0.8 -> dist(SEED), stopping at an end-of-generation token (counted,
 *    not decoded). The chain is made inside the timed part (as the peer's Llama.generate does);
 *  - parallelN: memory cleared, the prompt decoded into sequence 0 and copied to 1..N-1 (not
 *    timed), then TG steps of: the argmax of each sequence's logits, one llama_decode of the
 *    N tokens (one per sequence, every one an output). tok/s = N * TG / time. */
#include "ggml-cpu.h"
#include "llama.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void quiet(enum ggml_log_level level, const char *text, void *ud) {
    (void)level; (void)text; (void)ud;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(n + 1);
    if (fread(buf, 1, n, f) != (size_t)n) { fprintf(stderr, "cannot read %s\n", path); exit(1); }
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* The first index of the largest logit (numpy's argmax). Blocks of 64 with 16 independent
 * maxima, which the compiler vectorises: ~40 us for 262,144 logits, where the plain
 * compare-and-branch loop takes 300-700 us (numpy: ~15 us). */
static llama_token argmax(const float *row, int n) {
    enum { B = 64, L = 16 };
    float m = row[0];
    int mb = 0, nb = n / B, best = -1;
    for (int b = 0; b < nb; b++) {
        const float *p = row + (size_t)b * B;
        float acc[L];
        for (int k = 0; k < L; k++) acc[k] = p[k];
        for (int i = L; i < B; i += L) {
            for (int k = 0; k < L; k++) acc[k] = p[i + k] > acc[k] ? p[i + k] : acc[k];
        }
        float bm = acc[0];
        for (int k = 1; k < L; k++) bm = acc[k] > bm ? acc[k] : bm;
        if (bm > m) { m = bm; mb = b; }  /* strictly: the first block that holds the max */
    }
    for (int i = nb * B; i < n; i++) {
        if (row[i] > m) { m = row[i]; best = i; }
    }
    if (best >= 0) return best;
    for (int i = mb * B; i < n; i++) {
        if (row[i] == m) return i;
    }
    return 0;
}

static void check(int rc, const char *what) {
    if (rc != 0) { fprintf(stderr, "%s failed (%d)\n", what, rc); exit(1); }
}

static struct llama_model *model;
static const struct llama_vocab *vocab;
static int n_vocab;
static llama_token *prompt;
static int n_prompt;

static void decode_prompt(struct llama_context *ctx) {
    llama_memory_clear(llama_get_memory(ctx), true);
    check(llama_decode(ctx, llama_batch_get_one(prompt, n_prompt)), "prompt decode");
}

/* greedy, sampled or grammar: returns tok/s, the number of tokens in *done, the tokens in ids (if not NULL) */
static double generate(struct llama_context *ctx, const char *mode, int n_tok, uint32_t seed, const char *gbnf, int *done,
                       llama_token *ids) {
    decode_prompt(ctx);
    double t0 = now_s();
    struct llama_sampler *chain = NULL;
    if (strcmp(mode, "greedy") != 0) {
        chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
        if (strcmp(mode, "grammar") == 0) {
            struct llama_sampler *g = llama_sampler_init_grammar(vocab, gbnf, "root");
            if (!g) { fprintf(stderr, "grammar failed\n"); exit(1); }
            llama_sampler_chain_add(chain, g);
        }
        llama_sampler_chain_add(chain, llama_sampler_init_top_k(40));
        llama_sampler_chain_add(chain, llama_sampler_init_temp(0.8f));
        llama_sampler_chain_add(chain, llama_sampler_init_dist(seed));
    }
    int n = 0;
    for (int i = 0; i < n_tok; i++) {
        llama_token tok = chain ? llama_sampler_sample(chain, ctx, -1) : argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        if (ids) ids[n] = tok;
        n++;
        if (chain && strcmp(mode, "grammar") == 0 && llama_vocab_is_eog(vocab, tok)) break;
        check(llama_decode(ctx, llama_batch_get_one(&tok, 1)), "decode");
    }
    double dt = now_s() - t0;
    if (chain) llama_sampler_free(chain);
    *done = n;
    return n / dt;
}

static double parallel(struct llama_context *ctx, int n_seq, int tg) {
    decode_prompt(ctx);
    llama_memory_t mem = llama_get_memory(ctx);
    for (int j = 1; j < n_seq; j++) llama_memory_seq_cp(mem, 0, j, -1, -1);
    struct llama_batch batch = llama_batch_init(n_seq, 0, 1);
    llama_token *toks = malloc(sizeof(llama_token) * n_seq);
    double t0 = now_s();
    for (int s = 0; s < tg; s++) {
        for (int j = 0; j < n_seq; j++) toks[j] = argmax(llama_get_logits_ith(ctx, s == 0 ? -1 : j), n_vocab);
        batch.n_tokens = n_seq;
        for (int j = 0; j < n_seq; j++) {
            batch.token[j] = toks[j];
            batch.pos[j] = n_prompt + s;
            batch.n_seq_id[j] = 1;
            batch.seq_id[j][0] = j;
            batch.logits[j] = 1;
        }
        check(llama_decode(ctx, batch), "batch decode");
    }
    llama_synchronize(ctx);
    double dt = now_s() - t0;
    free(toks);
    llama_batch_free(batch);
    return (double)n_seq * tg / dt;
}

int main(int argc, char **argv) {
    if (argc != 12) {
        fprintf(stderr, "usage: %s MODEL THREADS REPS N_TOK TG SEED GRAMMAR_FILE PROMPT_FILE N_CTX N_CTX_PAR WORKLOADS\n",
                argv[0]);
        return 2;
    }
    int n_threads = atoi(argv[2]), reps = atoi(argv[3]), n_tok = atoi(argv[4]), tg = atoi(argv[5]);
    uint32_t seed = (uint32_t)strtoul(argv[6], NULL, 10);
    char *gbnf = read_file(argv[7]);
    char *text = read_file(argv[8]);
    int n_ctx = atoi(argv[9]), n_ctx_par = atoi(argv[10]);
    char *workloads[16];
    int n_work = 0;
    for (char *w = strtok(argv[11], ","); w && n_work < 16; w = strtok(NULL, ",")) workloads[n_work++] = w;
    int max_seq = 1;
    for (int i = 0; i < n_work; i++) {
        if (strncmp(workloads[i], "parallel", 8) == 0 && atoi(workloads[i] + 8) > max_seq) max_seq = atoi(workloads[i] + 8);
    }

    llama_backend_init();
    llama_log_set(quiet, NULL);
    model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    vocab = llama_model_get_vocab(model);
    n_vocab = llama_vocab_n_tokens(vocab);
    prompt = malloc(sizeof(llama_token) * 4096);
    n_prompt = llama_tokenize(vocab, text, (int32_t)strlen(text), prompt, 4096, true, false);
    if (n_prompt <= 0) { fprintf(stderr, "tokenize failed\n"); return 1; }

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    struct llama_context *gen = llama_init_from_model(model, cp);
    cp.n_ctx = n_ctx_par;
    cp.n_seq_max = max_seq;
    cp.kv_unified = true;
    struct llama_context *par = max_seq > 1 ? llama_init_from_model(model, cp) : NULL;
    if (!gen || (max_seq > 1 && !par)) { fprintf(stderr, "context failed\n"); return 1; }
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(n_threads);
    struct ggml_threadpool *pool = ggml_threadpool_new(&tpp);
    if (!pool) { fprintf(stderr, "threadpool failed\n"); return 1; }
    llama_attach_threadpool(gen, pool, pool);
    if (par) llama_attach_threadpool(par, pool, pool);
    if (n_prompt + n_tok > n_ctx || n_prompt + max_seq * tg > n_ctx_par) {
        fprintf(stderr, "contexts too small\n");
        return 1;
    }
    llama_token bos = prompt[0];
    check(llama_decode(gen, llama_batch_get_one(&bos, 1)), "warm-up"); /* as llama-bench's */
    if (par) check(llama_decode(par, llama_batch_get_one(&bos, 1)), "warm-up");

    double *tps = calloc((size_t)n_work * reps, sizeof(double));
    int *tokens = calloc((size_t)n_work * reps, sizeof(int));
    llama_token *ids = calloc((size_t)n_work * n_tok, sizeof(llama_token));
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < n_work; k++) {
            int i = (k + r) % n_work; /* rotate the order per repetition */
            const char *w = workloads[i];
            if (strncmp(w, "parallel", 8) == 0) {
                int n = atoi(w + 8);
                tps[i * reps + r] = parallel(par, n, tg);
                tokens[i * reps + r] = n * tg;
            } else {
                tps[i * reps + r] = generate(gen, w, n_tok, seed, gbnf, &tokens[i * reps + r], r == 0 ? ids + (size_t)i * n_tok : NULL);
            }
        }
    }
    printf("{\"tps\": {");
    for (int i = 0; i < n_work; i++) {
        printf("%s\"%s\": [", i ? ", " : "", workloads[i]);
        for (int r = 0; r < reps; r++) printf("%s%.6g", r ? ", " : "", tps[i * reps + r]);
        printf("]");
    }
    printf("}, \"tokens\": {");
    for (int i = 0; i < n_work; i++) {
        printf("%s\"%s\": [", i ? ", " : "", workloads[i]);
        for (int r = 0; r < reps; r++) printf("%s%d", r ? ", " : "", tokens[i * reps + r]);
        printf("]");
    }
    printf("}, \"ids\": {");
    for (int i = 0, first = 1; i < n_work; i++) {
        if (strncmp(workloads[i], "parallel", 8) == 0) continue;
        printf("%s\"%s\": [", first ? "" : ", ", workloads[i]);
        for (int k = 0; k < tokens[i * reps]; k++) printf("%s%d", k ? ", " : "", ids[(size_t)i * n_tok + k]);
        printf("]");
        first = 0;
    }
    printf("}}\n");
    if (par) llama_free(par);
    llama_free(gen);
    ggml_threadpool_free(pool);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
