"""The trace-driven simulator: replays cluster traces through the same planner as the
controller."""
