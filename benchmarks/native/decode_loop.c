/* Native reference for benchmarks/decode_overhead.py: the same single-token decode loop
 * as llama_cffi's Context.decode_single + logits(), written directly against llama.h.
 * It links llama_cffi's own libraries and loads the CPU variant llama_cffi chose, and
 * decodes on a ggml thread pool, as llama_cffi's contexts and llama-bench do (the pool
 * functions come from the CPU backend's registry: the variant is loaded at run time).
 * usage: decode_loop MODEL N_STEPS N_THREADS  -> prints one line: median_us mean_us */
#include "llama.h"
#include "ggml-backend.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void quiet(enum ggml_log_level level, const char *text, void *ud) {
    (void)level; (void)text; (void)ud;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s MODEL N_STEPS N_THREADS\n", argv[0]); return 2; }
    int n_steps = atoi(argv[2]), n_threads = atoi(argv[3]);
#ifdef LLAMA_CFFI_CPU_LIB
    /* the CPU backend library llama_cffi loads in the process that built this tool */
    if (!ggml_backend_load(LLAMA_CFFI_CPU_LIB)) { fprintf(stderr, "cannot load %s\n", LLAMA_CFFI_CPU_LIB); return 1; }
#endif
    llama_backend_init();
    llama_log_set(quiet, NULL);  /* NULL would restore the default stderr logger */
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_steps + 64;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "context failed\n"); return 1; }
    typedef struct ggml_threadpool *(*tp_new_fn)(struct ggml_threadpool_params *);
    typedef void (*tp_free_fn)(struct ggml_threadpool *);
    ggml_backend_reg_t cpu = ggml_backend_reg_by_name("CPU");
    tp_new_fn tp_new = cpu ? (tp_new_fn)ggml_backend_reg_get_proc_address(cpu, "ggml_threadpool_new") : NULL;
    tp_free_fn tp_free = cpu ? (tp_free_fn)ggml_backend_reg_get_proc_address(cpu, "ggml_threadpool_free") : NULL;
    if (!tp_new || !tp_free) { fprintf(stderr, "no thread pool functions in the CPU backend\n"); return 1; }
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(n_threads);
    struct ggml_threadpool *pool = tp_new(&tpp);
    if (!pool) { fprintf(stderr, "threadpool failed\n"); return 1; }
    llama_attach_threadpool(ctx, pool, pool);
    llama_token tok = llama_vocab_bos(vocab) >= 0 ? llama_vocab_bos(vocab) : 0;
    llama_pos pos = 0;
    llama_seq_id seq = 0, *seqs = &seq;
    int32_t n_seq = 1;
    int8_t out = 1;
    struct llama_batch b = {1, &tok, NULL, &pos, &n_seq, &seqs, &out};
    double *dt = malloc(sizeof(double) * n_steps);
    volatile float sink = 0;
    for (int i = 0; i < n_steps; i++) {
        tok = (llama_token)((i * 7919 + 11) % n_vocab);
        pos = i;
        double t0 = now_us();
        if (llama_decode(ctx, b) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
        float *lg = llama_get_logits_ith(ctx, -1);
        sink += lg[0];
        dt[i] = now_us() - t0;
    }
    double sum = 0;
    for (int i = 0; i < n_steps; i++) sum += dt[i];
    qsort(dt, n_steps, sizeof(double), cmp);
    printf("%.3f %.3f\n", dt[n_steps / 2], sum / n_steps);
    llama_free(ctx);
    tp_free(pool);
    llama_model_free(model);
    return 0;
}
