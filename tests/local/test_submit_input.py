"""Whatever a user sends the local service's ``POST /jobs``, it answers 4xx with the reason
or accepts the job, and stays up.

Aspects tested (a hypothesis property through the service's HTTP layer, FastAPI's test
client on a scratch home; no process is started): any body, any manifest text, a valid
job with values of any kind, an alias bomb; a 5xx or an exception is a failure. The
service then still lists its jobs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.bad_inputs import odd_value
from edl_scheduler.local.config import build_config
from edl_scheduler.local.serving import LocalService

from ..api.test_bad_input import bad_text
from .jobs import plain_job

JOB = yaml.safe_load(plain_job("fuzz", 1, 2))


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    umask = os.umask(0o022)  # the service sets its own; this process keeps the test's
    os.umask(umask)
    try:
        service = LocalService(build_config(tmp_path_factory.mktemp("home"), 4, None))
        yield TestClient(service.app)
    finally:
        os.umask(umask)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.one_of(
        st.randoms(use_true_random=False).map(odd_value),
        st.fixed_dictionaries({"manifest": st.text(), "workdir": st.text(max_size=20)}),
        bad_text(JOB).map(lambda text: {"manifest": text, "workdir": "/tmp"}),
    )
)
def test_any_submission_is_accepted_or_refused_with_a_reason(client: TestClient, body: Any) -> None:
    answer = client.post(
        "/jobs", content=json.dumps(body), headers={"content-type": "application/json"}
    )
    assert answer.status_code < 500, answer.text
    if answer.status_code >= 400:
        assert answer.json()["detail"], answer.text
    else:
        client.delete(f"/jobs/{answer.json()['namespace']}/{answer.json()['name']}")
    assert client.get("/jobs").status_code == 200


def test_the_service_is_answered_from_a_scratch_home(client: TestClient, tmp_path: Path) -> None:
    assert client.get("/healthz").json()["ok"] is True
