"""The compiled build (``simulations/native.py``) against the Python it is built from.

Aspects:
- ``python -m simulations compile`` builds every module of the planner and the simulator's
  hot path (a module that mypyc cannot compile fails here), and a process started beside
  the build runs it: the planner is loaded from the extension, ``mode()`` says ``NATIVE``;
- that process and this one (Python, as the whole suite runs: ``tests/__init__.py``) give
  the same job records, timelines and plan counts on every run of ``native_runs``;
- only the simulator takes the build: with one there, ``import edl_scheduler`` and the
  planner's own import leave the import system as it was and load the planner as Python,
  and a coordinator's start (``trainer_runtime.coordinator.state``) imports nothing of
  ``edl_scheduler``;
- the build is taken only under its sources' key: a build filed under another key (the
  sources changed since) or an incomplete one is not taken, ``EDL_PURE`` is obeyed, and a
  process whose planner modules were imported before ``activate`` stays Python;
- the key changes with any byte of any compiled source or of what they type against;
- compiled, the planner's value classes refuse the assignment of any field;
- a build sent SIGTERM stops the processes it started (mypyc's C compilers) with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from simulations import native
from tests.simulations import native_runs

ROOT = Path(__file__).resolve().parents[2]


def _env(build_root: Path, **extra: str) -> dict[str, str]:
    env = os.environ | {native.PURE_ENV: "0", native.DIR_ENV: str(build_root)}
    return env | {"PYTHONPATH": str(ROOT)} | extra


def _python(code: str, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


@pytest.fixture(scope="module")
def build_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("native")
    done = subprocess.run(
        [sys.executable, "-m", "simulations", "compile"], cwd=ROOT, env=_env(root),
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_the_build_gives_the_results_of_the_python_it_is_built_from(build_root: Path) -> None:
    assert native.mode() is native.Mode.PURE_ASKED  # this process: the Python modules
    code = "from tests.simulations import native_runs; native_runs.main()"
    out = json.loads(_python(code, _env(build_root), timeout=900))
    assert out["build"]["mode"] == "NATIVE"
    assert out["build"]["planning"].endswith(".so"), out["build"]
    compiled: dict[str, Any] = out["runs"]
    pure = json.loads(json.dumps(native_runs.runs()))
    assert sorted(compiled) == sorted(pure)
    for name in pure:  # as text: 1 and 1.0 differ there (compiled code coerces int to float)
        assert json.dumps(compiled[name]) == json.dumps(pure[name]), name
    assert any(r[2] is not None for r in pure["philly_3d-400/tiresias"]["jobs"])


_ASSIGN = """
import dataclasses
from simulations import native
from tests.core.test_value_classes import VALUES
refused = []
for value in VALUES:
    for f in dataclasses.fields(value):
        try:
            setattr(value, f.name, getattr(value, f.name))
        except AttributeError:
            refused.append(type(value).__name__ + "." + f.name)
        else:
            print("assigned", type(value).__name__, f.name)
print(native.mode().name, len(refused))
"""


def test_compiled_value_classes_refuse_an_assignment(build_root: Path) -> None:
    from tests.core.test_value_classes import VALUES

    fields = sum(len(dataclasses.fields(v)) for v in VALUES)
    assert _python(_ASSIGN, _env(build_root)).split() == ["NATIVE", str(fields)]


_MODE = "from simulations import native; print(native.mode().name)"

_OTHERS = """
import sys
before = list(sys.meta_path)
import edl_scheduler, edl_scheduler.core
from edl_scheduler.core import planning
import trainer_runtime.coordinator.state
print(sys.meta_path == before, planning.__file__.endswith(".py"), "simulations" in sys.modules)
"""

_COORDINATOR = """
import sys
import trainer_runtime.coordinator.state
print(sorted(m for m in sys.modules if m.split(".")[0] == "edl_scheduler"))
"""


def test_only_the_simulator_takes_the_build(build_root: Path) -> None:
    assert _python(_MODE, _env(build_root)).strip() == "NATIVE"
    assert _python(_OTHERS, _env(build_root)).split() == ["True", "True", "False"]
    assert _python(_COORDINATOR, _env(build_root)).strip() == "[]"


def test_a_build_is_taken_only_under_its_sources_key(build_root: Path, tmp_path: Path) -> None:
    (built,) = [p for p in build_root.iterdir() if (p / "manifest.json").is_file()]
    assert _python(_MODE, _env(build_root)).strip() == "NATIVE"
    assert _python(_MODE, _env(build_root, EDL_PURE="1")).strip() == "PURE_ASKED"
    # The sources changed since the build: it is filed under a key they no longer have.
    moved = tmp_path / "other"
    shutil.copytree(built, moved / "0123456789abcdef01234567")
    assert _python(_MODE, _env(moved)).strip() == "PURE_NO_BUILD"
    # A build missing one of its extensions is not taken.
    partial = tmp_path / "partial"
    shutil.copytree(built, partial / built.name)
    next((partial / built.name / "simulations").glob("engine.*")).unlink()
    assert _python(_MODE, _env(partial)).strip() == "PURE_NO_BUILD"
    # Planner modules imported before the build could be taken: the process stays Python.
    late = (
        "import os; from simulations import native; import edl_scheduler.core; "
        "os.environ.pop('EDL_PURE'); "
        "print(native.activate().name)"
    )
    assert _python(late, _env(build_root, EDL_PURE="1")).strip() == "PURE_IMPORTED"


def test_the_key_changes_with_any_byte_of_what_mypyc_reads(tmp_path: Path) -> None:
    files = native.keyed_files()
    assert set(native.modules().values()) <= set(files.values())  # every compiled module
    for rel in ("edl_scheduler/api/spec.py", "edl_gradients/__init__.py", "simulations/cli.py"):
        assert rel in files, rel  # and what they type against, compiled or not
    copies = {}
    for rel, source in files.items():
        copies[rel] = tmp_path / rel
        copies[rel].parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, copies[rel])
    key = native.source_key(copies)
    assert key == native.source_key(files) == native.source_key(native.keyed_files(tmp_path))
    for rel in (
        "edl_scheduler/core/growing.py",
        "simulations/showing.py",
        "edl_scheduler/api/spec.py",
    ):
        original = copies[rel].read_bytes()
        copies[rel].write_bytes(original + b"\n")
        assert native.source_key(copies) != key, rel
        copies[rel].write_bytes(original)
    assert native.source_key(copies) == key


_SPAWNS = """
import subprocess, sys, time
from pathlib import Path
# Like mypyc running the C compiler: a process of its own, which says its pid.
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
Path(sys.argv[1]).write_text(str(grandchild.pid))
time.sleep(120)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # (a zombie no one has reaped yet has stopped all the same)


def test_a_build_stopped_by_sigterm_takes_its_compilers_with_it(tmp_path: Path) -> None:
    said = tmp_path / "pid"
    builder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from simulations import "
         "native; native.run_reaped([sys.executable, '-c', sys.argv[1], sys.argv[2]], Path())",
         _SPAWNS, str(said)],
        cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        for _ in range(200):
            if said.exists() and said.read_text():
                break
            assert builder.poll() is None, "the builder ended before its child started"
            time.sleep(0.05)
        pid = int(said.read_text())
        assert not _gone(pid)
        builder.terminate()
        assert builder.wait(timeout=10) == 128 + 15
        for _ in range(100):
            if _gone(pid):
                break
            time.sleep(0.05)
        assert _gone(pid), "the compiler's process outlived the build that was stopped"
    finally:
        builder.kill()
        if said.exists() and said.read_text() and not _gone(int(said.read_text())):
            os.kill(int(said.read_text()), 9)
