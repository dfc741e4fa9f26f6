"""Arms a rank of a job started by ``trainwatch run``; this directory is first on PYTHONPATH.

Does nothing unless ``TRAINWATCH_HOOK=1``; the hook itself skips processes that are not a
rank's main process. Then hands over to any other ``sitecustomize`` further down sys.path,
so a site's or a virtualenv's own customization still runs.
"""

import os
import sys


def _arm() -> None:
    if os.environ.get("TRAINWATCH_HOOK") != "1" or "RANK" not in os.environ:
        return  # not armed, or not a rank (a launcher)
    if os.environ.get("TRAINWATCH_ARMED_PID"):
        return  # a child of an armed rank: DataLoader worker, compile worker, subprocess
    try:
        import trainwatch.probes.hook  # noqa: F401  (arms on import)
    except ImportError:  # an interpreter without trainwatch installed: load the file itself
        import importlib.util
        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location("_trainwatch_hook", os.path.join(here, "..", "__init__.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["_trainwatch_hook"] = module
        spec.loader.exec_module(module)


def _chain() -> None:
    """Import the next ``sitecustomize`` on sys.path, as if this one were not there."""
    here = os.path.dirname(os.path.abspath(__file__))
    this = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import sitecustomize  # noqa: F401
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        if this is not None:
            sys.modules["sitecustomize"] = this
    finally:
        sys.path[:] = saved


try:
    _arm()
except Exception as _exc:  # never break the user's program
    sys.stderr.write(f"trainwatch: hook not installed: {type(_exc).__name__}: {_exc}\n")
_chain()
