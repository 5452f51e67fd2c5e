/* A backend sampler of our own: measures each row in llama.cpp's sampling graph (on the
   device that computed the logits), and a reader that gathers what a batch's backend
   samplers left on the host into dense per-slot arrays (llama_cffi.kernels.RowMeasures).

   The sampler changes nothing in the chain: it leaves data->logits and data->candidates
   as they are for the samplers after it (a top-k) and sets data->probs to three floats,
   [max, log(sum(exp(x - max))), entropy in nats], of the row it was given. So it must be
   first in its chain, and no sampler after it may set probs (top-k and temperature do
   not; dist and top-p do). */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MEASURE_NAME "llama-cffi-measure"

/* rows the logits are viewed as, so that ggml shares the work of one row among threads:
   the largest power of two up to 256 that divides n */
static int64_t measure_rows(int64_t n) {
    int64_t r = 1;
    while (r < 256 && n % (r * 2) == 0) r *= 2;
    return r;
}

/* the graph: max by argmax + get_rows, then exp(x - max) summed (the normaliser) and
   exp(x - max) * (x - max) summed (for the entropy), -inf logits clamped so that they add
   0 instead of 0 * -inf */
static struct ggml_tensor *measure_build(struct ggml_context *ctx, struct ggml_tensor *logits) {
    const int64_t n = ggml_nelements(logits);
    struct ggml_tensor *x = ggml_reshape_1d(ctx, logits, n);
    struct ggml_tensor *am = ggml_argmax(ctx, ggml_reshape_2d(ctx, x, n, 1));
    struct ggml_tensor *m = ggml_get_rows(ctx, ggml_reshape_2d(ctx, x, 1, n), am); /* [1, 1] */
    ggml_set_name(m, "lcffi_max");
    const int64_t r = measure_rows(n);
    struct ggml_tensor *d = ggml_sub(ctx, ggml_reshape_2d(ctx, x, n / r, r), m);
    struct ggml_tensor *e = ggml_exp(ctx, d);
    struct ggml_tensor *s = ggml_sum(ctx, ggml_sum_rows(ctx, e));
    struct ggml_tensor *dc = ggml_clamp(ctx, d, -1e30f, 0.0f);
    struct ggml_tensor *de = ggml_sum(ctx, ggml_sum_rows(ctx, ggml_mul(ctx, e, dc)));
    struct ggml_tensor *ls = ggml_log(ctx, s);
    struct ggml_tensor *h = ggml_sub(ctx, ls, ggml_div(ctx, de, s));
    struct ggml_tensor *out = ggml_concat(ctx, ggml_concat(ctx, ggml_reshape_1d(ctx, m, 1), ggml_reshape_1d(ctx, ls, 1), 0),
                                          ggml_reshape_1d(ctx, h, 1), 0);
    ggml_set_name(out, "lcffi_measures");
    return out;
}

typedef struct {
    int on_backend; /* -1 before backend_init, then whether the device runs the graph */
} measure_state;

static const char *measure_name(const struct llama_sampler *smpl) {
    (void)smpl;
    return MEASURE_NAME;
}

static void measure_apply(struct llama_sampler *smpl, llama_token_data_array *cur_p) {
    /* on the host there is nothing to do: whoever reads the host rows measures them */
    (void)smpl;
    (void)cur_p;
}

static struct llama_sampler *measure_clone(const struct llama_sampler *smpl) {
    (void)smpl;
    return llama_cffi_measure_sampler();
}

static void measure_free(struct llama_sampler *smpl) {
    free(smpl->ctx);
}

/* whether the device of buft runs every op of the graph (a CPU buffer type: always) */
static bool measure_supported(ggml_backend_buffer_type_t buft) {
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    if (dev == NULL || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) return true;
    const size_t n_nodes = 64;
    struct ggml_init_params params = {
        /*.mem_size   =*/n_nodes * ggml_tensor_overhead() + ggml_graph_overhead_custom(n_nodes, false),
        /*.mem_buffer =*/NULL,
        /*.no_alloc   =*/true,
    };
    struct ggml_context *ctx = ggml_init(params);
    if (ctx == NULL) return false;
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, n_nodes, false);
    ggml_build_forward_expand(gf, measure_build(ctx, ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 128 * 1024)));
    bool ok = true;
    for (int i = 0; i < ggml_graph_n_nodes(gf) && ok; ++i) {
        ok = ggml_backend_dev_supports_op(dev, ggml_graph_node(gf, i));
    }
    ggml_free(ctx);
    return ok;
}

static bool measure_backend_init(struct llama_sampler *smpl, ggml_backend_buffer_type_t buft,
                                 uint32_t n_outputs_max_per_seq) {
    (void)n_outputs_max_per_seq;
    const bool ok = measure_supported(buft);
    ((measure_state *)smpl->ctx)->on_backend = ok ? 1 : 0;
    return ok;
}

static void measure_backend_apply(struct llama_sampler *smpl, struct ggml_context *ctx, struct ggml_cgraph *gf,
                                  struct llama_sampler_data *data) {
    (void)smpl;
    (void)gf;
    data->probs = measure_build(ctx, data->logits);
}

