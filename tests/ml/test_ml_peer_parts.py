"""Peer spans in parts (ml.peer_spans.span_part / judge_span): the parts of disjoint node groups, judged together,
give the summary of the whole job, which is what lets a diagnosis pass be split across workers."""

from __future__ import annotations

import itertools
from datetime import timedelta
from functools import cache

import numpy as np
import pandas as pd

from ml import peer_spans, windows
from tests.simdata import SimRun


@cache
def _rolled(scenario: str, seed: int) -> tuple[SimRun, pd.DataFrame]:
    run = SimRun(scenario, seed=seed, nodes=6, gpus=8).run(260)
    return run, windows.from_samples(run.metrics())


def _groups(rolled: pd.DataFrame, sizes: list[int]) -> list[pd.DataFrame]:
    nodes = sorted(rolled["node"].unique())
    cuts = np.cumsum([0, *sizes])
    return [rolled[rolled["node"].isin(nodes[a:b])] for a, b in itertools.pairwise(cuts)]


def test_parts_of_node_groups_judge_to_the_whole_jobs_summary() -> None:
    for scenario, seed in (("straggler", 2), ("healthy", 3)):
        run, rolled = _rolled(scenario, seed)
        seen_outlier = False
        for t in range(60, 260, 10):
            end = windows.floor_time(run.at(t))
            whole = peer_spans.summarize_span(run.job, rolled, end=end)
            for sizes in ([3, 3], [1, 2, 3], [1, 1, 1, 1, 1, 1]):
                parts = [peer_spans.span_part(run.job, g, end=end) for g in _groups(rolled, sizes)]
                assert peer_spans.judge_span(run.job, parts) == whole
            seen_outlier |= any(m["out"] for m in whole["metrics"].values())
        # Not a vacuous comparison: the straggler's spans name outliers.
        assert seen_outlier or scenario != "straggler"


def test_a_group_with_no_rows_in_the_span_changes_nothing() -> None:
    run, rolled = _rolled("straggler", 2)
    end = windows.floor_time(run.at(200))
    whole = peer_spans.summarize_span(run.job, rolled, end=end)
    empty = peer_spans.span_part(run.job, rolled.iloc[0:0], end=end)
    later = rolled[pd.to_datetime(rolled["window_start"], utc=True) >= pd.Timestamp(end + timedelta(seconds=60))]
    parts = [peer_spans.span_part(run.job, rolled, end=end), empty, peer_spans.span_part(run.job, later, end=end)]
    assert peer_spans.judge_span(run.job, parts) == whole
    assert whole["active"] and whole["metrics"]


def test_parts_that_chose_another_activity_gauge_are_refused() -> None:
    """A group whose rows lack the gauge the whole job picks cannot be judged with the others: None, and the
    caller computes the span from all the job's rows."""
    run, rolled = _rolled("straggler", 2)
    end = windows.floor_time(run.at(200))
    first, second = _groups(rolled, [3, 3])
    second = second.assign(sm_active=np.nan)
    parts = [peer_spans.span_part(run.job, g, end=end) for g in (first, second)]
    assert parts[0].gauge == "sm_active" and parts[1].gauge != "sm_active"
    assert peer_spans.judge_span(run.job, parts) is None
