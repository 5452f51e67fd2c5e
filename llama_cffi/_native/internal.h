/* What the helpers share and Python does not see: llama.cpp's headers, the functions
 * cffi generates that call into Python, and the generated binding of the CPU backend
 * library. */
#ifndef LLAMA_CFFI_INTERNAL_H
#define LLAMA_CFFI_INTERNAL_H

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"
#include "llama_cffi.h"

/* Defined by cffi in the extension's generated module (extern "Python+C"): they take the
   GIL and run the Python functions registered with @ffi.def_extern. */
void llama_cffi_log_py(int level, const char *text);
bool llama_cffi_abort_py(void *user_data);

/* Generated with the extension (build_ffi.generate_cdef): point the forwarding
   definitions of ggml-cpu.h's functions at the CPU library opened as handle. */
void llama_cffi_bind_late(void *handle);

/* kernels.c: use ggml's vectorised soft_max kernel (NULL: the scalar loop) */
typedef double (*llama_cffi_softmax_fn)(const int n, float *y, const float *x, float max);
void llama_cffi_set_softmax(llama_cffi_softmax_fn f);

/* kernels.c: top-k helpers shared with rows.c and measure_sampler.c. A candidate is a
   value and its position; candidates order by descending value, then ascending position
   (a stable sort by -value). llama_cffi_select: the value of rank r (0-based, ascending)
   among a[0..n), reordering a (Hoare's select); llama_cffi_vp_push: append to *cand (m
   used of *cap), doubling it when full, 0 or -1 when out of memory. */
typedef struct {
    float v;
    int64_t pos;
} llama_cffi_vp;
int llama_cffi_vp_cmp(const void *x, const void *y);
void llama_cffi_vp_sort(llama_cffi_vp *cand, size_t m);
int llama_cffi_vp_push(llama_cffi_vp **cand, size_t *m, size_t *cap, float v, int64_t pos);
float llama_cffi_select(float *a, int n, int r);

/* pool.c: the process's one pool of worker threads (rows.c and trie_walk.c share it).
   llama_cffi_pool_run: fn(arg, worker) on up to `helpers` pool threads (worker 0, 1, ...)
   and on the caller's (worker -1); returns when every one has returned, with how many
   pool threads took part. One job at a time: a second caller waits. A job hands out its
   items itself (an atomic counter); fn must not call llama_cffi_pool_run. */
typedef void (*llama_cffi_pool_fn)(void *arg, int worker);
int llama_cffi_pool_run(int helpers, llama_cffi_pool_fn fn, void *arg);
int llama_cffi_pool_size(void);

/* grammar_engine.c, for trie_walk.c's walks: llama_cffi_gengine_step (the successor of
   state by class, computed when unknown, -1 none), its errors offset: an engine error rc
   (-2 out of memory, -3 stack budget, -4 bad arguments, -6 cell budget) comes back as
   LLAMA_CFFI_GENGINE_WALK_ERR + rc, and a walk returns it as is. */
#define LLAMA_CFFI_GENGINE_WALK_ERR (-100)
int32_t llama_cffi_gengine_walk_step(llama_cffi_gengine *e, int32_t state, int32_t cls);
/* the engine's transition table (n_states rows of n_classes), valid until its next step */
const int32_t *llama_cffi_gengine_table(const llama_cffi_gengine *e);

#endif
