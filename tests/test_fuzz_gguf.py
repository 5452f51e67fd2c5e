"""Fuzz: mutated tiny models never crash the process.

Each mutant is the tiny model with 1-3 mutations in its header (the metadata and tensor
infos before the data): a bit flipped, or 1/2/4/8 bytes overwritten with an edge value
(0, 1, 2**31-1, 2**64-1, 513 ...), which hits counts, lengths, types, array sizes,
dimensions and offsets. One spawned child loads every mutant and, when the load
succeeds, makes a context and decodes three tokens; each must end in success or a
:class:`llama_cffi.LlamaError`. The child names each file before trying it, so a crash
names the mutant (kept in pytest's tmp dir) and llama.cpp's last words.

``LLAMA_CFFI_FUZZ_CASES`` sets the count (default 200), ``LLAMA_CFFI_FUZZ_SEED`` the
seed (default 0: the same mutants every CI run). This fuzzer found the duplicate-token
abort that :func:`llama_cffi.model_file.check_header` now refuses.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import numpy as np

from tests.conftest import run_isolated

CASES = int(os.environ.get("LLAMA_CFFI_FUZZ_CASES", "200"))
SEED = int(os.environ.get("LLAMA_CFFI_FUZZ_SEED", "0"))
EDGES = [0, 1, 2, 7, 255, 513, 1000, 2**15, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1]

CHILD = """
import llama_cffi
for p in open(LIST).read().splitlines():
    print("TRY", p, flush=True)
    try:
        m = llama_cffi.Model.load(p)
        try:
            with m.context(n_ctx=64, n_batch=8, n_threads=1, n_threads_batch=1) as ctx:
                ctx.decode([1, 2, 3])
            print("OK", flush=True)
        finally:
            m.close()
    except llama_cffi.LlamaError as e:
        print("ERR", type(e).__name__, flush=True)
"""


def _mutants(base: bytes, header_end: int, out: Path) -> list[str]:
    rng = np.random.default_rng(SEED)
    paths = []
    for i in range(CASES):
        b = bytearray(base)
        for _ in range(int(rng.integers(1, 4))):
            pos = int(rng.integers(4, header_end))  # keep the magic: that case is tested elsewhere
            if rng.random() < 0.5:
                width = int(rng.choice([1, 2, 4, 8]))
                v = int(rng.choice(EDGES)) % (1 << (8 * width))
                chunk = v.to_bytes(width, "little")[: len(b) - pos]
                b[pos : pos + len(chunk)] = chunk
            else:
                b[pos] ^= 1 << int(rng.integers(0, 8))
        p = out / f"mutant{i:04d}.gguf"
        p.write_bytes(bytes(b))
        paths.append(str(p))
    return paths


def test_mutated_models_never_crash(tiny_model_path: Path, tmp_path: Path) -> None:
    import gguf

    base = tiny_model_path.read_bytes()
    header_end = int(gguf.GGUFReader(tiny_model_path).data_offset)
    paths = _mutants(base, header_end, tmp_path)
    listing = tmp_path / "mutants.txt"
    listing.write_text("\n".join(paths))
    r = run_isolated(CHILD.replace("LIST", repr(str(listing))), timeout=600)
    lines = r.stdout.splitlines()
    tried = [ln[4:] for ln in lines if ln.startswith("TRY ")]
    if r.returncode != 0:
        last = tried[-1] if tried else "?"
        raise AssertionError(f"the child died (rc={r.returncode}) on {last}:\n{r.stderr[-1500:]}")
    outcomes = Counter(ln for ln in lines if not ln.startswith("TRY "))
    assert len(tried) == CASES and sum(outcomes.values()) == CASES, outcomes
    assert set(outcomes) <= {"OK", "ERR InvalidModelError", "ERR ModelLoadError"}, outcomes
    print(f"fuzz: {CASES} mutants, seed {SEED}: {dict(outcomes)}")  # shown by pytest -rP
    # the mutations reach the parser: most mutants are refused, some still load and run
    assert outcomes["OK"] > 0 and outcomes["ERR InvalidModelError"] > CASES // 4, outcomes
