/* What llama_cffi.backends needs to choose and bind a CPU backend library: ggml's own
   score of a library, the OS's register state, AMX permission, and the binding of the
   loaded library's functions. */
#include "internal.h"

#include <dlfcn.h>
#include <stddef.h>

int llama_cffi_backend_score(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) return -1;
    int (*score)(void) = (int (*)(void))dlsym(h, "ggml_backend_score");
    int s = score != NULL ? score() : -2;
    dlclose(h);
    return s;
}

const char *llama_cffi_dlerror(void) {
    const char *e = dlerror();
    return e != NULL ? e : "";
}

int llama_cffi_bind_cpu(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (h == NULL) return -1;
    llama_cffi_bind_late(h);
    void *f = dlsym(h, "ggml_vec_soft_max_f32");
    dlclose(h); /* balances this dlopen; ggml's own handle keeps the library loaded */
    if (f == NULL) return -2;
    llama_cffi_set_softmax((llama_cffi_softmax_fn)f);
    return 0;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
int64_t llama_cffi_xcr0(void) {
    unsigned a, b, c, d;
    __cpuid(1, a, b, c, d);
    (void)a;
    (void)b;
    (void)d;
    if (!(c & (1u << 27))) return 0; /* OSXSAVE clear: xgetbv is not allowed */
    unsigned lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (int64_t)(((uint64_t)hi << 32) | lo);
}
#else
int64_t llama_cffi_xcr0(void) {
    return -1;
}
#endif

#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
int llama_cffi_amx_request(void) {
    /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): for the whole process */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 0 : -1;
}
#else
int llama_cffi_amx_request(void) {
    return -1;
}
#endif
