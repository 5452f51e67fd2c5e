"""benchmarks/bench_grammar_peers.py on the tiny model, for our engine only (the peers may
be absent): the child processes, the token sequence, the mask agreement, and a peer that
cannot be imported reported as skipped."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from benchmarks import bench_grammar_peers as bench


def test_ours_in_both_modes_agree_and_a_missing_peer_is_skipped(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a package that shadows llguidance in the children and fails to import, as if absent
    block = tmp_path / "block"
    (block / "llguidance").mkdir(parents=True)
    (block / "llguidance" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(block), os.environ.get("PYTHONPATH")])))
    out = tmp_path / "peers.json"
    argv = ["--model", str(tiny_model_path), "--engines", "ours,ours-nocache,llguidance", "--quiet-wait", "0"]
    assert bench.main([*argv, "--grammars", "flat", "--rounds", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    res = json.loads(out.read_text())
    rows = {r["engine"]: r for r in res["results"]}
    n_tokens = res["cases"]["flat"]["tokens"]
    assert n_tokens > 20
    for engine in ("ours", "ours-nocache"):
        row = rows[engine]
        assert row["status"] == "ok", row["status"]
        # every token of the document accepted, one mask before each and one after the last
        assert row["refused_at"] is None
        assert row["steps"] == n_tokens + 1
        assert len(row["rounds"][0]["mask_s"]) == n_tokens + 1
        assert row["median"]["first_ms"] > 0 and row["median"]["compile_ms"] > 0
    cmp = rows["ours-nocache"]["agreement"]
    assert cmp["steps_compared"] == cmp["steps_equal"] == n_tokens + 1
    assert cmp["only_ours"]["tokens"] == cmp["only_peer"]["tokens"] == 0
    assert rows["ours"]["agreement"] is None  # the reference
    assert rows["llguidance"]["status"].startswith("skipped: ")
    assert "llguidance" in printed and "skipped: " in printed
    assert "| flat (" in printed and "exact (" in printed


def test_a_refused_token_stops_the_sequence(tiny_model_path: Path, tmp_path: Path) -> None:
    case = bench.Case("bad", "a number where a string must be", bench.CASES["flat"].schema, '{"name": 5, "age": 1}')
    masks = tmp_path / "masks.npy"
    res = bench.run_engine("ours", case, tiny_model_path, compile_timeout=600, masks_out=masks)
    at = res["refused_at"]
    assert at is not None and 0 < at < res["n_tokens"]
    assert res["steps"] == at + 1 == len(res["mask_s"]) == len(np.load(masks))
    assert "5" in res["refused_piece"]


def test_compare_counts_differences_and_ignores_padding() -> None:
    n_vocab = 40  # two words, 24 padding bits
    pieces = [b"a", b"\n\n\n", b"\xf5", b"\\/", b"<eos>"] + [b"x%d" % i for i in range(35)]
    ours = np.zeros((3, 2), np.uint32)
    peer = np.zeros((2, 2), np.uint32)  # the peer stopped one step earlier
    ours[:, 0] = 0b00101  # "a" and 0xF5
    peer[:, 0] = 0b11001  # "a", "\\/" and EOS
    peer[1, 0] = ours[1, 0]
    peer[1, 1] = 0xFFFF0000  # padding only: not a difference
    cmp = bench.compare(ours, peer, pieces, {4}, n_vocab)
    assert cmp["steps_compared"] == 2 and cmp["steps_equal"] == 1 and cmp["first_difference"] == 0
    assert cmp["only_ours"]["tokens"] == 1 and cmp["only_ours"]["kinds"] == {"byte 0xF5-0xFF": 1}
    assert cmp["only_peer"]["tokens"] == 2 and cmp["only_peer"]["kinds"] == {"escape \\/": 1, "EOG": 1}
    assert bench.agreement_text(cmp) == "1/2 steps; -1/+2 tok"


def test_warm_compile_compiles_another_grammar_first(tiny_model_path: Path) -> None:
    """``--warm-compile``: the child compiles the warm-up grammar (timed apart) before the
    measured one, and the measured grammar's masks are unchanged."""
    case = bench.CASES["flat"]
    cold = bench.run_engine("ours-nocache", case, tiny_model_path, compile_timeout=600, masks_out=None)
    warm = bench.run_engine("ours-nocache", case, tiny_model_path, compile_timeout=600, masks_out=None, warm=True)
    assert "warmup_s" not in cold and warm["warmup_s"] > 0
    assert warm["steps"] == cold["steps"] == cold["n_tokens"] + 1 and warm["refused_at"] is None


def test_goal_summary_counts_the_grammars_meeting_each_goal(capsys: pytest.CaptureFixture[str]) -> None:
    def row(engine: str, grammar: str, **ms: float) -> dict[str, object]:
        base = {"median_ms": 0.05, "p99_ms": 0.4, "max_ms": 1.0, "first_ms": 0.2, "compile_ms": 4.0}
        return {"engine": engine, "grammar": grammar, "status": "ok", "median": {**base, **ms}}

    results = [
        row("ours-nocache", "a", median_ms=0.02, compile_ms=6.0),  # median under llguidance's; compile over 5 ms
        row("llguidance", "a", median_ms=0.04),
        row("ours-nocache", "b", median_ms=0.08, max_ms=2.5),  # median over llguidance's; max over 2 ms
        row("llguidance", "b", median_ms=0.04),
        row("ours-nocache", "c"),  # llguidance did not run it: not counted
    ]
    bench.goal_summary(results, ["a", "b", "c"])
    out = capsys.readouterr().out
    assert "over the 2 grammars" in out
    lines = {ln.split("|")[1].strip(): ln for ln in out.splitlines() if ln.startswith("| ")}
    assert lines["mask median"].rstrip(" |").endswith("1/2") and "1.25 (0.50–2.00)" in lines["mask median"]
    assert lines["mask max"].rstrip(" |").endswith("1/2")
    assert lines["compile"].rstrip(" |").endswith("1/2")
    assert lines["first mask"].rstrip(" |").endswith("2/2")


def test_the_word_list_benchmark_measures_both_engines(default_model_path: Path) -> None:
    """benchmarks/bench_grammar_wordlist.py's children on a short list: ours compiles it
    with a class per distinct character and masks along it, llama.cpp's sampler gives its
    first mask; both report what the summary reads."""
    from benchmarks import bench_grammar_wordlist as wl

    words = wl.words_of(40, 60)
    assert len(words) > 30 and all(2 <= len(w) <= 4 for w in words)
    ours = wl.child("ours", 40, 60)
    assert ours["words"] == len(words)
    assert ours["classes"] >= len(set("".join(words)))  # a class per literal character
    assert ours["first_ms"] > 0 and ours["later_max_ms"] >= ours["later_median_ms"] > 0
    native = wl.child("llama.cpp", 40, 60)
    assert native["first_ms"] > 0 and native["grammar_ms"] > 0
