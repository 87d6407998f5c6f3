"""The planner's and the simulator's hot modules compiled to C with mypyc, used where a build
of these exact sources exists: the same code and the same results, about twice as fast.

Why: a trace replay spends nearly all its time in the planner and in the simulator's event
loop, pure Python that is fully typed (``mypy --strict``). mypyc (part of mypy) compiles such
modules to C extensions with no change to their source, so a researcher who replays long
traces builds once (``edl-sim compile``, about two minutes) and every later simulator
process picks the build up: ``import simulations`` calls ``activate`` (the package's
``__init__``), before any planner module loads where the simulator is imported first. The
build lives here, with its users: the controller, the local backend and the trainer
runtime never import it, so ``import edl_scheduler`` and a coordinator's start do nothing
of it, and they run the planner as Python. A script that imports the planner before the
simulator (a benchmark) imports ``simulations`` first to run the build.

What must stay true:
- A build is keyed by the bytes of every module mypyc read to make it (``KEYED``: the
  compiled packages whole and the API models and gradient rules they type against; a
  compiled module carries their types and constants) and the interpreter's ABI, and is
  used only under that key: an edited source never runs from a stale build; it runs as
  Python until it is built again. The key is taken from the copies mypyc builds,
  so a file saved during a build cannot be filed under the bytes it had before.
- All or nothing: compiled classes are C structs that compiled callers read directly, so a
  compiled module handed an object of the same class from the pure module fails.
  ``activate`` takes the build only while none of ``modules()`` is imported yet; otherwise
  the process stays pure.
- Pure Python is always the fallback (no build, ``EDL_PURE=1``, a module imported first),
  and ``mode()`` says which runs, so that a reported timing names what it timed.
- Package ``__init__`` modules and ``NOT_COMPILED`` stay Python; everything else in
  ``PACKAGES`` must compile (``tests/simulations/test_native.py`` builds all of it).
"""

from __future__ import annotations

import enum
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

#: The packages, as the parts of their dotted names, whose modules are compiled.
PACKAGES: tuple[tuple[str, ...], ...] = (
    ("edl_scheduler", "core"),
    ("edl_scheduler", "core", "incremental"),
    ("simulations",),
)
#: Modules left as Python: the command line, reports and plots (click, rich, matplotlib:
#: nothing hot), trace loading (once per run), the Pollux profiles (not on the
#: benchmarks' paths; mypyc refuses one of their int-or-float locals), this module (it
#: loads the build), and the planner's PlanningError (mypyc cannot subclass RuntimeError).
NOT_COMPILED = frozenset(
    {
        "simulations.__main__",
        "simulations.cli",
        "simulations.fidelity",
        "simulations.native",
        "simulations.plotting",
        "simulations.profiles",
        "simulations.reporting",
        "simulations.scenario",
        "simulations.synthetic",
        "simulations.traces",
        "edl_scheduler.core.errors",
    }
)
#: What the key covers, relative to the directory that holds the packages: what mypyc reads.
KEYED: tuple[str, ...] = (
    "edl_scheduler/core",
    "edl_scheduler/api",
    "edl_gradients",
    "simulations",
)
#: Bumped when the layout of a build directory changes.
_FORMAT = "2"
_MANIFEST = "manifest.json"
#: Set (to anything but "" or "0") to run pure Python even where a build exists.
PURE_ENV = "EDL_PURE"
#: Where builds are kept (default: $XDG_CACHE_HOME/edl/native, else ~/.cache/edl/native).
DIR_ENV = "EDL_NATIVE_DIR"


class Mode(enum.Enum):
    """Which code a process runs, and why."""

    NATIVE = "native"
    PURE_NO_BUILD = "pure: no build of these sources (run `edl-sim compile`)"
    PURE_ASKED = f"pure: {PURE_ENV} is set"
    PURE_IMPORTED = "pure: the planner was imported before the build could be taken"


class BuildError(RuntimeError):
    """mypyc or the C compiler failed; the message carries their output."""


_mode = Mode.PURE_NO_BUILD


def _package_dir(parts: tuple[str, ...]) -> Path:
    """A package's directory, found without importing it (the simulator's may be importing)."""
    spec = importlib.util.find_spec(parts[0])
    if spec is None or not spec.submodule_search_locations:
        raise BuildError(f"package {parts[0]} not found")
    return Path(next(iter(spec.submodule_search_locations))).joinpath(*parts[1:])


def modules() -> dict[str, Path]:
    """Every compiled module's dotted name and source file, in a stable order."""
    found: dict[str, Path] = {}
    for parts in PACKAGES:
        if importlib.util.find_spec(parts[0]) is None:  # (an install without the simulator)
            continue
        for source in sorted(_package_dir(parts).glob("*.py")):
            name = ".".join((*parts, source.stem))
            if source.stem != "__init__" and name not in NOT_COMPILED:
                found[name] = source
    return found


def keyed_files(root: Path | None = None) -> dict[str, Path]:
    """``KEYED``'s Python files by their path relative to ``root`` (default: where the
    packages are installed), sorted."""
    if root is None:
        root = _package_dir(("edl_scheduler",)).parent
    found: dict[str, Path] = {}
    for rel in KEYED:
        path = root / rel
        for file in [path] if path.suffix == ".py" else path.rglob("*.py"):
            if file.is_file() and "__pycache__" not in file.parts:
                found[file.relative_to(root).as_posix()] = file
    return dict(sorted(found.items()))


