"""End to end: the real `trainwatch attach` in a real tmux terminal against a real straggler job."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.job, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]


def trainwatch_cmd() -> list[str]:
    script = Path(sys.executable).parent / "trainwatch"
    return [str(script)] if script.exists() else [sys.executable, "-m", "trainwatch.tui"]


class Tmux:
    """A private tmux server (its own socket), killed in teardown."""

    def __init__(self) -> None:
        self.socket = f"trainwatch-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], check=check,
                              capture_output=True, text=True, timeout=20)

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "tw", check=False).stdout

    def alive(self) -> bool:
        return self("has-session", "-t", "tw", check=False).returncode == 0

    def kill(self) -> None:
        self("kill-server", check=False)


@pytest.fixture
def tmux():
    server = Tmux()
    yield server
    server.kill()


def test_attach_shows_straggler_and_quits_without_touching_the_job(planted, tmux):
    job = planted("straggler", nproc=3, deadline=120)
    culprit = 2  # the planted straggler is the last rank
    command = " ".join(shlex.quote(part) for part in [*trainwatch_cmd(), "attach", str(job.pid)])
    env_prefix = "env -u COLUMNS -u LINES TERM=xterm-256color COLORTERM= "  # size from the pane
    tmux("new-session", "-d", "-s", "tw", "-x", "120", "-y", "40", env_prefix + command)

    screen = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        screen = tmux.screen()
        if "STRAGGLER" in screen and f"▶{culprit}" in screen and f"▶ rank {culprit}" in screen:
            break
        assert tmux.alive(), f"trainwatch exited early:\n{screen}"
        time.sleep(1.0)
    else:
        pytest.fail(f"no straggler verdict with culprit rank {culprit} within 60s; screen:\n{screen}")

    print(screen)
    assert f"torchrun pid {job.pid}" in screen
    assert "world 3" in screen
    # The 120-column layout: CPU% and the step (the planted loop counts `step`) fit; no GPU column
    # of n/a where no rank has a GPU reading (no NVIDIA driver here: the note says so).
    assert "CPU%" in screen and "step" in screen and "GPU%" not in screen
    assert "train.py" in screen  # the culprit's place in the user's code

    tmux("send-keys", "-t", "tw", "q")
    for _ in range(50):
        if not tmux.alive():
            break
        time.sleep(0.2)
    assert not tmux.alive(), f"q did not quit:\n{tmux.screen()}"
    time.sleep(0.5)  # deliberate: time for any harm done on quitting to show
    assert job.alive(), "quitting trainwatch must not affect the job"
    ranks = [p for p in psutil.Process(job.pid).children() if p.status() != psutil.STATUS_ZOMBIE]
    assert len(ranks) == 3
