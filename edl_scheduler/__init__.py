"""EDL: elastic deep-learning scheduling for shared GPU clusters.

Layers (imports point down, checked by import-linter in the test command):
``cli -> controller | local -> core -> api``. ``core`` is the one planner that the controller,
the local backend and the simulator all call; it is pure (no I/O, clock or randomness).
Importing the package does nothing else: the compiled build of the planner is the
simulator's (``simulations.native``).
"""

__version__ = "0.1.0"
