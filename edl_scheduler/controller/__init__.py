"""The Kubernetes operator: observe the cluster, ask the planner, act. The only layer that
talks to the Kubernetes API."""
