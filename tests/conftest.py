"""Suite-wide settings.

Text output folds to ``COLUMNS`` (80 when unset and piped). Tests that search messages for
a path or a phrase read them unfolded at 400 columns; ``tests/cli/test_cli_conventions.py``
checks the folding itself with ``COLUMNS=80``.

Tests marked ``cuda(n)`` need ``n`` CUDA devices (default 1) and are skipped, with the
reason, where fewer are visible. The count is asked of torch in a child process, and only
when such a test was collected: this process never imports torch for it (tests assert
that the pure core leaves torch unloaded).

``fake_world`` starts torch's fake process group (one process, any world size) for the
tests that count collectives or check shapes and placements without real ranks. Numeric
parity runs on real gloo ranks: ``gloo(world, fn, *args)`` runs ``fn`` on every rank of a
world kept for the session (``hpcodegen.parity.ranks.GlooWorld``: the process start and
the imports are paid once per world size, not once per test; a rank that fails or a test
that times out ends that world and the next test starts a fresh one). Worlds of several
sizes stay alive together up to ``KEPT_RANKS`` ranks (a 2-rank and a 4-rank world: the
modules of a run alternate between them, and a fresh world's ranks import the model code
again); a larger world closes the others first. Every such test keeps its hard ``timeout``
mark.

launch's pre-start model check keeps its passing verdicts in a cache keyed by the bytes it
judged (:mod:`hpcodegen.launch.launcher.check_cache`). The suite points that cache at one
fresh directory per run, shared by the xdist workers (they inherit the controller's
environment): a run never reuses a verdict of an earlier run or of the user's own cache,
and the first launch of each artifact still runs the check. A test that needs the child
itself sets ``HPCODEGEN_CHECK_CACHE=off`` for its launch or calls ``run_model_check``
without a cache. A ``HPCODEGEN_CHECK_CACHE`` already set (``off``) is kept.

Generated artifacts come from one suite-wide memo (:mod:`artifact_memo`): a build with
the same arguments is paid once per run, its directory (``HPCODEGEN_TEST_ARTIFACTS``) made
and removed here like the verdict cache's.

Inductor's cache (``TORCHINDUCTOR_CACHE_DIR``) is one fresh directory per run too, shared by
every test and rank that compiles: its fixed cost (the g++ build of inductor's vector-ISA
probe, about 3 s of CPU in each fresh directory) and any kernel two compiles share are paid
once per run, and no run reads an earlier run's kernels (the cold cost is what every run
measures). A directory already set is kept.

Order: the modules whose tests carry an explicit ``timeout`` mark (the suite's rule puts
one on every test that waits on a subprocess: launches, CLI runs, gloo worlds) run first,
the longest mark first, each module kept whole (its module fixtures are built once); the
in-process tests follow. Under ``make test``'s work-stealing xdist workers that puts the
long multi-process tests at the start of each worker's queue and the short ones at its end,
so the run does not end with one worker idle while the other finishes a long launch.

The test processes collect garbage less often (``gc.set_threshold(20_000, 20, 20)``, for
CPython's 700, 10, 10): an in-process run of tests/generate, tests/unit and two gate modules
(1554 tests, 116 s of CPU) spent 11.4 s in 12759 young and 28 full collections, and 4.1 s
in 271 and 1 with it, each timed by ``gc.callbacks``. Freezing the heap after torch's import
instead (what hpcodegen's own processes do, :mod:`hpcodegen.gc_pause`) made the full
collections more frequent here (47): a test process keeps allocating for minutes.
"""

import gc
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import pytest
from artifact_memo import DIR_ENV as ARTIFACT_MEMO_DIR

os.environ["COLUMNS"] = "400"
gc.set_threshold(20_000, 20, 20)  # see the module docstring

#: the model check's verdict cache (hpcodegen.launch.launcher.check_cache.CACHE_ENV)
CHECK_CACHE_ENV = "HPCODEGEN_CHECK_CACHE"
#: inductor's compiled-kernel cache (torch reads it when it first compiles)
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
#: the run-wide directories this process made (removed at its end)
_made_dirs: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """One verdict cache, one artifact memo directory (:mod:`artifact_memo`) and one
    inductor cache per run: made by the process that starts first (the xdist controller,
    before it spawns the workers, or the only process), removed by it."""
    for env, prefix in ((CHECK_CACHE_ENV, "hpcodegen-check-cache-"),
                        (ARTIFACT_MEMO_DIR, "hpcodegen-test-artifacts-"),
                        (INDUCTOR_CACHE_ENV, "hpcodegen-inductor-")):
        if env not in os.environ:
            os.environ[env] = tempfile.mkdtemp(prefix=prefix)
            _made_dirs.append(os.environ[env])


