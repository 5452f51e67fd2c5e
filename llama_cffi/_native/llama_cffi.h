/* llama_cffi's own C API: the helpers the extension adds beside llama.h.
 *
 * build_ffi.py reads the declarations of this header into the cffi cdef (preprocessor
 * lines dropped), so everything declared here is reachable from Python as
 * llama_cffi._binding.lib.<name>; the definitions are in the .c files beside it. Keep it
 * to declarations cffi can parse: no macros, no inline code. */
#ifndef LLAMA_CFFI_H
#define LLAMA_CFFI_H

#include <stdbool.h>
#include <stdint.h>

struct gguf_context;

/* log routing (log.c): llama.cpp/ggml -> level filter in C -> Python logging. Messages
   below llama_cffi_log_min_level, or any while llama_cffi_log_enabled is 0, never reach
   Python (no GIL taken). */
extern int llama_cffi_log_min_level;
extern int llama_cffi_log_enabled;
void llama_cffi_log_install(void);

/* abort (abort.c): ggml polls the callback after every graph node, on the thread that
   called llama_decode. The combined callback checks a flag (settable from any thread)
   and, at most once per interval, calls Python (a user callable; also lets Ctrl-C
   through). */
typedef struct {
    volatile int flag;      /* nonzero: abort now */
    void *py;               /* ffi.new_handle of the Python state, or NULL */
    int64_t interval_us;    /* minimum time between Python polls */
    int64_t next_us;        /* next time Python may be polled */
} llama_cffi_abort_state;
bool llama_cffi_abort_combined(void *state);
bool llama_cffi_abort_flag(void *flag_int_ptr);

/* softmax kernels over one float32 row (kernels.c; see llama_cffi.kernels) */
double llama_cffi_softmax_sum(int n, float *y, const float *x, float max);
double llama_cffi_softmax_dot(int n, const float *y, const float *x, float max);
const char *llama_cffi_softmax_impl(void);
/* positions of the k largest values of a NaN-free row summarised by 64 interleaved
   group maxima (kernels.c; see samplers.candidates.Candidates.top); k or -1 */
int llama_cffi_top_k_grouped(int n, const float *row, int cols, const float *gmax, int k, int64_t *out);

/* many logits rows at once (rows.c; see llama_cffi.kernels.RowMeasures). Row r (n
   floats at rows[r]) writes slot dest[r] (r when dest is NULL): its max (NaN when it
   holds NaN), status (0 ok, 1 NaN, 2 +inf, 3 every value -inf), and, where measure[r] is
   nonzero (every row when measure is NULL), the
   log-normaliser log(sum(exp(x - max))) and the entropy (nats; NaN unless status is 0;
   where measure[r] is 0 the slot's earlier ones are left as they were);
   and its k[r] best candidates (at most k_stride; none for a NaN row): ids and logits,
   descending, ties by lower id, into top_ids/top_logits[slot * k_stride ...], their
   number in out_n_top[slot]. Rows are shared among n_threads threads (the caller's and a
   pool kept for the process). 0, -1 on bad arguments, -2 out of memory. */
int llama_cffi_rows_measure(int n_rows, const float *const *rows, int n, const int32_t *k, const int32_t *dest,
                            int k_stride, const int32_t *measure, int n_threads, float *out_max, double *out_log_norm,
                            double *out_entropy, int32_t *out_status, int32_t *out_n_top, int32_t *top_ids,
                            float *top_logits);
/* worker threads the pool holds now (it grows on demand, never shrinks) */
int llama_cffi_rows_pool_size(void);
/* log(sum(exp(x - max[r]))) over the first n[r] of each stride floats of x, the sum
   with llama_cffi_softmax_sum (samplers.chain_batch: a chain's sampling surprisal for
   many rows); 0, -1 bad arguments, -2 out of memory */
int llama_cffi_rows_log_sum(int n_rows, const float *x, int stride, const int32_t *n, const float *max, double *out);

/* backend sampling (measure_sampler.c; see llama_cffi.kernels.RowMeasures.read_device and
   samplers.branch). llama_cffi_measure_sampler: a new sampler for the first place of a
   backend sampling chain; in llama.cpp's graph it sets the row's probs output to three
   floats [max, log(sum(exp(x - max))), entropy] and leaves the logits to the samplers
   after it (on the host it does nothing). llama_cffi_rows_from_device: after a decode,
   for output idx[r] (a batch index) of a sequence with such a chain, write slot dest[r]
   as llama_cffi_rows_measure would (max, log-normaliser, entropy, status; NaN measures
   when the output has none), and the candidates the chain left (at most k_stride; none
   when k[r] is 0), sorted by descending logit then ascending id; status 4 when the logit
   at position k[r] (a sampler's cut) is tied up to the last candidate that came back
   (tokens beyond may share it). 0, -1 on bad arguments, -2 out of memory. */
