"""``python -m simulations``: the simulator's command line (see ``cli``)."""

from simulations.cli import main

main()
