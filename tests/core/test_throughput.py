"""The per-job throughput model: compute plus synchronization time over (nodes, workers).

Aspects:
- with no measurement, the prior gives diminishing returns (extra workers are never free);
- a model fitted to samples drawn from known parameters predicts sizes never measured,
  including across nodes;
- one or two samples still give a usable, monotone-in-compute model;
- garbage samples (zero throughput) are ignored.
"""

from __future__ import annotations

from itertools import pairwise

import pytest

from edl_scheduler.core import ThroughputSample
from edl_scheduler.core.throughput import PRIOR_MODEL, ThroughputModel, fit


def test_prior_has_diminishing_returns() -> None:
    s = [PRIOR_MODEL.speedup(1, w) for w in range(1, 9)]
    assert all(b > a for a, b in pairwise(s))
    # Synchronization starts at the second worker (its fixed cost is paid once), so returns
    # diminish from there on.
    gains = [b - a for a, b in pairwise(s[1:])]
    assert all(g2 < g1 for g1, g2 in pairwise(gains))
    assert s[1] < 2 and s[-1] < 8


def test_fit_recovers_known_curve_and_predicts_unmeasured_sizes() -> None:
    truth = ThroughputModel(0.2, 0.02, 0.004, 0.08, 0.01)
    measured = tuple(
        ThroughputSample(n, w, 64 * truth.throughput(n, w))
        for n, w in ((1, 1), (1, 2), (1, 4), (2, 8), (4, 16))
    )
    model = fit(measured)
    for n, w in ((1, 3), (2, 6), (4, 12), (8, 32)):
        assert model.speedup(n, w) == pytest.approx(truth.speedup(n, w), rel=0.03)


def test_few_samples_still_give_a_sane_model() -> None:
    model = fit((ThroughputSample(1, 2, 180.0),))
    assert 1.0 < model.speedup(1, 2) <= 2.0
    assert model.speedup(1, 8) > model.speedup(1, 4)


def test_zero_throughput_samples_are_ignored() -> None:
    assert fit((ThroughputSample(1, 4, 0.0),)) == PRIOR_MODEL
