"""Which log a person's name for it means (``edl_scheduler.local.logs``).

Aspects tested:
- a worker by number, by short name or by full name, a parameter server by short name,
  and the coordinator;
- by default the worker of rank 0, else the oldest live worker, else (the job ended) the
  last worker's log kept (never a server's);
- the logs listed by short name, workers then servers in number order, after the job's
  processes are gone;
- a name of another job's log, or of a file outside the log folder, is refused with the
  names there are.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edl_scheduler.local.logs import LogNotFound, find_log, log_names

KEY = "default.lr2"


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("worker-0", "worker-1", "worker-10", "worker-2", "coordinator", "pserver-11"):
        (logs / f"{KEY}.{name}.log").write_text(name)
    (logs / "default.other.worker-0.log").write_text("another job's")
    (tmp_path / "secret.log").write_text("not a log")
    return logs


def _named(log_dir: Path, worker: str | None, ranks: dict[str, int] | None = None,
           live: list[str] | None = None) -> str:  # fmt: skip
    return find_log(log_dir, "default/lr2", worker, ranks or {}, live or []).read_text()


def test_a_log_by_number_short_name_or_full_name(log_dir: Path) -> None:
    assert _named(log_dir, "1") == "worker-1"
    assert _named(log_dir, "worker-10") == "worker-10"
    assert _named(log_dir, f"{KEY}.worker-2") == "worker-2"
    assert _named(log_dir, "coordinator") == "coordinator"
    assert _named(log_dir, "pserver-11") == "pserver-11"  # a ps job's parameter server


def test_the_default_is_rank_zero_then_the_oldest_live_then_the_last_kept(log_dir: Path) -> None:
    ranks = {f"{KEY}.worker-2": 0, f"{KEY}.worker-1": 1}
    assert _named(log_dir, None, ranks, [f"{KEY}.worker-1", f"{KEY}.worker-2"]) == "worker-2"
    assert _named(log_dir, None, {}, [f"{KEY}.worker-1", f"{KEY}.worker-2"]) == "worker-1"
    assert _named(log_dir, None) == "worker-10"


def test_the_logs_are_listed_by_short_name(log_dir: Path) -> None:
    assert log_names(log_dir, "default/lr2") == [
        "worker-0", "worker-1", "worker-2", "worker-10", "pserver-11", "coordinator",
    ]  # fmt: skip


@pytest.mark.parametrize("name", ["default.other.worker-0", "../secret", "worker-7", "x"])
def test_other_names_are_refused_with_the_names_there_are(log_dir: Path, name: str) -> None:
    with pytest.raises(LogNotFound, match="worker-0, worker-1, worker-2, worker-10"):
        _named(log_dir, name)
