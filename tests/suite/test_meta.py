"""``suite.meta.check_meta`` field by field: each stored value's exact message when it is out of range, and the
values at each bound, which must pass. ``tests/suite/test_reading.py`` covers the file path and the CLI line."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from robustest.core.errors import DataError
from robustest.suite.meta import MAX_BATCH_SIZE, MAX_COUNT, check_meta
from suite.test_reading import make_suite

DELETE = object()


def meta_with(**changes: Any) -> dict[str, Any]:
    """The consistent meta of ``make_suite()`` (k = 4, two strata) with dotted keys (``__`` for ``.``) replaced."""
    meta = copy.deepcopy(make_suite().meta)
    for key, value in changes.items():
        *parents, last = key.split("__")
        node = meta
        for p in parents:
            node = node[p]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    return meta


def refusal(meta: Any) -> str:
    with pytest.raises(DataError) as exc:
        check_meta(meta, 4, source="s.pt")
    msg = str(exc.value)
    prefix, suffix = "s.pt: damaged suite: ", ": rebuild it with 'robustest suite build'"
    assert msg.startswith(prefix) and msg.endswith(suffix), msg
    return msg[len(prefix):-len(suffix)]


EST = "baseline__robust_accuracy__"


@pytest.mark.parametrize("changes, expected", [
    ({"k": 3}, "k must be an integer in [4, 4], got 3"),
    ({"n_population": 3, "stratum_sizes": [2, 1]}, "n_population must be an integer >= 4, got 3"),
    ({"stratum_sizes": 20}, "stratum_sizes must be a list, got int"),
    ({"stratum_sizes": []}, "stratum_sizes must hold one size per stratum, got none"),
    ({"stratum_sizes": [0, 20]}, "stratum_sizes[0] must be an integer >= 1, got 0"),
    ({"dataset": ""}, "dataset must be a text of 1 to 1000 characters or null, got ''"),
    ({"dataset": "d" * 1001}, "dataset must be a text of 1 to 1000 characters or null, got 'ddd"),
    ({"dataset": 7}, "dataset must be a text of 1 to 1000 characters or null, got 7"),
    ({"split": ""}, "split must be a text of 1 to 1000 characters or null, got ''"),
    ({"data_sha256": None}, "data_sha256 must be a SHA-256 digest (64 lowercase hex digits), got None"),
    ({"data_sha256": "A" * 64}, "data_sha256 must be a SHA-256 digest (64 lowercase hex digits), got 'AAA"),
    ({"data_sha256": "0" * 63}, "data_sha256 must be a SHA-256 digest (64 lowercase hex digits), got '000"),
    ({"data_sha256": "0" * 64 + "\n"}, "data_sha256 must be a SHA-256 digest"),  # $ would match before \n
    ({"samples_sha256": "x"}, "samples_sha256 must be a SHA-256 digest (64 lowercase hex digits), got 'x'"),
    ({"baseline_sha256": None}, "baseline_sha256 must be a SHA-256 digest (64 lowercase hex digits), got None"),
    ({"stratum_weights": [0.5]}, "stratum_weights must hold 2 values (one per stratum), got 1"),
    ({"stratum_weights": [-0.1, 0.5]}, "stratum_weights[0] must be a number in [0, 1], got -0.1"),
    ({"stratum_samples": [2]}, "stratum_samples must hold 2 values (one per stratum), got 1"),
    ({"stratum_samples": [5, 0]}, "stratum_samples[0] must be an integer in [0, 4], got 5"),
    ({"stratum_samples": [-1, 0]}, "stratum_samples[0] must be an integer in [0, 4], got -1"),
    ({"strata": [1]}, "strata must be a mapping, got list"),
    ({"strata__bins": 3}, "strata.bins must be an integer in [1, 2], got 3"),
    ({"strata__bins": 0}, "strata.bins must be an integer in [1, 2], got 0"),
    ({"strata__by_class": 1}, "strata.by_class must be true or false, got 1"),
    ({"strata__requested": 0}, "strata.requested must be an integer in [1, 100000], got 0"),
    ({"strata__requested": MAX_COUNT + 1}, "strata.requested must be an integer in [1, 100000], got 100001"),
    ({"strata__allocation": "equal"}, "unknown strata.allocation 'equal': choose one of"),
    ({"strata__cells": None}, "strata.cells must be a list, got NoneType"),
    ({"strata__cells": [{"bin": 0, "class": -1}, 3]}, "strata.cells[1] must be a mapping, got int"),
    ({"strata__cells": [{"bin": 0, "class": -1}, {"bin": 2, "class": -1}]},
     "strata.cells[1].bin must be an integer in [0, 1], got 2"),
    ({"strata__cells": [{"bin": -1, "class": -1}, {"bin": 1, "class": -1}]},
     "strata.cells[0].bin must be an integer in [0, 1], got -1"),
    ({"strata__cells": [{"bin": 0, "class": -2}, {"bin": 1, "class": -1}]},
     "strata.cells[0].class must be an integer in [-1, 100000], got -2"),
    ({"strata__cells": [{"bin": 0, "class": MAX_COUNT + 1}, {"bin": 1, "class": -1}]},
     "strata.cells[0].class must be an integer in [-1, 100000], got 100001"),
    ({"analysis": None}, "analysis must be a mapping, got NoneType"),
    ({"analysis__n_neighbors": 0}, "analysis.n_neighbors must be an integer in [1, 100000], got 0"),
    ({"analysis__n_neighbors": MAX_COUNT + 1}, "analysis.n_neighbors must be an integer in [1, 100000], got 100001"),
    ({"analysis__eps": 0.0}, "analysis.eps must be a number in (0, 2], got 0.0"),
    ({"analysis__eps": 2.5}, "analysis.eps must be a number in (0, 2], got 2.5"),
    ({"analysis__noise": "salt"}, "unknown analysis.noise 'salt': choose one of uniform, gaussian"),
    ({"analysis__quantize": None}, "analysis.quantize must be true or false, got None"),
    ({"analysis__seed": -1}, "analysis.seed must be a seed: an integer in [0, 2^63), got -1"),
    ({"attack": "pgd"}, "attack must be a mapping, got str"),
    ({"attack__norm": "l7"}, "unknown attack.norm 'l7': choose one of "),
    ({"attack__eps": 2.0, "attack__norm": "l2"}, None),
    ({"attack__eps": 2.0}, "attack.eps must lie in (0, 1] for the L-inf threat model"),
    ({"attack__version": "rand"}, "unknown attack.version 'rand': choose one of standard, fast"),
    ({"attack__n_targets": 0}, "attack.n_targets must be an integer in [1, 100000], got 0"),
    ({"attack__n_targets": MAX_COUNT + 1}, "attack.n_targets must be an integer in [1, 100000], got 100001"),
    ({"attack__seed": None}, "attack.seed must be a seed: an integer in [0, 2^63), got None"),
    ({"attack__batch_size": MAX_BATCH_SIZE + 1}, "attack.batch_size must be an integer in [1, 1048576], got 1048577"),
    ({"corruption__settings": "fog"}, "corruption.settings must be a list, got str"),
    ({"corruption__settings": [["fog"]]}, "corruption.settings[0] must be a [name, severity] pair, got ['fog']"),
    ({"corruption__settings": [("fog", 1)]}, "corruption.settings[0] must be a [name, severity] pair, got ('fog', 1)"),
    ({"corruption__settings": [["fog", 1], ["", 1]]},
     "corruption.settings[1] name must be a text of 1 to 1000 characters, got ''"),
    ({"corruption__settings": [["fog", 0]]}, "corruption.settings[0] severity must be an integer in [1, 5], got 0"),
    ({"corruption__seed": 2**63}, "corruption.seed must be a seed: an integer in [0, 2^63), got 9223372036854775808"),
    ({"baseline": []}, "baseline must be a mapping, got list"),
    ({"baseline__robust_accuracy": 0.5}, "baseline.robust_accuracy must be a mapping, got float"),
    ({EST + "ci_low": -0.5}, "baseline.robust_accuracy.ci_low must be a number in [0, 1], got -0.5"),
    ({EST + "ci_high": 1.5}, "baseline.robust_accuracy.ci_high must be a number in [0, 1], got 1.5"),
    ({EST + "std_error": -0.1}, "baseline.robust_accuracy.std_error must be a number >= 0, got -0.1"),
    ({EST + "n_eff": -1.0}, "baseline.robust_accuracy.n_eff must be a number >= 0, got -1.0"),
    ({EST + "n_eff": -math.inf}, "baseline.robust_accuracy.n_eff must be a finite number >= 0, got -inf"),
    ({EST + "df": 0}, "baseline.robust_accuracy.df must be an integer >= 1, got 0"),
    ({EST + "level": 1.0}, "baseline.robust_accuracy.level must be a number in (0, 1), got 1.0"),
    ({EST + "level": 0.0}, "baseline.robust_accuracy.level must be a number in (0, 1), got 0.0"),
    ({"baseline_flags": "--eps 0.1"}, "baseline_flags must be a list, got str"),
    ({"robustest_version": ""}, "robustest_version must be a text of 1 to 1000 characters or null, got ''"),
    ({"format_version": 0}, "format_version must be an integer >= 1, got 0"),
    ({"certify": {"method": "magic"}}, "unknown certify.method 'magic': choose one of"),
    ({"certify": "ibp"}, "certify must be a mapping, got str"),
])
def test_each_field_is_refused_with_its_own_name_and_range(changes, expected):
    meta = meta_with(**changes)
    if expected is None:
        check_meta(meta, 4)
        return
    assert refusal(meta).startswith(expected)


@pytest.mark.parametrize("changes", [
    {"n_population": 4, "stratum_sizes": [3, 1]},  # the smallest population: k itself
    {"dataset": None, "split": None, "samples_sha256": None, "robustest_version": None},
    {"dataset": DELETE, "split": DELETE, "samples_sha256": DELETE, "robustest_version": DELETE},
    {"dataset": "d" * 1000, "split": "s", "data_sha256": "0123456789abcdef" * 4},
    {"stratum_weights": [0.0, 1.0], "stratum_samples": [0, 4]},
    {"strata__bins": 1, "strata__requested": 1, "strata__by_class": True, "strata__allocation": "neyman"},
    {"strata__bins": 2, "strata__requested": MAX_COUNT},
    {"strata__cells": [{"bin": 0, "class": MAX_COUNT}, {"bin": 1, "class": 0}]},
    {"analysis__n_neighbors": 1, "analysis__eps": 2.0, "analysis__noise": "gaussian", "analysis__quantize": False},
    {"analysis__n_neighbors": MAX_COUNT, "analysis__eps": 1e-9, "analysis__seed": 2**63 - 1},
    {"attack__norm": "l2", "attack__eps": 1000.0, "attack__version": "standard"},
    {"attack__eps": 1.0, "attack__n_targets": 1, "attack__batch_size": 1},
    {"attack__n_targets": MAX_COUNT, "attack__batch_size": MAX_BATCH_SIZE},
    {"corruption__settings": [["fog", 1], ["snow", 5]], "corruption__seed": 2**63 - 1},
    {"baseline": DELETE, "baseline_flags": DELETE, "format_version": DELETE},
    {"baseline": {}, "baseline_flags": ["--eps", "0.1"], "format_version": 1},
    {EST + "value": 1.0, EST + "ci_low": 0.0, EST + "ci_high": 1.0, EST + "std_error": 0.0, EST + "n_eff": 0.0,
     EST + "df": 1, EST + "level": 0.999},
    {EST + "n_eff": math.inf},
    {"certify": {"method": "crown"}},
])
def test_values_at_each_bound_are_accepted(changes):
    check_meta(meta_with(**changes), 4)


def test_a_meta_that_is_not_a_mapping_is_a_damaged_suite():
    assert refusal([("k", 4)]) == "meta must be a mapping"
    with pytest.raises(DataError, match=r"^suite: damaged suite: k must be"):
        check_meta(meta_with(k=5), 4)


def test_a_missing_field_is_named():
    for key, expected in [("k", "k must be an integer in [4, 4], got None"),
                          ("stratum_sizes", "stratum_sizes must be a list, got NoneType"),
                          ("data_sha256", "data_sha256 must be a SHA-256 digest (64 lowercase hex digits), got None"),
                          ("strata", "strata must be a mapping, got NoneType"),
                          ("corruption", "corruption must be a mapping, got NoneType")]:
        assert refusal(meta_with(**{key: DELETE})) == expected, key
    assert refusal(meta_with(stratum_sizes=DELETE)).startswith("stratum_sizes must be a list")
