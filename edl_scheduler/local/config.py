"""The local service's settings: where it lives, how many slots, which policy.

Slots default to the machine's GPUs, or its CPUs when it has none. The policy defaults to
the ``edl`` preset with time constants fit for one machine, where jobs last minutes rather
than days (a cool-down of 300 s would make a local demo wait five minutes to grow a job
back); a policy file (``base:`` plus overrides, see ``api/policy.py``) replaces it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from edl_scheduler.api.policy import PolicyConfig, load_policy_config
from edl_scheduler.core import Policy
from edl_scheduler.core.building import policy_from_config
from edl_scheduler.local.launching import detect_gpus

DEFAULT_HOME = Path(os.environ.get("EDL_HOME", Path.home() / ".local" / "state" / "edl"))

LOCAL_POLICY = PolicyConfig.model_validate(
    {
        "base": "edl",
        "cooldownSeconds": 5,
        "minRunSeconds": 5,
        # Local jobs are short and restart from local disk: a job of the waiting job's own
        # priority may be suspended after the same 5 s (ten times this).
        "suspendCostSeconds": 0.5,
        "reservationTimeoutSeconds": 120,
        "resizePauseSeconds": 1,
        "gainHorizonSeconds": 120,
    }
)


@dataclass(frozen=True, slots=True)
class LocalConfig:
    """How the local cluster runs. ``gpus``: slots are GPUs (workers see only theirs)."""

    home: Path
    slots: int
    gpus: bool
    policy: Policy
    period_s: float = 0.5

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @property
    def state_dir(self) -> Path:
        return self.home / "coordinators"


def coordinator_name(key: str) -> str:
    """The coordinator's process name (and log file stem) for the job ``key``."""
    return f"{key.replace('/', '.')}.coordinator"


def build_config(
    home: Path, slots: int | None, policy_file: Path | None, period_s: float = 0.5
) -> LocalConfig:
    gpus = detect_gpus()
    if slots is not None and gpus and slots > gpus:
        raise ValueError(
            f"--slots {slots} is more than this machine's {gpus} GPUs: give at most {gpus}, "
            "or hide the GPUs (CUDA_VISIBLE_DEVICES=) to run CPU slots"
        )
    count = slots if slots is not None else (gpus or os.cpu_count() or 1)
    config = (
        load_policy_config(policy_file.read_text()) if policy_file is not None else LOCAL_POLICY
    )
    return LocalConfig(
        home=home.expanduser().resolve(),
        slots=count,
        gpus=gpus > 0,
        policy=policy_from_config(config),
        period_s=period_s,
    )