static struct llama_sampler_i measure_iface = {
    /* .name              = */ measure_name,
    /* .accept            = */ NULL,
    /* .apply             = */ measure_apply,
    /* .reset             = */ NULL,
    /* .clone             = */ measure_clone,
    /* .free              = */ measure_free,
    /* .backend_init      = */ measure_backend_init,
    /* .backend_accept    = */ NULL,
    /* .backend_apply     = */ measure_backend_apply,
    /* .backend_set_input = */ NULL,
    /* .backend_reset     = */ NULL,
    /* .copy_state        = */ NULL,
};

struct llama_sampler *llama_cffi_measure_sampler(void) {
    measure_state *st = (measure_state *)malloc(sizeof(measure_state));
    if (st == NULL) return NULL;
    st->on_backend = -1;
    return llama_sampler_init(&measure_iface, st);
}

int llama_cffi_sampler_on_backend(const struct llama_sampler *smpl) {
    if (smpl == NULL) return -1;
    if (smpl->iface == &measure_iface) return ((const measure_state *)smpl->ctx)->on_backend;
    const char *name = llama_sampler_name(smpl);
    if (name == NULL) return -1;
    return name[0] == '+' ? 1 : (name[0] == '-' ? 0 : -1);
}

/* ---------------------------------------------------------------- reading the outputs */

int llama_cffi_rows_from_device(struct llama_context *ctx, int n_rows, const int32_t *idx, const int32_t *dest, const int32_t *k, int k_stride, int n_vocab, float *out_max, double *out_log_norm, double *out_entropy, int32_t *out_status, int32_t *out_n_top, int32_t *top_ids, float *top_logits) {
    if (ctx == NULL || n_rows < 0 || idx == NULL || dest == NULL || k == NULL || k_stride < 0 || n_vocab <= 0) return -1;
    llama_cffi_vp *buf = NULL;
    size_t cap = 0;
    int err = 0;
    for (int r = 0; r < n_rows && err == 0; ++r) {
        const int32_t i = idx[r];
        const int slot = dest[r];
        int status = 0;
        float mx = NAN;
        double ln = NAN, h = NAN;
        const float *probs = llama_get_sampled_probs_ith(ctx, i);
        const uint32_t np = probs != NULL ? llama_get_sampled_probs_count_ith(ctx, i) : 0;
        if (np == 3) {
            mx = probs[0];
            if (mx != mx) status = 1;
            else if (mx == INFINITY) status = 2;
            else if (mx == -INFINITY) status = 3;
            else if (probs[1] != probs[1] || probs[2] != probs[2]) status = 1; /* a NaN elsewhere in the row */
            if (status == 0) {
                ln = probs[1];
                h = probs[2];
                const double hi = log((double)n_vocab);
                h = h < 0.0 ? 0.0 : (h > hi ? hi : h);
            }
        } /* else no measures (the chain has no measuring sampler first): NaN, status 0 */
        const float *lg = llama_get_sampled_logits_ith(ctx, i);
        const llama_token *ids = llama_get_sampled_candidates_ith(ctx, i);
        const uint32_t nl = lg != NULL ? llama_get_sampled_logits_count_ith(ctx, i) : 0;
        const uint32_t nc = ids != NULL ? llama_get_sampled_candidates_count_ith(ctx, i) : 0;
        const int cut = k[r]; /* where the sampler cuts: a tie there is checked */
        int got = 0;
        if (status != 1 && cut > 0 && k_stride > 0) {
            if (nl > 0 && nc == nl) { /* else no candidates came back: none */
                if (nl > cap) {
                    free(buf);
                    buf = (llama_cffi_vp *)malloc(sizeof(llama_cffi_vp) * nl);
                    cap = buf != NULL ? nl : 0;
                    if (buf == NULL) {
                        err = -2;
                        break;
                    }
                }
                for (uint32_t j = 0; j < nl; ++j) {
                    buf[j].v = lg[j];
                    buf[j].pos = ids[j];
                }
                llama_cffi_vp_sort(buf, nl);
                got = k_stride < (int)nl ? k_stride : (int)nl;
                /* a tie at the cut that may reach past what the device returned: other tokens
                   may hold the same logit, and which of them a stable sort keeps is unknown */
                if (cut < (int)nl && buf[cut - 1].v == buf[cut].v && buf[nl - 1].v == buf[cut - 1].v &&
                    (int)nl < n_vocab && status == 0)
                    status = 4;
                int32_t *oi = top_ids + (size_t)slot * k_stride;
                float *ol = top_logits + (size_t)slot * k_stride;
                for (int j = 0; j < got; ++j) {
                    oi[j] = (int32_t)buf[j].pos;
                    ol[j] = buf[j].v;
                }
            }
        }
        out_max[slot] = mx;
        out_log_norm[slot] = ln;
        out_entropy[slot] = h;
        out_status[slot] = status;
        out_n_top[slot] = got;
    }
    free(buf);
    return err;
}
