/* Native reference for encoder-decoder generation (tests/test_model_kinds.py): the loop
 * llama.cpp's own tools run for T5-like models, written directly against llama.h.
 * Encode the input tokens, decode the decoder start token, then greedy-decode N tokens
 * (argmax of each step's logits, stopping at an end-of-generation token).
 * It links llama_cffi's own libraries and loads the CPU variant llama_cffi chose.
 * usage: encdec_greedy MODEL N_TOKENS TOKEN... -> prints the generated ids, one line */
#include "llama.h"
#include "ggml-backend.h"
#include <stdio.h>
#include <stdlib.h>

static void quiet(enum ggml_log_level level, const char *text, void *ud) {
    (void)level; (void)text; (void)ud;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s MODEL N_TOKENS TOKEN...\n", argv[0]); return 2; }
    int n_gen = atoi(argv[2]);
    int n_in = argc - 3;
#ifdef LLAMA_CFFI_CPU_LIB
    if (!ggml_backend_load(LLAMA_CFFI_CPU_LIB)) { fprintf(stderr, "cannot load %s\n", LLAMA_CFFI_CPU_LIB); return 1; }
#endif
    llama_backend_init();
    llama_log_set(quiet, NULL);
    struct llama_model *model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    if (!llama_model_has_encoder(model)) { fprintf(stderr, "not an encoder model\n"); return 1; }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "context failed\n"); return 1; }
    llama_token *in = malloc(sizeof(llama_token) * n_in);
    for (int i = 0; i < n_in; i++) in[i] = (llama_token)atoi(argv[3 + i]);
    if (llama_encode(ctx, llama_batch_get_one(in, n_in)) != 0) { fprintf(stderr, "encode failed\n"); return 1; }
    llama_token tok = llama_model_decoder_start_token(model);
    if (tok == LLAMA_TOKEN_NULL) tok = llama_vocab_bos(vocab);
    for (int i = 0; i < n_gen; i++) {
        if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
        const float *lg = llama_get_logits_ith(ctx, -1);
        int best = 0;
        for (int v = 1; v < n_vocab; v++) if (lg[v] > lg[best]) best = v;
        if (llama_vocab_is_eog(vocab, best)) break;
        printf("%s%d", i ? " " : "", best);
        tok = best;
    }
    printf("\n");
    free(in);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
