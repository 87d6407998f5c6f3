"""Loaders and the workload's assumptions.

Aspects:
- cluster specs: ``NxG`` and the Tiresias ``n*g*.csv`` files; bad specs are refused;
- the Tiresias format and the Philly format: names, submit times (Philly's relative to its
  first job, time-zone free), groups, sorting;
- malformed rows: an error naming file and line, or with ``skip_bad_rows`` a count;
  non-finite, negative and huge times refused; a trace without jobs or with an id twice
  refused; any file at all (a property) is a workload of finite jobs or one TraceError;
- elasticity bounds, scaling curves and their parser, seeded priorities.
"""

from __future__ import annotations

import math
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulations.traces import (
    TRACES_ENV,
    TraceError,
    default_traces,
    load_cluster,
    load_philly,
    load_tiresias,
)
from simulations.workload import (
    ClusterSpec,
    Elasticity,
    Scaling,
    ScalingRule,
    ScalingSpecError,
    bounds,
    parse_priorities,
    shape,
)

DATA = Path(__file__).parent / "data"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_cluster_specs(tmp_path: Path) -> None:
    assert load_cluster("16x4") == ClusterSpec(16, 4)
    spec = write(
        tmp_path,
        "n32g4.csv",
        "num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n1,32,4,40,256\n",
    )
    assert load_cluster(str(spec)) == ClusterSpec(32, 4)
    for bad in ("0x4", "16by4", str(tmp_path / "missing.csv")):
        with pytest.raises(TraceError):
            load_cluster(bad)


def test_default_traces_beside_the_checkout_unless_the_environment_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(TRACES_ENV, raising=False)
    assert (default_traces() / "README.md").is_file()  # ../shared/traces, as CI has it
    assert default_traces().parent.parent == Path(__file__).resolve().parents[3]
    monkeypatch.setenv(TRACES_ENV, str(tmp_path))
    assert default_traces() == tmp_path
    monkeypatch.setenv(TRACES_ENV, "")
    assert default_traces().parts[-2:] == ("shared", "traces")


def test_tiresias_sample_trace() -> None:
    workload = load_tiresias(DATA / "60_job.csv", ClusterSpec(32, 4))
    assert len(workload.jobs) == 60
    first = workload.jobs[0]
    assert (first.name, first.submit_time, first.requested, first.duration) == ("job-0", 0, 1, 164)
    times = [j.submit_time for j in workload.jobs]
    assert times == sorted(times)


