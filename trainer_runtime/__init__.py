"""The trainer runtime: the per-job coordinator, the worker agent and framework adapters.

It never imports the controller; the two meet only through the documented protocol (pod
environment, annotations and the coordinator API).
"""
