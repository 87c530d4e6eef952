"""The reports of score and select (robustest.selection.score_reports)."""

from __future__ import annotations

import torch

from robustest.results import document
from robustest.selection.score_reports import score_report, select_report
from robustest.selection.scores_file import score_stats, summarize


def test_the_score_report_names_the_metric_and_its_options():
    scores = torch.tensor([0.1, 0.4, float("nan")])
    figures = {"metric": "fol", "source": "digits:test", "description": "first-order loss", "options": {"eps": 0.1},
               **summarize(scores[:2]), "non_finite": 1}
    html = score_report(document("score", {}, figures, {"total_s": 1.0}, world_size=1), scores).render()
    assert "robustest score: fol on digits:test" in html and "first-order loss" in html
    assert "Metric options" in html and "distribution of the fol scores" in html


def test_the_select_report_shows_the_warnings_and_the_cells():
    scores, chosen = torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.3])
    res = {"metric": "kmnc", "description": "greedy coverage", "selected": 1, "pool_size": 3,
           "warnings": ["only 1 distinct"], "pool_scores": score_stats(scores), "selected_scores": score_stats(chosen),
           "cells": 8, "cells_covered_by_pool": 5, "cells_covered_by_selection": 2}
    html = select_report(document("select", {"strategy": "coverage"}, res, {"total_s": 1.0}, world_size=1),
                         scores, chosen).render()
    assert "robustest select: coverage, 1 of 3" in html and "warning: only 1 distinct" in html
    assert "cells_covered_by_selection" in html or "cells covered by selection" in html
