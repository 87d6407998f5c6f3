"""Parameter-server mode (`strategy: ps`): partitions, servers, and the PyTorch worker.

`python -m trainer_runtime.ps` runs a server; `trainer_runtime.ps.session.ps_session` is the
worker's loop (it imports torch; the server does not).
"""
