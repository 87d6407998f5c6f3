"""The trace-driven simulator: replays cluster traces through the same planner as the
controller.

Importing the package takes the compiled build of the planner and the simulator where one
exists (``native``): the simulator is its user, and it is imported before the planner by
the simulator's command line and its benchmarks.
"""

from simulations import native

native.activate()
