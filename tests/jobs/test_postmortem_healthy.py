"""`trainwatch open --summary` on what a job that ran normally left says what it is: never "dead job",
"no rank could be sampled" and "Everything was collected." together, never a crash."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from real_jobs import TORCHRUN, free_port

TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]
FINE = textwrap.dedent("""
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    for step in range(30):
        t = torch.ones(4)
        dist.all_reduce(t)
        if step % 10 == 0:
            print(f"step {step}", flush=True)
    dist.destroy_process_group()
""")


def summary(*paths) -> str:
    proc = subprocess.run([*TRAINWATCH, "open", *map(str, paths), "--summary"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


def never_the_old_words(text: str) -> None:
    assert "dead job" not in text and "no rank could be sampled" not in text, text
    assert "Everything was collected." not in text and "## Crash" not in text, text


def test_a_plain_log_with_no_rank_lines_says_none_is_named(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("using torch.distributed with gloo\nstep 20 loss 0.30\nstep 40 loss 0.21\ndone\n")
    text = summary(log)
    never_the_old_words(text)
    assert "**unknown**: no rank of the job was found in what was read" in text
    assert "- ranks: none named in these files" in text


def test_a_log_with_rank_lines_and_no_error_says_nothing_failed(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(f"[rank{r}]:step {s} loss 0.3\n" for s in (20, 40) for r in (0, 1)))
    text = summary(log)
    never_the_old_words(text)
    assert "**unknown**: nothing in these files says the job failed" in text
    assert "- how ranks 0-1 ended: not in these files" in text


@pytest.mark.job
def test_a_run_directory_of_a_job_that_exited_0_is_a_finished_job(tmp_path):
    script = tmp_path / "fine.py"
    script.write_text(FINE)
    run = tmp_path / "run"
    proc = subprocess.run([*TRAINWATCH, "run", "--out", str(run), "--", *TORCHRUN, "--nproc-per-node", "2",
                           "--master-port", str(free_port()), str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = summary(run)
    never_the_old_words(text)
    assert "**healthy**: job finished: all 2 ranks exited normally" in text
