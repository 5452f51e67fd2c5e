/* Native reference for benchmarks/bench_samplers.py: what llama_sampler_sample does on
 * the CPU, timed. Each iteration fills a llama_token_data array from the logits (as
 * llama_sampler_sample does), applies the sampler chain, reads the selected token (if
 * any) and accepts it.
 * usage: sampler_loop LOGITS_F32_FILE ITERS SPEC...   -> prints: median_us mean_us last_token
 * SPEC: greedy | dist:SEED | top_k:K | top_p:P:MIN_KEEP | min_p:P:MIN_KEEP | typical:P:MIN_KEEP
 *       temp:T | temp_ext:T:DELTA:EXP | top_n_sigma:N | xtc:P:T:MIN_KEEP:SEED
 *       mirostat:SEED:TAU:ETA:M | mirostat_v2:SEED:TAU:ETA | penalties:LAST_N:REPEAT:FREQ:PRESENT
 *       adaptive_p:TARGET:DECAY:SEED | logit_bias:TOKEN:BIAS */
#include "llama.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static struct llama_sampler *make(const char *spec, int n_vocab) {
    double a[5] = {0};
    char name[32] = {0};
    const char *colon = strchr(spec, ':');
    size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
    if (len >= sizeof name) return NULL;
    memcpy(name, spec, len);
    int n = 0;
    while (colon && n < 5) { a[n++] = atof(colon + 1); colon = strchr(colon + 1, ':'); }
    if (!strcmp(name, "greedy")) return llama_sampler_init_greedy();
    if (!strcmp(name, "dist")) return llama_sampler_init_dist((uint32_t)a[0]);
    if (!strcmp(name, "top_k")) return llama_sampler_init_top_k((int)a[0]);
    if (!strcmp(name, "top_p")) return llama_sampler_init_top_p((float)a[0], (size_t)a[1]);
    if (!strcmp(name, "min_p")) return llama_sampler_init_min_p((float)a[0], (size_t)a[1]);
    if (!strcmp(name, "typical")) return llama_sampler_init_typical((float)a[0], (size_t)a[1]);
    if (!strcmp(name, "temp")) return llama_sampler_init_temp((float)a[0]);
    if (!strcmp(name, "temp_ext")) return llama_sampler_init_temp_ext((float)a[0], (float)a[1], (float)a[2]);
    if (!strcmp(name, "top_n_sigma")) return llama_sampler_init_top_n_sigma((float)a[0]);
    if (!strcmp(name, "xtc")) return llama_sampler_init_xtc((float)a[0], (float)a[1], (size_t)a[2], (uint32_t)a[3]);
    if (!strcmp(name, "mirostat"))
        return llama_sampler_init_mirostat(n_vocab, (uint32_t)a[0], (float)a[1], (float)a[2], (int)a[3]);
    if (!strcmp(name, "mirostat_v2")) return llama_sampler_init_mirostat_v2((uint32_t)a[0], (float)a[1], (float)a[2]);
    if (!strcmp(name, "penalties"))
        return llama_sampler_init_penalties(n_vocab, (int)a[0], (float)a[1], (float)a[2], (float)a[3]);
    if (!strcmp(name, "adaptive_p")) return llama_sampler_init_adaptive_p((float)a[0], (float)a[1], (uint32_t)a[2]);
    if (!strcmp(name, "logit_bias")) {
        llama_logit_bias lb = {(llama_token)a[0], (float)a[1]};
        return llama_sampler_init_logit_bias(n_vocab, 1, &lb);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s LOGITS ITERS SPEC...\n", argv[0]); return 2; }
    FILE *f = fopen(argv[1], "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", argv[1]); return 2; }
    fseek(f, 0, SEEK_END);
    long nbytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    int n_vocab = (int)(nbytes / 4);
    float *logits = malloc(nbytes);
    if (fread(logits, 4, n_vocab, f) != (size_t)n_vocab) { fprintf(stderr, "short read\n"); return 2; }
    fclose(f);
    int iters = atoi(argv[2]);
    struct llama_sampler_chain_params cp = llama_sampler_chain_default_params();
    cp.no_perf = true;
    struct llama_sampler *chain = llama_sampler_chain_init(cp);
    for (int i = 3; i < argc; i++) {
        struct llama_sampler *s = make(argv[i], n_vocab);
        if (!s) { fprintf(stderr, "bad spec %s\n", argv[i]); return 2; }
        llama_sampler_chain_add(chain, s);
    }
    llama_token_data *cur = malloc(sizeof(llama_token_data) * n_vocab);
    double *dt = malloc(sizeof(double) * iters);
    llama_token last = -1;
    for (int it = 0; it < iters; it++) {
        double t0 = now_us();
        for (llama_token t = 0; t < n_vocab; t++) {
            cur[t].id = t;
            cur[t].logit = logits[t];
            cur[t].p = 0.0f;
        }
        llama_token_data_array arr = {cur, (size_t)n_vocab, -1, false};
        llama_sampler_apply(chain, &arr);
        if (arr.selected >= 0) {
            last = arr.data[arr.selected].id;
            llama_sampler_accept(chain, last);
        }
        dt[it] = now_us() - t0;
    }
    double sum = 0;
    for (int i = 0; i < iters; i++) sum += dt[i];
    qsort(dt, iters, sizeof(double), cmp);
    printf("%.3f %.3f %d\n", dt[iters / 2], sum / iters, last);
    llama_sampler_free(chain);
    free(cur);
    free(dt);
    free(logits);
    return 0;
}
