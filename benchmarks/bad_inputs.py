"""Bad input at every entry point of user text: one JSON line per entry point.

    python benchmarks/bad_inputs.py [--count 10000] [--seed 0] [--entry NAME ...]

Each entry point gets ``--count`` inputs made from a valid one by seeded random mutations
(a value replaced by one of another type, a huge, negative or non-finite number, a long or
binary string, deep nesting; a key removed or added; YAML aliases, truncation, stray
syntax, bytes that are not UTF-8; whole files of junk) and is called on each, in this
process, with a 5 s alarm. Every call ends one of four ways:

- ``refused``: the entry point's own error for bad input (the message names the field);
- ``accepted``: the mutation happened to leave the input valid;
- ``crashed``: any other exception (a traceback where a user should read one line);
- ``hung``: still running after 5 s.

Goal: ``crashed`` and ``hung`` both 0. The entry points: a TrainingJob as YAML text
(``edlctl submit -f``, the local service) and as a parsed object (what the controller reads
from the API server), a policy file, the local service's ``POST /jobs`` (its HTTP layer,
through FastAPI's test client, on a scratch home), and a trace file for the simulator.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from edl_scheduler.api import TrainingJobError, load_training_job
from edl_scheduler.api.policy import load_policy_config

REPO = Path(__file__).resolve().parents[1]
JOB = yaml.safe_load((REPO / "examples" / "02-local-jobs" / "urgent.yaml").read_text())
POLICY = {"base": "edl", "cooldownSeconds": 120, "preemption": "shrink-then-suspend"}
TRACE = (REPO / "tests" / "simulations" / "data" / "60_job.csv").read_text()
HANG_S = 5


class Hung(Exception):
    """The call ran past ``HANG_S``."""


@contextmanager
def alarm(seconds: int) -> Iterator[None]:
    def ring(*_: object) -> None:
        raise Hung

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def odd_value(rng: random.Random) -> Any:
    """A value of a random kind that no field expects all of."""
    kind = rng.randrange(14)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice((True, False))
    if kind == 2:
        return rng.choice((-1, 0, 2**63, 10**40, -(10**30)))
    if kind == 3:
        return rng.choice((math.nan, math.inf, -math.inf, 1e308, 1e-320, 2.5))
    if kind == 4:
        return ""
    if kind == 5:
        return "x" * (1_600_000 if rng.random() < 0.05 else rng.choice((1000, 100_000)))
    if kind == 6:
        return "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(1, 40)))
    if kind == 7:
        nest: Any = "deep"
        for _ in range(rng.choice((10, 70, 300))):
            nest = [nest] if rng.random() < 0.5 else {"k": nest}
        return nest
    if kind == 8:
        return [odd_value(rng) for _ in range(rng.randrange(0, 4))]
    if kind == 9:
        return {f"k{i}": odd_value(rng) for i in range(rng.randrange(0, 3))}
    if kind == 10:
        return rng.choice(("1e9", "-5", "lots", "500m", "16Gi", "0x10", "1_000", "∞"))
    if kind == 11:
        return rng.choice(("2024-13-45T99:99:99Z", "yesterday", "1970-01-01T00:00:00"))
    if kind == 12:
        return rng.randrange(-(10**6), 10**6)
    return rng.random() * 10 ** rng.randrange(-5, 40)


def value_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every value in ``node`` (a parsed document), itself first."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += value_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += value_paths(value, (*prefix, i))
    return found


def mutated(document: dict[str, Any], rng: random.Random) -> Any:
    """``document`` with one to three random mutations (a deep copy)."""
    doc: Any = json.loads(json.dumps(document))
    for _ in range(rng.randrange(1, 4)):
        paths = value_paths(doc)
        path = rng.choice(paths)
        if not path:
            if rng.random() < 0.2:
                doc = odd_value(rng)
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        how = rng.randrange(3)
        if how == 0:
            parent[path[-1]] = odd_value(rng)
        elif how == 1 and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[f"unknown{rng.randrange(100)}"] = odd_value(rng)
        else:
            parent[path[-1]] = odd_value(rng)
    return doc


def alias_bomb(levels: int) -> str:
    """YAML whose aliases expand to ``9 ** levels`` nodes in a few hundred bytes."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def as_text(value: Any, rng: random.Random) -> str:
    """``value`` as YAML, sometimes damaged as text."""
    try:
        text = yaml.safe_dump(value, sort_keys=False, allow_unicode=True)
    except (yaml.YAMLError, RecursionError, ValueError):
        text = json.dumps(value, default=str)
    damage = rng.randrange(8)
    if damage == 0:
        return text[: rng.randrange(len(text) + 1)]
    if damage == 1:
        at = rng.randrange(len(text) + 1)
        return text[:at] + rng.choice("[]{}&*!|>%@`:'\"\t\\-?,#") + text[at:]
    if damage == 2:
        return text + "\n" + alias_bomb(rng.randrange(2, 12))
    if damage == 3:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400))).decode("latin-1")
    if damage == 4:
        return text + "---\n" + text
    return text


