"""The TrainingJob API: spec and status as pydantic models, and the CRD generated from them.

This is the boundary where user YAML is validated; nothing here performs I/O or imports
the planner.
"""
