"""The planner's own failure, apart from the modules that raise it: mypyc, which compiles the
planner for the simulator (``simulations/native.py``), cannot compile a subclass of
RuntimeError, so this module stays Python."""


class PlanningError(RuntimeError):
    """The planner broke one of its own guarantees: always a bug, never bad input."""