struct llama_sampler;
struct llama_context;
struct llama_sampler *llama_cffi_measure_sampler(void);
/* after backend_init: 1 when the sampler runs in the graph, 0 when its device cannot run
   it, -1 when it was not prepared for a graph (or has no backend implementation) */
int llama_cffi_sampler_on_backend(const struct llama_sampler *smpl);
int llama_cffi_rows_from_device(struct llama_context *ctx, int n_rows, const int32_t *idx, const int32_t *dest,
                                const int32_t *k, int k_stride, int n_vocab, float *out_max, double *out_log_norm,
                                double *out_entropy, int32_t *out_status, int32_t *out_n_top, int32_t *top_ids,
                                float *top_logits);

/* the whole vocabulary (vocab.c): every token's piece concatenated into buf, offsets
   (n_vocab + 1) and end-of-generation flags; the total bytes, minus the bytes needed
   when cap is too small, or INT64_MIN on a piece that cannot be read */
struct llama_vocab;
int64_t llama_cffi_vocab_pieces(const struct llama_vocab *vocab, bool special, char *buf, int64_t cap,
                                int64_t *offsets, uint8_t *eog);

/* backend libraries (backends.c; see llama_cffi.backends): ggml_backend_score() of the
   library at path (dlopen'd and closed again): > 0 usable on this CPU, 0 not, -1 cannot
   be opened, -2 exports no score; the last dlopen error; XCR0, the register state the OS
   saves (-1 off x86-64, 0 when OSXSAVE is clear); ask the kernel for AMX tile data
   (arch_prctl(ARCH_REQ_XCOMP_PERM): 0 granted, -1 refused or not Linux x86-64); and bind
   the CPU library loaded at path (its ggml-cpu.h functions and softmax kernel: 0 bound,
   -1 not loaded, -2 no softmax kernel in it) */
int llama_cffi_backend_score(const char *path);
const char *llama_cffi_dlerror(void);
int64_t llama_cffi_xcr0(void);
int llama_cffi_amx_request(void);
int llama_cffi_bind_cpu(const char *path);

/* GGUF (gguf_check.c): the index of a token string that repeats an earlier one in a
   GGUF string array (empty strings named "[EMPTY_<i>]" as llama.cpp's vocabulary loader
   names them), -1 if none, -2 when out of memory */
int64_t llama_cffi_gguf_duplicate_string(const struct gguf_context *g, int64_t key);

/* memory accounting (memory.cpp; see llama_cffi.memory_usage): what llama.cpp allocated
   for a context, read from its own objects (never estimated).
   llama_cffi_memory_buffers: llama.cpp's per-buffer-type breakdown (model weights, the
   context's memory modules, compute buffers), bytes; device is the buffer type's device
   ("" when it has none), host is ggml_backend_buft_is_host.
   llama_cffi_memory_tensors: every tensor (views excluded) of every buffer of the
   context's memory modules, plus one row per buffer (name "", type -1, bytes = the
   buffer's size). module counts the memory modules in a fixed order; kind is "kv",
   "kv_swa", "recurrent" or "other" (a module whose tensors are not listed: one buffer row
   per buffer type, from its memory_breakdown); cells is the module's size in cells.
   Both return the number of rows (write at most n_max; call again with a larger array
   when the result is larger), -1 when llama.cpp threw (the message in
   llama_cffi_memory_error()), or LLAMA_CFFI_MEMORY_UNAVAILABLE (-3) in a build whose
   llama.cpp source memory.cpp does not compile against (the reason, too, in
   llama_cffi_memory_error()). */
#define LLAMA_CFFI_MEMORY_UNAVAILABLE -3
typedef struct {
    char buffer_type[64];
    char device[64];
    int32_t host;
    uint64_t model;
    uint64_t context;
    uint64_t compute;
} llama_cffi_buffer_row;
typedef struct {
    int32_t module;
    char kind[16];
    char buffer_type[64];
    char device[64];
    int32_t host;
    char name[64];
    int32_t type;
    uint32_t cells;
    uint64_t bytes;
} llama_cffi_tensor_row;
struct llama_context;
int32_t llama_cffi_memory_buffers(const struct llama_context *ctx, llama_cffi_buffer_row *out, int32_t n_max);
int32_t llama_cffi_memory_tensors(const struct llama_context *ctx, llama_cffi_tensor_row *out, int32_t n_max);
const char *llama_cffi_memory_error(void);

#endif
