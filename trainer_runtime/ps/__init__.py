"""Parameter-server mode (`strategy: ps`): partitions, servers, and the workers.

`python -m trainer_runtime.ps` runs a server; `trainer_runtime.ps.working.PsWorker` is the
framework-free worker, `trainer_runtime.ps.session.ps_session` its PyTorch loop (it imports
torch; the server does not) and `trainer_runtime.paddle.ps.ps_session` its Paddle loop.
"""