def pytest_unconfigure(config: pytest.Config) -> None:
    for path in _made_dirs:
        shutil.rmtree(path, ignore_errors=True)


@cache
def cuda_devices() -> int:
    """CUDA devices torch sees here (0 without the driver or a CUDA build of torch)."""
    if not any(os.path.exists(p) for p in ("/dev/nvidia0", "/proc/driver/nvidia/gpus")):
        return 0  # no NVIDIA driver: no need to start torch to know
    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=300, check=True).stdout
        return int(out.split()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return 0


def _timeout_mark(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    try:
        return float(marker.args[0] if marker.args else marker.kwargs.get("timeout", 0)) \
            if marker is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


def _long_first(items: list[pytest.Item]) -> None:
    """Stable sort, module by module (each kept whole, at its first item's place among its
    equals), by the longest explicit timeout mark of the module."""
    weight: dict[str, float] = {}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        module = item.nodeid.split("::")[0]
        weight[module] = max(weight.get(module, 0.0), _timeout_mark(item))
        first.setdefault(module, i)
    order = {id(item): i for i, item in enumerate(items)}

    def key(item: pytest.Item) -> tuple[float, int, int]:
        module = item.nodeid.split("::")[0]
        return -weight[module], first[module], order[id(item)]
    items.sort(key=key)


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by higher-scoped fixtures
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _long_first(items)
    for item in items:
        marker = item.get_closest_marker("cuda")
        if marker is None:
            continue
        need = int(marker.args[0]) if marker.args else 1
        have = cuda_devices()
        if have < need:
            item.add_marker(pytest.mark.skip(
                reason=f"needs {need} CUDA device(s), {have} visible"))


@pytest.fixture
def fake_world() -> Iterator[Callable[..., None]]:
    """``init(world, rank=0)`` starts a fake process group of that size
    (:func:`hpcodegen.derive.world.start_fake_world`); torn down after."""
    from hpcodegen.derive.world import end_world, start_fake_world

    yield start_fake_world
    end_world()


#: ranks the kept gloo worlds of one test process may hold alive together: a 2-rank and a
#: 4-rank world stay up side by side (modules alternate between them; each fresh rank
#: imports the model code again, about 2 s of CPU), an 8-rank world runs alone
KEPT_RANKS = 8


@pytest.fixture(scope="session")
def _gloo_worlds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, Any]]:
    """The kept gloo worlds by size (at most :data:`KEPT_RANKS` ranks alive together),
    ended with the session."""
    worlds: dict[int, Any] = {}
    yield worlds
    for world in worlds.values():
        world.close()


@pytest.fixture(scope="session")  # session: module fixtures run their cases on it too
def gloo(_gloo_worlds: dict[int, Any], tmp_path_factory: pytest.TempPathFactory
         ) -> Callable[..., list[Any]]:
    """``gloo(world, fn, *args)``: ``fn(*args)`` on ``world`` real gloo ranks, the per-rank
    results (JSON-able) in rank order. ``fn`` must be importable (a module-level function)."""
    from hpcodegen.parity.ranks import GlooWorld

    open_sizes: set[int] = set()  # the worlds whose ranks are alive

    def run(world: int, fn: Callable[..., Any], *args: Any) -> list[Any]:
        others = open_sizes - {world}
        if world + sum(others) > KEPT_RANKS:  # memory: close the others first
            for size in others:
                _gloo_worlds[size].close()
            open_sizes.difference_update(others)
        if world not in _gloo_worlds:
            _gloo_worlds[world] = GlooWorld(world, tmp_path_factory.mktemp(f"gloo{world}"))
        try:
            result = _gloo_worlds[world].run(fn, *args)
        except BaseException:
            open_sizes.discard(world)  # the world ended itself (a failed rank, a timeout)
            raise
        open_sizes.add(world)
        return result

    return run
