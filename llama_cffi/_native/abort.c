/* Abort callbacks for llama_decode (llama_cffi.context): a flag any thread may set, and
   a rate-limited poll of Python (user callables, Ctrl-C). */
#include "internal.h"

#include <stddef.h>

bool llama_cffi_abort_flag(void *flag) {
    return flag != NULL && *(volatile int *)flag != 0;
}

bool llama_cffi_abort_combined(void *data) {
    llama_cffi_abort_state *s = (llama_cffi_abort_state *)data;
    if (s == NULL) return false;
    if (s->flag) return true;
    if (s->py != NULL) {
        int64_t now = ggml_time_us();
        if (now >= s->next_us) {
            s->next_us = now + s->interval_us;
            if (llama_cffi_abort_py(s->py)) {
                s->flag = 1;
                return true;
            }
        }
    }
    return false;
}
