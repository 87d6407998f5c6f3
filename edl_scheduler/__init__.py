"""EDL: elastic deep-learning scheduling for shared GPU clusters.

Layers (imports point down, checked by import-linter in the test command):
``cli -> controller | local -> core -> api``. ``core`` is the one planner that the controller,
the local backend and the simulator all call; it is pure (no I/O, clock or randomness).
"""

from edl_scheduler import native

__version__ = "0.1.0"

# Before any planner module loads: the compiled build of these sources, where one exists.
native.activate()
