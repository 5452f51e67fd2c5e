/* The whole vocabulary in one call (llama_cffi.Vocab.pieces_blob, samplers.grammar). */
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Every token's piece (llama_token_to_piece with lstrip 0 and the given special flag),
   concatenated into buf (cap bytes); offsets[t] .. offsets[t + 1] is token t's piece
   (offsets has n_vocab + 1 entries); eog[t] = llama_vocab_is_eog(t). Returns the total
   number of bytes, or minus the number needed when cap is too small (then buf and
   offsets hold only a prefix), or INT64_MIN when a piece cannot be read. */
int64_t llama_cffi_vocab_pieces(const struct llama_vocab *vocab, bool special, char *buf, int64_t cap, int64_t *offsets, uint8_t *eog) {
    const int32_t n = llama_vocab_n_tokens(vocab);
    char small[256];
    int64_t total = 0;
    offsets[0] = 0;
    for (int32_t t = 0; t < n; ++t) {
        int32_t len = llama_token_to_piece(vocab, t, small, (int32_t)sizeof small, 0, special);
        const char *src = small;
        char *big = NULL;
        if (len < 0) { /* longer than the stack buffer: -len bytes */
            big = (char *)malloc((size_t)-len);
            if (big == NULL) return INT64_MIN;
            len = llama_token_to_piece(vocab, t, big, -len, 0, special);
            if (len < 0) {
                free(big);
                return INT64_MIN;
            }
            src = big;
        }
        if (total + len <= cap) memcpy(buf + total, src, (size_t)len);
        free(big);
        total += len;
        offsets[t + 1] = total;
        eog[t] = llama_vocab_is_eog(vocab, t) ? 1 : 0;
    }
    return total <= cap ? total : -total;
}
