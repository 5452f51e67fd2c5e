/* GGUF checks llama.cpp's loaders would abort on (llama_cffi.model_file). */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { const char *s; int64_t i; } llama_cffi_str_idx;

static int llama_cffi_str_idx_cmp(const void *a, const void *b) {
    const llama_cffi_str_idx *x = (const llama_cffi_str_idx *)a, *y = (const llama_cffi_str_idx *)b;
    int c = strcmp(x->s, y->s);
    return c != 0 ? c : (x->i < y->i ? -1 : x->i > y->i);
}

int64_t llama_cffi_gguf_duplicate_string(const struct gguf_context *g, int64_t key) {
    size_t n = gguf_get_arr_n(g, key);
    llama_cffi_str_idx *v = (llama_cffi_str_idx *)malloc((n ? n : 1) * sizeof *v);
    char **names = (char **)calloc(n ? n : 1, sizeof *names);
    int64_t dup = -1;
    if (v == NULL || names == NULL) { free(v); free(names); return -2; }
    for (size_t i = 0; i < n; ++i) {
        const char *s = gguf_get_arr_str(g, key, i);
        if (s == NULL || s[0] == '\0') {
            names[i] = (char *)malloc(32);
            if (names[i] == NULL) { dup = -2; n = i; break; }
            snprintf(names[i], 32, "[EMPTY_%zu]", i);
            s = names[i];
        }
        v[i].s = s;
        v[i].i = (int64_t)i;
    }
    if (dup == -1) {
        qsort(v, n, sizeof *v, llama_cffi_str_idx_cmp);
        for (size_t i = 1; i < n; ++i) {
            if (strcmp(v[i - 1].s, v[i].s) == 0 && (dup < 0 || v[i].i < dup)) dup = v[i].i;
        }
    }
    for (size_t i = 0; i < n; ++i) free(names[i]);
    free(names);
    free(v);
    return dup;
}

int llama_cffi_gguf_tensor_ne(const char *fname, int n, const char *const *names, int64_t *ne) {
    if (fname == NULL || n < 0 || (n > 0 && (names == NULL || ne == NULL))) return -1;
    struct ggml_context *meta = NULL;
    struct gguf_init_params params = {/*.no_alloc =*/true, /*.ctx =*/&meta};
    struct gguf_context *g = gguf_init_from_file(fname, params);
    if (g == NULL) return -1;
    for (int i = 0; i < n; ++i) {
        const struct ggml_tensor *t = names[i] != NULL && meta != NULL ? ggml_get_tensor(meta, names[i]) : NULL;
        for (int d = 0; d < 4; ++d) ne[4 * i + d] = t != NULL ? t->ne[d] : -1;
    }
    if (meta != NULL) ggml_free(meta);
    gguf_free(g);
    return 0;
}
