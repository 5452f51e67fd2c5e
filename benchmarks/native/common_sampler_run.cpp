// Oracle for samplers.params.SamplingParams: llama.cpp's own command-line parsing and
// common_sampler (common_sampler_init / _sample / _accept), on a plain generation loop.
//
// usage: common_sampler_run -m MODEL -p PROMPT -n N -c N_CTX -t THREADS [sampling options]
//   The options are parsed by llama.cpp's common_params_parse, exactly as llama-cli parses
//   them. The prompt is tokenized with the model's special tokens and decoded in one
//   batch; then each token is sampled, accepted and decoded alone (one row per decode).
//   --ignore-eos adds -inf biases for the end-of-generation tokens, as
//   common_init_from_params does. The model's sampling metadata is not applied.
// prints: the sampled token ids, space-separated, on one line (an end-of-generation token
//   is printed and ends the loop).
#include "arg.h"
#include "common.h"
#include "llama.h"
#include "sampling.h"

#include <cmath>
#include <cstdio>
#include <vector>

int main(int argc, char ** argv) {
    common_params params;
    if (!common_params_parse(argc, argv, params, LLAMA_EXAMPLE_COMMON)) {
        return 2;
    }
    llama_backend_init();
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_model_params mparams = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(params.model.path.c_str(), mparams);
    if (!model) {
        std::fprintf(stderr, "cannot load %s\n", params.model.path.c_str());
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = params.n_ctx;
    cparams.n_batch = params.n_ctx;
    cparams.n_threads = cparams.n_threads_batch = params.cpuparams.n_threads;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) {
        std::fprintf(stderr, "cannot make a context\n");
        return 1;
    }
    if (params.sampling.ignore_eos) {
        for (llama_token i = 0; i < llama_vocab_n_tokens(vocab); i++) {
            if (llama_vocab_is_eog(vocab, i)) {
                params.sampling.logit_bias.push_back({i, -INFINITY});
            }
        }
    }
    common_sampler * smpl = common_sampler_init(model, params.sampling);
    std::vector<llama_token> prompt = common_tokenize(vocab, params.prompt, true, false);
    if (llama_decode(ctx, llama_batch_get_one(prompt.data(), (int32_t) prompt.size())) != 0) {
        std::fprintf(stderr, "prompt decode failed\n");
        return 1;
    }
    for (int i = 0; i < params.n_predict; i++) {
        llama_token id = common_sampler_sample(smpl, ctx, -1);
        common_sampler_accept(smpl, id, true);
        std::printf("%s%d", i ? " " : "", id);
        if (llama_vocab_is_eog(vocab, id)) {
            break;
        }
        if (llama_decode(ctx, llama_batch_get_one(&id, 1)) != 0) {
            std::fprintf(stderr, "decode failed\n");
            return 1;
        }
    }
    std::printf("\n");
    common_sampler_free(smpl);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
