"""Write a synthetic llama-architecture GGUF with random F16 weights (fixed seed), in the
manner of llama_cffi/testing/_tiny_model.py but at a realistic size.

Shapes (``--shape``):
  full:  vocab 262,144 (SentencePiece 'llama' tokenizer), n_embd 1024, 16 layers, 16 heads,
         8 KV heads, n_ff 4096, n_ctx_train 4096; output tied to the token embedding
         (as Gemma-style 262k-vocabulary models do): ~0.79 B parameters, ~1.05 GB
  small: vocab 32,768, n_embd 256, 4 layers, 4 heads, 2 KV heads, n_ff 1024 (the CPU dry run)
  wide:  vocab 262,144, n_embd 128, 2 layers, 2 heads, 1 KV head, n_ff 256: full's vocabulary
         and rows on a CPU in milliseconds (host-work benchmarks: bench_step_host.py --model)

The vocabulary: <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>, '▁' and printable
ASCII, then unique lowercase pieces (each with and without the '▁' word-start mark) in
order of length, so every piece's prefixes are pieces too. Weights are drawn from
numpy.random.default_rng(seed): one pool of N(0, 0.02) values, each matrix a slice of it
at a random offset (values do not matter for speed; this keeps writing ~1 GB to seconds).
Norms are F32 ones, as in converted models.
"""

from __future__ import annotations

import argparse
import itertools
import string
import time
from pathlib import Path

import numpy as np

SHAPES = {
    "full": dict(n_vocab=262144, n_embd=1024, n_layer=16, n_head=16, n_head_kv=8, n_ff=4096, n_ctx_train=4096),
    "small": dict(n_vocab=32768, n_embd=256, n_layer=4, n_head=4, n_head_kv=2, n_ff=1024, n_ctx_train=4096),
    "wide": dict(n_vocab=262144, n_embd=128, n_layer=2, n_head=2, n_head_kv=1, n_ff=256, n_ctx_train=4096),
}
SPACE = "\u2581"
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6


def vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [UNKNOWN, CONTROL, CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    seen = set(tokens)
    pieces: list[str] = []

    def add(p: str) -> bool:
        if p not in seen:
            seen.add(p)
            pieces.append(p)
        return len(tokens) + len(pieces) >= n_vocab

    done = False
    for p in [SPACE] + [c for c in string.printable if not c.isspace()]:
        if add(p):
            done = True
            break
    length = 1
    while not done:
        for combo in itertools.product(string.ascii_lowercase, repeat=length):
            s = "".join(combo)
            if add(SPACE + s) or add(s):
                done = True
                break
        length += 1
    tokens += pieces
    types += [NORMAL] * len(pieces)
    tokens = tokens[:n_vocab]
    types = types[:n_vocab]
    # SentencePiece scores: later (longer) pieces score higher, so merges prefer them
    scores = [0.0] * 259 + [float(i) * 1e-3 for i in range(len(tokens) - 259)]
    assert len(tokens) == n_vocab and len(set(tokens)) == n_vocab
    return tokens, scores, types


class Pool:
    def __init__(self, seed: int, size: int = (1 << 24) + 4099, std: float = 0.02) -> None:
        self.rng = np.random.default_rng(seed)
        self.pool = (self.rng.standard_normal(size, dtype=np.float32) * np.float32(std)).astype(np.float16)

    def take(self, rows: int, cols: int) -> np.ndarray:
        n = rows * cols
        out = np.empty(n, dtype=np.float16)
        off = int(self.rng.integers(0, len(self.pool)))
        filled = 0
        while filled < n:
            chunk = self.pool[off : off + (n - filled)]
            out[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
            off = 0
        return out.reshape(rows, cols)


def write(path: Path, shape: str, seed: int = 0) -> dict:
    import gguf

    cfg = SHAPES[shape]
    n_vocab, n_embd, n_layer = cfg["n_vocab"], cfg["n_embd"], cfg["n_layer"]
    n_head, n_head_kv, n_ff = cfg["n_head"], cfg["n_head_kv"], cfg["n_ff"]
    head_dim = n_embd // n_head
    t0 = time.perf_counter()
    tokens, scores, types = vocab(n_vocab)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"synthetic-llama-{shape}-seed{seed}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(cfg["n_ctx_train"])
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    pool = Pool(seed)
    ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", pool.take(n_vocab, n_embd))
    for i in range(n_layer):
        b = f"blk.{i}"
        w.add_tensor(f"{b}.attn_norm.weight", ones(n_embd))
        w.add_tensor(f"{b}.attn_q.weight", pool.take(n_head * head_dim, n_embd))
        w.add_tensor(f"{b}.attn_k.weight", pool.take(n_head_kv * head_dim, n_embd))
        w.add_tensor(f"{b}.attn_v.weight", pool.take(n_head_kv * head_dim, n_embd))
        w.add_tensor(f"{b}.attn_output.weight", pool.take(n_embd, n_head * head_dim))
        w.add_tensor(f"{b}.ffn_norm.weight", ones(n_embd))
        w.add_tensor(f"{b}.ffn_gate.weight", pool.take(n_ff, n_embd))
        w.add_tensor(f"{b}.ffn_down.weight", pool.take(n_embd, n_ff))
        w.add_tensor(f"{b}.ffn_up.weight", pool.take(n_ff, n_embd))
    w.add_tensor("output_norm.weight", ones(n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    n_params = (
        n_vocab * n_embd
        + n_layer
        * (2 * n_embd + 2 * n_embd * n_head * head_dim + 2 * n_embd * n_head_kv * head_dim + 3 * n_embd * n_ff)
        + n_embd
    )
    return {
        "path": str(path),
        "shape": shape,
        **cfg,
        "tied_output": True,
        "weights": "F16 (norms F32)",
        "seed": seed,
        "n_params": n_params,
        "bytes": path.stat().st_size,
        "write_s": round(time.perf_counter() - t0, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="full")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    info = write(a.out, a.shape, a.seed)
    print(
        f"[model] wrote {info['path']}: {info['n_params'] / 1e6:.0f} M params, {info['bytes'] / 2**20:.0f} MiB "
        f"in {info['write_s']} s ({a.shape}: vocab {info['n_vocab']}, n_embd {info['n_embd']}, "
        f"{info['n_layer']} layers)",
        flush=True,
    )
    if a.json:
        import json

        a.json.write_text(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
