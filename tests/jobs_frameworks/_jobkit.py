"""Shared bits of the framework jobs: a hard deadline, offline settings, rank-tagged log lines.

Each job copies this file beside itself (see ``tests/real_jobs.py``), so a job script needs
nothing from trainwatch or the test suite to run under ``torchrun``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import warnings

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "WANDB_DISABLED": "true", "TOKENIZERS_PARALLELISM": "false", "DISABLE_TQDM": "1"}


def start(description: str, flags: tuple[str, ...] = ()) -> argparse.Namespace:
    """Parse ``--deadline`` (and the job's on/off ``flags``), arm the deadline, and make the
    process quiet and offline."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--deadline", type=float, default=60.0, help="exit after this many seconds")
    for flag in flags:
        parser.add_argument(flag, action="store_true")
    args = parser.parse_args()
    args.stop_at = time.time() + args.deadline
    arm_deadline(args.deadline)
    for name, value in OFFLINE.items():
        os.environ.setdefault(name, value)
    warnings.filterwarnings("ignore")
    return args


def arm_deadline(seconds: float) -> None:
    """Hard stop: a rank blocked in C code (a collective, a join) still dies at the deadline."""
    def _expire() -> None:
        time.sleep(seconds)
        os._exit(124)
    threading.Thread(target=_expire, name="deadline", daemon=True).start()


def free_port_env() -> str:
    """The port the test chose for this job (MASTER_PORT), for jobs that pass it themselves."""
    return os.environ.get("MASTER_PORT", "29500")


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def log(message: str, who: int | None = None) -> None:
    """One line per event, tagged with the rank (``who``, else RANK): the tests wait for these markers.
    One write call per line: ranks share the log file, and print()'s separate newline write lets
    their lines interleave."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), f"[rank {rank() if who is None else who}] {message}\n".encode())


def accelerate_setup():  # noqa: ANN201 (accelerate is imported here, not at the top)
    """A tiny regression model on CPU prepared by accelerate (no GPU: without ``cpu=True`` each
    rank would train alone): ``(accelerator, model, optimizer, loader)``, after one log line."""
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4_000, 16), torch.randn(4_000, 1))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=4))
    log(f"accelerate starts: {accelerator.distributed_type} backend {accelerator.state.backend} "
        f"world {accelerator.num_processes}")
    return accelerator, model, optimizer, loader


class StallingItems:
    """A map-style dataset of random regression pairs; on the stalled rank the read of item
    ``stuck_index`` never returns, as on a dead network mount. Forked DataLoader workers have no
    deadline thread: the blocked worker keeps the job's deadline itself (``stop_at``)."""

    def __init__(self, size: int, stall: bool, stop_at: float, stuck_index: int, who: int | None = None) -> None:
        self.size, self.stall, self.stop_at, self.stuck_index, self.who = size, stall, stop_at, stuck_index, who

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):  # noqa: ANN204 (torch is imported in the worker)
        import torch
        if self.stall and index == self.stuck_index:
            log(f"planted: worker pid {os.getpid()} blocks in __getitem__({index})", self.who)
            time.sleep(max(0.0, self.stop_at - time.time()))
            os._exit(124)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(16, generator=generator), torch.randn(1, generator=generator)