def source_key(files: Mapping[str, Path] | None = None) -> str:
    """The build's key: ``files`` (default ``keyed_files()``) by path and bytes, and the
    interpreter's ABI and platform. (Not mypy's version: a build by another mypyc is as
    valid for the same sources, and reading it costs every import ~50 ms.)"""
    import hashlib
    import sysconfig

    digest = hashlib.sha256(f"{_FORMAT}|{sys.implementation.cache_tag}|".encode())
    digest.update(sysconfig.get_platform().encode())
    for rel, file in (keyed_files() if files is None else files).items():
        digest.update(f"|{rel}|".encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:24]


def cache_root() -> Path:
    """Where builds are kept (``EDL_NATIVE_DIR`` overrides)."""
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    # (expanduser, unlike Path.home, never raises where no home is known, as in some pods;
    # it then leaves "~" as it is, a relative path that no build is ever written to)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "edl" / "native"


def build_dir(key: str | None = None) -> Path:
    """The directory of the build for these sources (it may not exist yet)."""
    return cache_root() / (key or source_key())


def _read_manifest(directory: Path) -> dict[str, Path] | None:
    """The build's module -> extension file map; None where it is missing or incomplete."""
    import json

    try:
        names: dict[str, str] = json.loads((directory / _MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    files = {name: directory / rel for name, rel in names.items()}
    return files if all(f.is_file() for f in files.values()) else None


class _Finder:
    """Answers the compiled modules' imports from the build; every other import falls
    through to the usual finders. (A meta path finder needs only ``find_spec``; the
    ``importlib.abc`` base would cost every import of the package ~50 ms.)"""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        return None if file is None else importlib.util.spec_from_file_location(fullname, file)


def activate() -> Mode:
    """Takes the build of these sources where one exists and nothing compiled is imported
    yet (see the module docstring); returns, and remembers for ``mode()``, what runs."""
    global _mode
    if any(isinstance(finder, _Finder) for finder in sys.meta_path):
        return _mode
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        _mode = Mode.PURE_ASKED
        return _mode
    if not cache_root().is_dir():  # no build anywhere: nothing to hash
        _mode = Mode.PURE_NO_BUILD
        return _mode
    files = _read_manifest(build_dir())
    if files is None:
        _mode = Mode.PURE_NO_BUILD
    elif any(name in sys.modules for name in files):
        _mode = Mode.PURE_IMPORTED
    else:
        sys.meta_path.insert(0, _Finder(files))
        _mode = Mode.NATIVE
    return _mode


def mode() -> Mode:
    """What this process runs (as ``activate`` found it)."""
    return _mode


def build() -> Path:
    """Compiles ``modules()`` with mypyc into ``build_dir()`` and returns it; a complete
    build already there is kept. The packages are copied to a scratch directory first, so
    nothing is written beside them, the key is taken from those copies, and the finished
    build is moved in whole (a concurrent or interrupted build never leaves a half one
    under the key; an incomplete one found there is replaced)."""
    import json  # (the build's imports stay out of every import of the package)
    import shutil
    import tempfile

    if not Path(os.path.expanduser("~")).is_absolute() and not os.environ.get(DIR_ENV):
        raise BuildError(f"no home directory to keep builds in: set {DIR_ENV}")
    root = cache_root()
    if _read_manifest(build_dir()) is not None:
        return build_dir()
    sources = modules()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise BuildError(f"cannot create {root} ({error}): set {DIR_ENV}") from error
    with tempfile.TemporaryDirectory(prefix="edl-native-") as scratch:
        work = Path(scratch)
        for top in sorted({rel.split("/")[0] for rel in KEYED}):
            # The whole package trees, for type checking; only ``sources`` are compiled.
            shutil.copytree(_package_dir((top,)), work / top, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.so"))  # fmt: skip
        key = source_key(keyed_files(work))
        target = root / key
        # mypyc type-checks what it compiles; pydantic's plugin types the API models that
        # the planner's building module reads.
        (work / "mypy.ini").write_text("[mypy]\nplugins = pydantic.mypy\n")
        files = [name.replace(".", "/") + ".py" for name in sources]
        command = [sys.executable, "-m", "mypyc", "--config-file", "mypy.ini", *files]
        returncode, output = run_reaped(command, work)
        if returncode != 0:
            raise BuildError(f"mypyc failed ({returncode}): {' '.join(command)}\n{output}")
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
        manifest: dict[str, str] = {}
        for name in sources:
            rel = name.replace(".", "/") + suffix
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(work / rel, staging / rel)
            manifest[name] = rel
        for shared in work.glob(f"*__mypyc{suffix}"):  # the group's runtime, imported by name
            shutil.copy2(shared, staging / shared.name)
            manifest[shared.name.removesuffix(suffix)] = shared.name
        (staging / _MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        if target.exists() and _read_manifest(target) is None:
            shutil.rmtree(target, ignore_errors=True)  # an incomplete build: replaced
        try:
            staging.rename(target)
        except OSError:  # another build finished first: keep it
            shutil.rmtree(staging, ignore_errors=True)
        if _read_manifest(target) is None:
            raise BuildError(f"the build in {target} is incomplete: remove it and build again")
    return target


def run_reaped(command: Sequence[str], cwd: Path) -> tuple[int, str]:
    """Runs ``command`` in ``cwd`` and returns its exit status and its output (stdout, then
    stderr). It runs in a process group of its own, which is killed whole if this process is
    interrupted or sent SIGTERM meanwhile: mypyc runs the C compiler in further processes,
    and a build stopped by a signal to this process alone left them compiling for minutes."""
    import signal
    import subprocess
    import threading

    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, terminated) if on_main else None
    try:
        with subprocess.Popen(
            list(command),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        ) as child:
            try:
                out, err = child.communicate()
            except BaseException:
                os.killpg(child.pid, signal.SIGKILL)  # (the Popen's exit then reaps it)
                raise
        return child.returncode, f"{out or ''}{err or ''}"
    finally:
        if on_main:  # (None: a handler not set from Python; the default is the nearest)
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
