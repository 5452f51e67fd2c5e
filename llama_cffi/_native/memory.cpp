/* Memory accounting: what llama.cpp allocated for a context, per buffer type, read from
 * its own objects (see llama_cffi.h and llama_cffi.memory_usage).
 *
 * llama.h has no breakdown at the pinned commit; llama-ext.h exports the per-buffer-type
 * totals (llama_get_memory_breakdown), and the memory modules' classes are exported from
 * libllama with their type information. Per tensor (K and V apart, per device) needs the
 * modules' buffers, which are private members: they are read through the standard
 * explicit-instantiation rule (access checking does not apply to the names in an explicit
 * instantiation), with the member's type spelled out, so a change of that member's type
 * in llama.cpp fails the build instead of reading wrong memory.
 *
 * A llama.cpp checkout (LLAMA_CPP_DIR) whose internal classes no longer match does not
 * fail the whole extension: build_ffi compiles this file first, alone, and when that fails
 * it builds it with LLAMA_CFFI_NO_MEMORY_READER, the stub at the end, whose functions
 * return LLAMA_CFFI_MEMORY_UNAVAILABLE (llama_cffi.memory_usage raises UnsupportedError). */

#ifndef LLAMA_CFFI_NO_MEMORY_READER

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml.h"
#include "llama.h"
#include "llama-ext.h"
#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"
#include "llama-memory-hybrid.h"
#include "llama-memory-hybrid-iswa.h"
#include "llama-memory-recurrent.h"

extern "C" {
#include "llama_cffi.h"
}

namespace {

using bufs_t = std::vector<std::pair<ggml_context_ptr, ggml_backend_buffer_ptr>>;

template <typename Tag, typename Tag::type M>
struct member_of {
    friend typename Tag::type get(Tag) { return M; }
};

struct kv_bufs {
    using type = bufs_t llama_kv_cache::*;
    friend type get(kv_bufs);
};
template struct member_of<kv_bufs, &llama_kv_cache::ctxs_bufs>;

struct rs_bufs {
    using type = bufs_t llama_memory_recurrent::*;
    friend type get(rs_bufs);
};
template struct member_of<rs_bufs, &llama_memory_recurrent::ctxs_bufs>;

thread_local std::string last_error;

void copy_str(char * dst, size_t cap, const char * src) {
    std::snprintf(dst, cap, "%s", src ? src : "");
}

const char * device_name(ggml_backend_buffer_type_t buft) {
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    return dev ? ggml_backend_dev_name(dev) : "";
}

struct rows {
    llama_cffi_tensor_row * out;
    int32_t n_max;
    int32_t n = 0;
    int32_t module = 0;

    void add(const char * kind, ggml_backend_buffer_type_t buft, const char * name, int32_t type, uint32_t cells, uint64_t bytes) {
        if (n < n_max) {
            llama_cffi_tensor_row & r = out[n];
            r.module = module;
            copy_str(r.kind, sizeof r.kind, kind);
            copy_str(r.buffer_type, sizeof r.buffer_type, ggml_backend_buft_name(buft));
            copy_str(r.device, sizeof r.device, device_name(buft));
            r.host = ggml_backend_buft_is_host(buft) ? 1 : 0;
            copy_str(r.name, sizeof r.name, name);
            r.type = type;
            r.cells = cells;
            r.bytes = bytes;
        }
        n++;
    }

    void buffers(const char * kind, const bufs_t & bufs, uint32_t cells) {
        for (const auto & [ctx, buf] : bufs) {
            ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(buf.get());
            add(kind, buft, "", -1, cells, ggml_backend_buffer_get_size(buf.get()));
            for (ggml_tensor * t = ggml_get_first_tensor(ctx.get()); t; t = ggml_get_next_tensor(ctx.get(), t)) {
                if (t->view_src) {
                    continue;  // a view of a tensor listed already
                }
                add(kind, buft, ggml_get_name(t), (int32_t) t->type, cells, ggml_nbytes(t));
            }
        }
        module++;
    }

    void kv(const char * kind, const llama_kv_cache * c) {
        if (c) {
            buffers(kind, c->*get(kv_bufs{}), c->get_size());
        }
    }

    void recurrent(const llama_memory_recurrent * c) {
        if (c) {
            buffers("recurrent", c->*get(rs_bufs{}), c->size);
        }
    }

    void iswa(const llama_kv_cache_iswa * c) {
        kv("kv", c->get_base());
        kv("kv_swa", c->get_swa());
    }

    void other(const llama_memory_i * m) {
        for (const auto & [buft, size] : m->memory_breakdown()) {
            add("other", buft, "", -1, 0, size);
        }
        module++;
    }
};

}  // namespace

extern "C" int32_t llama_cffi_memory_buffers(const struct llama_context * ctx, llama_cffi_buffer_row * out, int32_t n_max) {
    try {
        int32_t n = 0;
        for (const auto & [buft, data] : llama_get_memory_breakdown(ctx)) {
            if (n < n_max) {
                copy_str(out[n].buffer_type, sizeof out[n].buffer_type, ggml_backend_buft_name(buft));
                copy_str(out[n].device, sizeof out[n].device, device_name(buft));
                out[n].host = ggml_backend_buft_is_host(buft) ? 1 : 0;
                out[n].model = data.model;
                out[n].context = data.context;
                out[n].compute = data.compute;
            }
            n++;
        }
        return n;
    } catch (const std::exception & e) {
        last_error = e.what();
        return -1;
    }
}

extern "C" int32_t llama_cffi_memory_tensors(const struct llama_context * ctx, llama_cffi_tensor_row * out, int32_t n_max) {
    try {
        rows r{out, n_max};
        const llama_memory_i * m = llama_get_memory(ctx);
        if (!m) {
            return 0;  // an embedding model without memory
        }
        if (auto * c = dynamic_cast<const llama_kv_cache *>(m)) {
            r.kv("kv", c);
        } else if (auto * c = dynamic_cast<const llama_kv_cache_iswa *>(m)) {
            r.iswa(c);
        } else if (auto * c = dynamic_cast<const llama_memory_recurrent *>(m)) {
            r.recurrent(c);
        } else if (auto * c = dynamic_cast<const llama_memory_hybrid *>(m)) {
            r.kv("kv", c->get_mem_attn());
            r.recurrent(c->get_mem_recr());
        } else if (auto * c = dynamic_cast<const llama_memory_hybrid_iswa *>(m)) {
            r.iswa(c->get_mem_attn());
            r.recurrent(c->get_mem_recr());
        } else {
            r.other(m);
        }
        return r.n;
    } catch (const std::exception & e) {
        last_error = e.what();
        return -1;
    }
}

extern "C" const char * llama_cffi_memory_error(void) {
    return last_error.c_str();
}

#else /* LLAMA_CFFI_NO_MEMORY_READER */

extern "C" {
#include "llama_cffi.h"
}

extern "C" int32_t llama_cffi_memory_buffers(const struct llama_context *, llama_cffi_buffer_row *, int32_t) {
    return LLAMA_CFFI_MEMORY_UNAVAILABLE;
}

extern "C" int32_t llama_cffi_memory_tensors(const struct llama_context *, llama_cffi_tensor_row *, int32_t) {
    return LLAMA_CFFI_MEMORY_UNAVAILABLE;
}

extern "C" const char * llama_cffi_memory_error(void) {
    return "this build has no memory reader: llama_cffi/_native/memory.cpp did not compile against the "
           "llama.cpp source it was built from (its internal classes differ from the pinned commit's; "
           "build_ffi printed the compiler's error)";
}

#endif /* LLAMA_CFFI_NO_MEMORY_READER */
