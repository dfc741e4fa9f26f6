"""torchrun's own record of its ranks' deaths, read from a real torchrun log (torch 2.13, gloo on CPU:
rank 2 SIGKILLed from outside, ranks 0-1 torn down with SIGTERM)."""

from pathlib import Path

from trainwatch.probes.read.processes import cgroup_oom
from trainwatch.probes.read.logs import launcher_log

LOG = Path(__file__).parents[1] / "fixtures" / "logs" / "torchrun-rank2-sigkill.log"


def test_the_first_failure_and_the_summary_are_read():
    found = launcher_log.failures(LOG.read_text())
    assert set(found) == {11588, 11589, 11590}
    two = found[11590]
    assert (two.rank, two.local_rank, two.code, two.signal, two.root_cause) == (2, 2, None, "SIGKILL", True)
    assert two.at is not None
    assert [(found[p].rank, found[p].signal, found[p].root_cause) for p in (11588, 11589)] == [
        (0, "SIGTERM", False), (1, "SIGTERM", False)]


def test_the_agents_line_alone_is_enough_while_the_summary_is_not_written_yet():
    text = LOG.read_text()
    head = text[: text.index("Traceback")]  # the launcher is still tearing down: no summary yet
    found = launcher_log.failures(head)
    assert set(found) == {11590} and found[11590].signal == "SIGKILL" and found[11590].local_rank == 2


def test_an_exit_code_is_not_a_signal():
    found = launcher_log.failures("E1125 x api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 42) of binary: py")
    assert (found[42].code, found[42].signal) == (1, None)


def test_cgroup_v1_and_v2_counts(tmp_path):
    v1 = tmp_path / "memory" / "job"
    v1.mkdir(parents=True)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    (v1 / "memory.max_usage_in_bytes").write_text(str(268435456))
    (v1 / "memory.limit_in_bytes").write_text(str(268435456))
    group = cgroup_oom.MemoryCgroup(str(v1), 1)
    assert group.oom_kills() == 3 and group.peak_and_limit() == (268435456, 268435456)
    assert cgroup_oom.describe(2, 3, group) == ("its memory cgroup counted an OOM kill (memory.oom_control "
                                                "oom_kill 2 -> 3; peak 256 MiB of a 256 MiB limit)")
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    (v2 / "memory.max").write_text("max\n")
    assert cgroup_oom.MemoryCgroup(str(v2), 2).oom_kills() == 1
    assert cgroup_oom.MemoryCgroup(str(v2), 2).peak_and_limit() == (None, None)
