/* llama.cpp's log, filtered by level in C, then handed to Python (llama_cffi.log). */
#include "internal.h"

#include <stddef.h>

#ifdef LLAMA_CFFI_HAVE_MTMD
#include "mtmd-helper.h"
#endif

int llama_cffi_log_min_level = GGML_LOG_LEVEL_WARN;
int llama_cffi_log_enabled = 1;
static int llama_cffi_log_last_level = GGML_LOG_LEVEL_INFO;

/* Called by llama.cpp/ggml from any thread. Filtering here means a quiet logger costs no
   GIL acquisition; CONT lines inherit the level of the line they continue. */
static void llama_cffi_log_trampoline(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    int eff = (level == GGML_LOG_LEVEL_CONT) ? llama_cffi_log_last_level : (int)level;
    if (level != GGML_LOG_LEVEL_CONT) llama_cffi_log_last_level = (int)level;
    if (!llama_cffi_log_enabled || eff < llama_cffi_log_min_level || text == NULL) return;
    llama_cffi_log_py(eff, text);
}

void llama_cffi_log_install(void) {
    llama_log_set(llama_cffi_log_trampoline, NULL);
#ifdef LLAMA_CFFI_HAVE_MTMD
    /* libmtmd's own loggers (clip's and the helpers'): they print to stderr otherwise */
    mtmd_helper_log_set(llama_cffi_log_trampoline, NULL);
#endif
}
