"""A bundle's log-tail.txt reads like the live view; the raw tail is kept beside it, both bounded."""

from __future__ import annotations

import os

from trainwatch.probes.evidence.bundle import _Writer
from trainwatch.probes.evidence.bundle_rank import LOG_TAIL_BYTES, RankEvidence, RankPlan, _settings_and_logs
from trainwatch.probes.redact import Redactor

NOISY = """\
/venv/lib/python3.11/site-packages/torch/_subclasses/functional_tensor.py:276: UserWarning: Failed to initialize NumPy: No module named 'numpy' (Triggered internally at /pytorch/torch/csrc/utils/tensor_numpy.cpp:81.)
  cpu = _conversion_method_template(device=torch.device("cpu"))
W1123 13:23:16.159000 21730 torch/distributed/run.py:874] *****************************************
W1123 13:23:16.159000 21730 torch/distributed/run.py:874] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default
W1123 13:23:16.159000 21730 torch/distributed/run.py:874] *****************************************
step 10 loss 0.4321 token=hf_abcdefghijklmnopqrstuvwxyz0123
step 20 loss 0.4100
"""


def test_log_tail_is_filtered_and_the_raw_log_kept(tmp_path):
    log = tmp_path / "rank0.log"
    log.write_text("old line\n" * (LOG_TAIL_BYTES // 9 + 10) + NOISY)
    ev = RankEvidence(rank=0, pid=os.getpid(), env={})
    _settings_and_logs(RankPlan(pid=os.getpid(), rank=0, host="node1", log_path=str(log)), ev)
    tail = ev.files["log-tail.txt"]
    assert "UserWarning" not in tail and "_conversion_method_template" not in tail
    assert "OMP_NUM_THREADS" not in tail and "*****" not in tail
    assert tail.rstrip().endswith("step 20 loss 0.4100") and "step 10 loss" in tail
    raw = ev.files["log-raw.txt"]
    assert len(raw) <= LOG_TAIL_BYTES and b"Failed to initialize NumPy" in raw and b"OMP_NUM_THREADS" in raw
    writer = _Writer(tmp_path / "bundle", Redactor.from_envs([{"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123"}]))
    for name in ("log-tail.txt", "log-raw.txt"):
        writer.write(f"ranks/0/{name}", ev.files[name])
        assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in (tmp_path / "bundle" / "ranks" / "0" / name).read_text()
