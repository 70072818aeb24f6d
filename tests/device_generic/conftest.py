"""pytest glue for the device-generic modules.

* ``pytest tests/`` does not collect these modules in-process: one segfault in
  the backend would end the whole session. tests/test_device_generic.py runs
  each of them in a child pytest instead (and bisects around crashes). Naming
  a module or this directory explicitly on the command line runs it here.
* In such a child, TORCH_NEURONX_DG_PROGRESS names a file that gets one line
  per test start / finish, flushed immediately, so the parent knows which
  test was running when the child died.
"""
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHILD_ENV = "TORCH_NEURONX_DG_CHILD"
PROGRESS_ENV = "TORCH_NEURONX_DG_PROGRESS"


def _named_explicitly(config):
    root = Path(config.invocation_params.dir)
    for arg in config.args:
        p = (root / arg.split("::")[0]).resolve()
        if p == HERE or HERE in p.parents:
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    if os.environ.get(CHILD_ENV) == "1" or _named_explicitly(config):
        return None
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return True
    return None


def _progress(line):
    path = os.environ.get(PROGRESS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
            f.flush()


def pytest_runtest_logstart(nodeid, location):
    _progress("start " + nodeid)


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        _progress("%s %s %s" % (report.when, report.outcome, report.nodeid))