def test_philly_format(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "philly.csv",
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,1,66.0,vc1\n"
        "2017-10-09 06:13:03,2951.0,2,5902.0,vc2\n"
        "2017-11-05 06:13:03,10.0,1,10.0,vc2\n",
    )
    workload = load_philly(path)
    assert [(j.name, j.submit_time, j.requested, j.group) for j in workload.jobs] == [
        ("philly-3", 0.0, 2, "vc2"),
        ("philly-2", 2932.0, 1, "vc1"),
        # 27 days later, across a daylight-saving change: exactly 27 x 86,400 s.
        ("philly-4", 27 * 86400.0, 1, "vc2"),
    ]
    assert len(load_philly(path, limit=2).jobs) == 2


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2,1,10,5,m,-4,1", "duration '-4' is not a number of seconds"),
        ("2,1,10,5,m,nan,1", "duration 'nan' is not a number of seconds"),
        ("2,1,10,5,m,inf,1", "duration 'inf' is not a number of seconds"),
        ("2,1,10,5,m,1e308,1", "duration '1e308' is not a number of seconds"),
        ("2,1,nan,5,m,4,1", "submit time 'nan' is not a number of seconds"),
        ("2,1,1e20,5,m,4,1", "submit time '1e20' is not a number of seconds"),
        ("2,9,10,5,m,4,1", "9 GPUs requested, the cluster has 8"),
        ("2,x,10,5,m,4,1", "invalid literal"),
        ("2,1,,5,m,4,1", "empty value in column(s) submit_time"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    header = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
    path = write(tmp_path, "t.csv", header + "1,1,0,5,m,4,1\n" + row + "\n")
    with pytest.raises(TraceError, match=rf"t\.csv:3: .*{message[:20]}"):
        load_tiresias(path, ClusterSpec(2, 4))
    workload = load_tiresias(path, ClusterSpec(2, 4), skip_bad_rows=True)
    assert (len(workload.jobs), workload.skipped_rows) == (1, 1)


def test_a_trace_without_jobs_or_with_one_id_twice_is_refused(tmp_path: Path) -> None:
    header = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
    empty = write(tmp_path, "empty.csv", header)
    with pytest.raises(TraceError, match=r"empty\.csv: no job to simulate \(it has a header"):
        load_tiresias(empty)
    bad = write(tmp_path, "bad.csv", header + "1,1,0,5,m,x,1\n")
    with pytest.raises(TraceError, match=r"all 1 rows were malformed"):
        load_tiresias(bad, skip_bad_rows=True)
    twice = write(tmp_path, "twice.csv", header + "7,1,0,5,m,4,1\n7,1,5,5,m,4,1\n")
    with pytest.raises(TraceError, match=r"job 'job-7' appears twice"):
        load_tiresias(twice)


def test_missing_column(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "job_id,num_gpu,submit_time\n1,1,0\n")
    with pytest.raises(TraceError, match=r"t\.csv:1: missing column\(s\) duration"):
        load_tiresias(path)


def test_elasticity_bounds() -> None:
    assert bounds(4, Elasticity.RIGID, 64) == (4, 4)
    assert bounds(4, Elasticity.ELASTIC, 64) == (2, 8)
    assert bounds(5, Elasticity.ELASTIC, 64) == (3, 10)
    assert bounds(48, Elasticity.ELASTIC, 64) == (24, 64)  # capped by the cluster
    assert bounds(1, Elasticity.ELASTIC, 64) == (1, 2)


def test_scaling_curves_and_their_parser() -> None:
    assert ScalingRule.parse("linear") == ScalingRule(0.0, 0.0)
    assert ScalingRule.parse("amdahl:0.1") == ScalingRule(0.1, 0.1)
    assert ScalingRule.parse("amdahl:0.05-0.3") == ScalingRule(0.05, 0.3)
    for bad in ("amdahl", "amdahl:x", "amdahl:2", "amdahl:0.3-0.1", "cubic:1"):
        with pytest.raises(ScalingSpecError):
            ScalingRule.parse(bad)
    assert Scaling(0.0).speedup(8) == 8
    assert Scaling(0.1).speedup(1) == 1
    assert Scaling(0.1).speedup(10) == pytest.approx(1 / 0.19)
    drawn = ScalingRule(0.05, 0.3).draw(random.Random(1))
    assert 0.05 <= drawn.serial <= 0.3


def test_shape_is_seeded() -> None:
    workload = load_tiresias(DATA / "60_job.csv")
    cluster = ClusterSpec(16, 4)

    def make(seed: int) -> object:
        return shape(
            workload.jobs,
            elasticity=Elasticity.ELASTIC,
            scaling=ScalingRule(0.0, 0.5),
            cluster=cluster,
            seed=seed,
            priority_levels=parse_priorities("draw:3"),
        )

    assert make(7) == make(7)
    assert make(7) != make(8)
    jobs = make(7)
    assert {j.priority for j in jobs} == {0, 1, 2}  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        parse_priorities("draw:0")


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=300),
        st.lists(
            st.lists(
                st.one_of(
                    st.integers(-5, 10**6).map(str),
                    st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.text(max_size=8),
                ),
                min_size=7,
                max_size=7,
            ),
            max_size=6,
        ).map(
            lambda rows: (
                "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
                + "".join(",".join(r).replace("\n", " ") + "\n" for r in rows)
            ).encode()
        ),
    )
)
def test_any_trace_file_is_a_workload_or_a_trace_error(data: bytes) -> None:
    """Junk bytes, junk cells, non-finite and huge numbers, ids twice, no rows: a workload
    of finite jobs, or one TraceError; never another exception."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.csv"
        path.write_bytes(data)
        try:
            workload = load_tiresias(path, ClusterSpec(2, 4))
        except TraceError as error:
            assert str(error).startswith(str(path))
            return
    assert workload.jobs and all(
        math.isfinite(j.duration) and math.isfinite(j.submit_time) for j in workload.jobs
    )