def _trace_bytes(rng: random.Random) -> bytes:
    lines = TRACE.splitlines()
    header, rows = lines[0], lines[1:]
    rows = rows[: rng.randrange(0, len(rows) + 1)]
    out = []
    for row in rows:
        cells = row.split(",")
        if rng.random() < 0.2:
            value = odd_value(rng)
            cells[rng.randrange(len(cells))] = (
                value[:40]
                if isinstance(value, str)
                else repr(value if not isinstance(value, list | dict) else "[...]")
            )
        out.append(",".join(cells))
    if rng.random() < 0.2:
        header = ",".join(rng.sample(header.split(","), k=len(header.split(","))))[1:]
    if rng.random() < 0.1:
        return bytes(rng.randrange(256) for _ in range(200))  # not text
    if rng.random() < 0.2:
        out += out[:3]  # job ids twice
    return ("\n".join([header, *out]) + "\n").encode()


#: An entry point: makes one input from the generator, and calls the entry point on it.
Make = Callable[[random.Random], Any]
Call = Callable[[Any], None]


def entries(scratch: Path) -> dict[str, tuple[Make, Call, tuple[type[BaseException], ...]]]:
    """Each entry point: how its inputs are made, the call on one, and the errors that
    mean refused."""
    from fastapi.testclient import TestClient

    from edl_scheduler.local.config import build_config
    from edl_scheduler.local.serving import LocalService
    from simulations.traces import TraceError, load_tiresias

    service = LocalService(build_config(scratch / "home", 4, None))
    client = TestClient(service.app, raise_server_exceptions=True)
    trace = scratch / "trace.csv"

    class Refused(Exception):
        """The service answered 4xx with a detail."""

    def submission(rng: random.Random) -> Any:
        doc = mutated(JOB, rng)
        if isinstance(doc, dict) and isinstance(doc.get("metadata"), dict):
            doc["metadata"]["name"] = f"fuzz{rng.randrange(10**9)}"
        body: Any = {"manifest": as_text(doc, rng), "workdir": str(scratch)}
        return mutated(body, rng) if rng.random() < 0.1 else body

    def submit(body: Any) -> None:
        # As JSON with NaN and Infinity left in, as a careless client may send them.
        answer = client.post(
            "/jobs", content=json.dumps(body), headers={"content-type": "application/json"}
        )
        if 400 <= answer.status_code < 500 and answer.json().get("detail"):
            raise Refused
        if answer.status_code >= 500:
            raise RuntimeError(f"{answer.status_code}: {answer.text[:200]}")
        client.delete(f"/jobs/default/{answer.json()['name']}")

    def trace_file(data: bytes) -> None:
        trace.write_bytes(data)
        load_tiresias(trace)

    return {
        "job-yaml": (lambda r: as_text(mutated(JOB, r), r), load_training_job, (TrainingJobError,)),
        "job-object": (lambda r: mutated(JOB, r), load_training_job, (TrainingJobError,)),
        "policy-file": (
            lambda r: as_text(mutated(POLICY, r), r),
            load_policy_config,
            (TrainingJobError,),
        ),
        "local-submit": (submission, submit, (Refused,)),
        "trace-file": (_trace_bytes, trace_file, (TraceError,)),
    }


def run(
    name: str,
    make: Make,
    call: Call,
    refused: tuple[type[BaseException], ...],
    count: int,
    seed: int,
) -> dict[str, Any]:
    rng = random.Random(f"{seed}-{name}")
    tally = {"refused": 0, "accepted": 0, "crashed": 0, "hung": 0}
    examples: list[str] = []
    started = time.monotonic()
    for i in range(count):
        made = make(rng)
        try:
            with alarm(HANG_S):
                call(made)
            tally["accepted"] += 1
        except Hung:
            tally["hung"] += 1
            examples.append(f"input {i}: hung")
        except refused:
            tally["refused"] += 1
        except Exception as error:
            tally["crashed"] += 1
            if len(examples) < 5:
                examples.append(f"input {i}: {type(error).__name__}: {str(error)[:200]}")
    return {
        "entry": name,
        "inputs": count,
        **tally,
        "seconds": round(time.monotonic() - started, 1),
        "examples": examples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--entry", action="append", help="only these entry points")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        for name, (make, call, refused) in entries(Path(scratch)).items():
            if args.entry and name not in args.entry:
                continue
            print(json.dumps(run(name, make, call, refused, args.count, args.seed)), flush=True)


if __name__ == "__main__":
    main()
