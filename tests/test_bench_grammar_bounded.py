"""benchmarks/bench_grammar_bounded.py on the tiny model: the grammars drawn (the two
pathological ones first, then distinct random ones, the same for a seed), every mask of
ours equal to llama.cpp's along the walks (the benchmark raises otherwise), and the
report's fields. No time is asserted: the ratios are the benchmark's output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_grammar_bounded as bench


def test_grammars_are_drawn_the_same_for_a_seed() -> None:
    a, b = bench.draw_grammars(8, 3), bench.draw_grammars(8, 3)
    assert a == b and len(a) == 8 and len(set(a)) == 8
    assert a[:2] == [bench.AMBIGUOUS, bench.FOUND]


def test_walks_and_report(tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bounded.json"
    assert bench.main(["--model", str(tiny_model_path), "--grammars", "8", "--steps", "4", "--json", str(out)]) == 0
    (res,) = json.loads(out.read_text())
    assert res["grammars"] == 8 and res["n_vocab"] > 100
    assert res["masks"] >= 8  # at least the first mask of each grammar llama.cpp took
    assert 0 <= res["ours_at_most_native"] <= res["masks"]
    assert res["ratio_max"] >= res["ratio_median"] > 0
    assert len(res["worst"]) == min(5, res["masks"])
    printed = capsys.readouterr().out
    assert "ours <= llama.cpp's" in printed and "Worst masks" in printed
