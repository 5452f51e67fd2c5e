/* Softmax over one float32 row (llama_cffi.kernels, samplers.measure). */
#include "internal.h"

#include <math.h>
#include <stddef.h>

static llama_cffi_softmax_fn llama_cffi_softmax_vec = NULL;

void llama_cffi_set_softmax(llama_cffi_softmax_fn f) {
    llama_cffi_softmax_vec = f;
}

/* sum(exp(x - max)) over n floats, exp(x - max) written to y (y may alias x); the sum
   is accumulated in double. Once llama_cffi_bind_cpu has found it in the CPU backend
   library loaded at import, this is ggml's own vectorised soft_max kernel (the one its
   SOFT_MAX op uses, built for that library's instruction sets); before that, or without
   it, a scalar loop. */
double llama_cffi_softmax_sum(int n, float *y, const float *x, float max) {
    if (llama_cffi_softmax_vec != NULL) return llama_cffi_softmax_vec(n, y, x, max);
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
        float v = expf(x[i] - max);
        y[i] = v;
        sum += (double)v;
    }
    return sum;
}

/* sum(y_i * (x_i - max)) over the i with y_i != 0 (y from llama_cffi_softmax_sum; a
   -inf logit has y_i = 0 and adds nothing instead of 0 * -inf = NaN). */
double llama_cffi_softmax_dot(int n, const float *y, const float *x, float max) {
    double acc = 0.0;
    for (int i = 0; i < n; ++i) {
        if (y[i] != 0.0f) acc += (double)y[i] * (double)(x[i] - max);
    }
    return acc;
}

const char *llama_cffi_softmax_impl(void) {
    return llama_cffi_softmax_vec != NULL ? "ggml_vec_soft_max_f32" : "scalar";
}
