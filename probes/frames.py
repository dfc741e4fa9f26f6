"""Facts about frames that both reading and judging need: whose code a frame is, and which
locals of which frames the step reader may read (see ``judge/steps.py``)."""

from __future__ import annotations

import re

from .snapshot import Frame

SITE_DIRS = ("/site-packages/", "/dist-packages/")
STDLIB_RE = re.compile(r"/lib/python3\.\d+/(?!site-packages|dist-packages)|^<frozen |^<string>")
# Step-like locals, best first (judge/steps.py explains the order), and the HF Trainer's loop.
LOOP_NAMES = ("global_step", "step", "iteration", "iter_num", "iter", "it", "batch_idx", "epoch", "i")
HF_NAMES = ("epoch", "update_step", "num_update_steps_per_epoch", "total_batched_samples", "step",
            "steps_in_epoch")
HF_FILE = "transformers/trainer.py"
# A rank's global number and its world's size, as locals say them (read/processes/rendezvous.py):
# the user's own names, and torch's while it sets up (``_env_rendezvous_handler`` reads RANK into
# ``rank``). Not ``group_rank``/``local_rank``: numbers within a subgroup or a node.
RANK_NAMES = ("global_rank", "world_rank", "rank")
WORLD_NAMES = ("world_size",)
HF_LOOPS = frozenset({"_inner_training_loop", "_run_epoch"})


def bare_name(function: str) -> str:
    """``Module._call_impl`` -> ``_call_impl`` (py-spy qualifies methods by class on Python 3.11+)."""
    return function.rsplit(".", 1)[-1]


def is_stdlib(frame: Frame) -> bool:
    return bool(STDLIB_RE.search(frame.file))


def is_user(frame: Frame) -> bool:
    """The user's own code: not the standard library, not an installed package, not native."""
    return not frame.native and not is_stdlib(frame) and not any(d in frame.file for d in SITE_DIRS)


def is_hf_loop(frame: Frame) -> bool:
    return bare_name(frame.function) in HF_LOOPS and frame.file.replace("\\", "/").endswith(HF_FILE)


def wanted_names(frame: Frame) -> frozenset[str]:
    """The local names worth reading in ``frame``; empty outside user code and the HF loop."""
    if is_hf_loop(frame):
        return frozenset(HF_NAMES)
    if is_user(frame):
        return frozenset(LOOP_NAMES)
    return frozenset()


def rank_names(frame: Frame) -> frozenset[str]:
    """The local names that may say a rank's global number and world size in ``frame``: the user's
    own frames and torch.distributed's; empty elsewhere."""
    if is_user(frame) or (not frame.native and "torch/distributed/" in frame.file.replace("\\", "/")):
        return frozenset(RANK_NAMES + WORLD_NAMES)
    return frozenset()
