"""``python -m edl_scheduler.controller``: the operator (the ``edl-controller`` command)."""

from edl_scheduler.controller.app import main

main()
