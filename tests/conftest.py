"""Shared fixtures; tests marked ``gpu`` are skipped cleanly without a Hopper GPU."""
import os
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase

# no progress lines on stderr from commands the tests run (they assert what stderr holds);
# tests/test_hostile_bounds.py turns them on where it checks them
os.environ.setdefault("CBRULES_PROGRESS_AFTER", "0")

# Property tests replay from a saved example database (committed with the tests): a failing example
# found once is tried first on every later run, on every machine. Seeds are fixed per test (@seed).
settings.register_profile("cbrules", database=DirectoryBasedExampleDatabase(Path(__file__).with_name("hypothesis-db")),
                          print_blob=True)
settings.load_profile("cbrules")


# The rule author's quick subset (`pytest -m quick`, docs/development.md): reading and checking rule files,
# the rule language, firing rules, the guide's examples, the pipelined loops interpreted on the CPU.
QUICK_FILES = {"test_rules_reader.py", "test_rule_language.py", "test_guide.py", "test_authoring.py",
               "test_engine.py", "test_cb_loops.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in QUICK_FILES:
            item.add_marker(pytest.mark.quick)
    if not os.environ.get("CBRULES_SLOW"):
        slow = pytest.mark.skip(reason="a long CPU-interpreter grid: CBRULES_SLOW=1 runs it")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(slow)
    from cbrules.codegen.runtime import gpu_available
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a compute-capability 9.x GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Keep NVRTC's on-disk cache out of the user's home during tests (shared across the session;
    session scope so that module-scoped compile fixtures see it too). The xdist workers of one run
    share one folder (their temporary folders' parent): a kernel one worker compiled is a cache hit
    for the other (entries are written whole and renamed into place, so concurrent use is safe)."""
    old = os.environ.get("CBRULES_CACHE_DIR")
    if old is None:
        base = tmp_path_factory.getbasetemp()
        if os.environ.get("PYTEST_XDIST_WORKER"):
            base = base.parent
        os.environ["CBRULES_CACHE_DIR"] = str(base / "nvrtc-cache")
    yield
    if old is None:
        os.environ.pop("CBRULES_CACHE_DIR", None)
