"""The official JSON-Schema-Test-Suite (the copy in the jsonschema 4.26.0 sdist, downloaded
once into the user cache, sha256-checked) through the complete converter with validator
semantics: every group scores at least what ``tests/data/schema_suite_baseline.json``
records (floors that only go up: ``python benchmarks/bench_schema_coverage.py --engines ours
--drafts draft2020-12,draft7,draft6,draft4 --write-baseline tests/data/schema_suite_baseline.json``
after an improvement), and the totals meet the targets: of all instances (a schema that
does not compile counts all its instances wrong) at least 95% of the valid ones accepted and
90% right."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from benchmarks import bench_schema_coverage as bench
from benchmarks import schema_suite as ss

BASELINE = Path(__file__).resolve().parent / "data" / "schema_suite_baseline.json"


@pytest.mark.parametrize("draft", ["draft2020-12", "draft7", "draft6", "draft4"])
def test_suite_scores_at_least_the_baseline(draft: str) -> None:
    floors = json.loads(BASELINE.read_text(encoding="utf-8"))[draft]
    totals = ss.Totals()
    worse = []
    seen = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in ss.iter_scores(draft, bench.ours_compile(draft)):
            totals.add(s)
            seen.add(s.group.name)
            right = sum(s.right())
            if right < floors.get(s.group.name, 0):
                worse.append(
                    f"{s.group.name}: {right} right, the floor is {floors[s.group.name]} ({s.error or s.verdicts})"
                )
    assert not worse, "\n".join(worse)
    assert seen == set(floors), "the suite's groups changed: rewrite the baseline"
    assert totals.valid_accepted >= 0.95 * totals.valid, totals.row()
    assert totals.right >= 0.90 * totals.instances, totals.row()
