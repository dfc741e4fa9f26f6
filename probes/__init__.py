"""trainwatch's probes: the public API, all that the views (``trainwatch.tui``) import.

Open a source (a local job, several nodes, a bundle), poll it for :class:`Snapshot` records,
write evidence bundles. Names load on first use, so importing the package stays cheap (the
in-process hook imports ``trainwatch.probes.hook`` inside the training job).
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> module (relative to this package) that defines it
_EXPORTS: dict[str, str] = {
    # errors and exit statuses
    **dict.fromkeys(("TrainwatchError", "UsageError", "OutputError", "NotAJob", "JobNotStarted", "BadBundle", "BadLeftovers",
                      "PARTIAL_EXIT"),
                    ".errors"),
    # the snapshot: the typed boundary and its vocabulary
    **dict.fromkeys(("Snapshot", "SnapshotError", "Job", "Rank", "Group", "Verdict", "Frame", "ThreadStack",
                     "ExitInfo", "RankGpu", "HostInfo", "GpuDevice", "CollectiveState", "Phase", "State",
                     "VerdictKind", "GroupPhase", "PHASES", "STATES", "VERDICTS", "WAITING_PHASES",
                     "HANG_VERDICTS", "PROBLEM_VERDICTS", "age_text", "compact_ranks", "who"), ".snapshot"),
    # sources
    "Source": ".source",
    **dict.fromkeys(("LocalSource", "open_source"), ".live"),
    "BundleSource": ".evidence.bundle_source",
    "PostMortemSource": ".evidence.postmortem",
    **dict.fromkeys(("open_nodes", "other_nodes", "detect_slurm", "slurm_job_here"), ".remote.nodes"),
    **dict.fromkeys(("Remote", "SshRemote"), ".remote.reach"),
    **dict.fromkeys(("Child", "run_relay"), ".remote.relay"),
    **dict.fromkeys(("NodeSpec", "DEFAULT_TIMEOUT_S", "RELAY_FROM"), ".remote.node_spec"),
    **dict.fromkeys(("find_job_matching", "find_only_job"), ".read.processes.discover"),
    "find_pyspy": ".read.stacks.pyspy",
    "check_out_dir": ".outdir",
    "kill_groups": ".process_group",
    "run_agent": ".remote.node_agent",
    # evidence
    **dict.fromkeys(("write_evidence", "write_bundle"), ".evidence.bundle"),
    **dict.fromkeys(("Watcher", "WatchEvent", "EXIT_CLEAN", "EXIT_PROBLEM", "EXIT_CRASH"), ".evidence.watcher"),
    # words the views share with bundles
    "step_label": ".judge.steps",
    "group_what": ".judge.groups",
    **dict.fromkeys(("NA", "na", "how_ended", "duration", "size", "pct", "log_activity", "kernel_words", "job_title"),
                    ".wording"),
    # `trainwatch run`: the armed run directory
    "rundir": ".rundir",
    "signal_name": ".rundir",
    "torch_env": ".torch_env",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    loaded = importlib.import_module(module, __name__)
    # Not cached here: each use reads the defining module, so the two never disagree.
    return loaded if name in ("rundir", "torch_env") else getattr(loaded, name)
