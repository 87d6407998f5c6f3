"""Hypothesis profiles for the planner's property tests.

``ci`` (the default, what the test command runs): a fixed set of examples, so a run on a
clean machine checks exactly what passed here, and a failure there is reproducible here.
``explore``: fresh random examples on each run, for hunting new
counterexamples: ``HYPOTHESIS_PROFILE=explore pytest tests/core/test_properties.py``. Every
counterexample found that way becomes a scenario test in ``test_scenarios.py``.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
