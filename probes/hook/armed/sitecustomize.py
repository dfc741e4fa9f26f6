"""Arms a rank of a job started by ``trainwatch run``; this directory is first on PYTHONPATH.

Does nothing unless ``TRAINWATCH_HOOK=1``; the hook itself skips processes that are not a
rank's main process. A process with ``RANK`` in its environment is armed at start. Any other is
armed when it joins a process group: ``torch.distributed.init_process_group`` returning is what
makes a process a rank, whatever started it (Lightning's and ``mp.spawn``'s ranks have no
``RANK`` at start; launchers never call it). Then hands over to any other ``sitecustomize``
further down sys.path, so a site's or a virtualenv's own customization still runs.
"""

import os
import sys

C10D = "torch.distributed.distributed_c10d"


def _arm() -> None:
    if os.environ.get("TRAINWATCH_HOOK") != "1":
        return  # not armed
    if os.environ.get("TRAINWATCH_ARMED_PID"):
        return  # a child of an armed rank: DataLoader worker, compile worker, subprocess
    if "RANK" not in os.environ:
        sys.meta_path.insert(0, _ArmOnInit())  # maybe a rank later: when it joins a process group
        return
    _load_hook()


def _load_hook():
    """The hook module (arming a process that has ``RANK`` as it loads)."""
    try:
        import trainwatch.probes.hook  # noqa: F401  (arms on import)
    except ImportError:  # an interpreter without trainwatch installed: load the file itself
        import importlib.util
        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location("_trainwatch_hook", os.path.join(here, "..", "__init__.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["_trainwatch_hook"] = module
        spec.loader.exec_module(module)
        return module
    return sys.modules["trainwatch.probes.hook"]


class _ArmOnInit:
    """Finds nothing itself: when ``torch.distributed`` loads its c10d module, wraps that module's
    ``init_process_group`` (before ``torch.distributed`` re-exports it) so the process is armed
    right after it has joined, with the rank its group gives it."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201 (importlib's protocol)
        if name != C10D:
            return None
        sys.meta_path.remove(self)  # once; the lookup below must not find this finder again
        import importlib.util
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:  # noqa: ANN001
            run(module)
            _wrap_init(module)

        spec.loader.exec_module = exec_module
        return spec


def _wrap_init(c10d) -> None:  # noqa: ANN001
    import functools
    join = c10d.init_process_group

    @functools.wraps(join)
    def init_process_group(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        result = join(*args, **kwargs)
        try:
            if not os.environ.get("TRAINWATCH_ARMED_PID"):
                _load_hook().install(rank=c10d.get_rank())
        except Exception as exc:  # noqa: BLE001 - never break the user's program
            sys.stderr.write(f"trainwatch: hook not installed: {type(exc).__name__}: {exc}\n")
        return result

    c10d.init_process_group = init_process_group


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
except Exception as _exc:  # noqa: BLE001 - never break the user's program
    sys.stderr.write(f"trainwatch: hook not installed: {type(_exc).__name__}: {_exc}\n")
_chain()
