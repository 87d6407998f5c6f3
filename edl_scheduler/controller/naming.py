"""The names the controller writes on Kubernetes objects, in one place.

Every pod, Service, Secret and ConfigMap the controller creates for a TrainingJob carries
these labels, so that observing can rebuild the whole picture from the API alone after a
restart (level-triggered: nothing is remembered in memory that the API does not hold).
"""

from __future__ import annotations

from typing import Final

PREFIX: Final = "edl.dev"

#: The job a pod belongs to (the TrainingJob's name; the namespace is the pod's own).
LABEL_JOB: Final = f"{PREFIX}/job"
#: worker | pserver | coordinator.
LABEL_ROLE: Final = f"{PREFIX}/role"
#: Marks every object the controller manages, for one cheap label-selected watch.
LABEL_MANAGED: Final = f"{PREFIX}/managed"

#: Set on a replica pod that has been told to leave at its next step boundary.
ANNOTATION_DRAINING: Final = f"{PREFIX}/draining"
#: When the drain was requested (seconds since the epoch), for the drain deadline.
ANNOTATION_DRAIN_SINCE: Final = f"{PREFIX}/drain-since"

GPU_RESOURCE: Final = "nvidia.com/gpu"
