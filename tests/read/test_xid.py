"""Xid errors from the kernel log and from NVML events."""

from __future__ import annotations

import os
import stat

from fake_nvml import FakeGpu, FakeNvml
from trainwatch.probes.read.gpus.gpu import GpuProbe
from trainwatch.probes.read.processes.process import RankProcess
from trainwatch.probes.read.gpus.xid import (
    KmsgReader, NvmlXidListener, describe, normalize_bus, parse_dmesg_line, parse_kmsg_record, parse_xid_message,
)

XID79 = ("NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, "
         "GPU has fallen off the bus.")


def test_parse_modern_message():
    e = parse_xid_message(XID79, at=5.0)
    assert (e.code, e.bus, e.pid, e.process, e.at) == (79, "0000:3b:00", 4242, "python", 5.0)
    assert e.text == "GPU has fallen off the bus"


def test_parse_old_message_and_non_xid():
    e = parse_xid_message("NVRM: Xid (0000:07:00): 13, Graphics SM Warp Exception on (GPC 0)")
    assert e.code == 13 and e.pid is None and e.bus == "0000:07:00"
    assert parse_xid_message("usb 1-1: new device") is None


def test_kmsg_record_and_dmesg_line_times():
    e = parse_kmsg_record("4,1234,2500000,-;" + XID79, boot_time=1000.0)
    assert e.at == 1002.5
    e = parse_dmesg_line("[  2.500000] " + XID79, boot_time=1000.0)
    assert e.at == 1002.5 and e.code == 79


def test_normalize_bus():
    assert normalize_bus("00000000:3B:00.0") == normalize_bus("0000:3b:00") == "0000:3b:00"


def test_describe():
    import time
    e = parse_xid_message(XID79, at=1000.0)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1000.0))
    assert describe(e) == (
        f"Xid 79 on GPU (0000:3b:00) at {stamp}: GPU has fallen off the bus (pid 4242 python)"
    )
    assert describe(parse_xid_message("NVRM: Xid (PCI:0000:01:00): 999, odd thing")).endswith(
        "odd thing")


def test_kmsg_reader_reads_only_new_records(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text("6,1,100,-;hello\n SUBSYSTEM=pci\n4,2,200,-;" + XID79 + "\n")
    reader = KmsgReader(str(log))
    assert [e.code for e in reader.read()] == [79]
    assert reader.read() == []
    with log.open("a") as fh:
        fh.write("4,3,300,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\n")
    assert [e.code for e in reader.read()] == [48]
    reader.close()


def test_kmsg_reader_bounded(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text(("4,2,200,-;" + XID79 + "\n") * 5000)
    reader = KmsgReader(str(log), max_records=2)  # two 8 KiB reads at most
    assert 0 < len(reader.read()) < 5000
    reader.close()


def test_kmsg_unreadable_says_why(tmp_path):
    reader = KmsgReader(str(tmp_path / "missing"))
    assert reader.read() == []
    assert reader.error.startswith("kernel log unreadable: ")


def test_real_kernel_log_never_raises():
    reader = KmsgReader()
    events = reader.read()
    assert isinstance(events, list)
    if reader.error is None and os.path.exists("/dev/kmsg"):
        assert reader.live == stat.S_ISCHR(os.stat("/dev/kmsg").st_mode)
    reader.close()


def test_nvml_listener_drains_events():
    fake = FakeNvml([FakeGpu(), FakeGpu()])
    fake.nvmlInit()
    listener = NvmlXidListener(fake, [(0, fake.nvmlDeviceGetHandleByIndex(0)),
                                      (1, fake.nvmlDeviceGetHandleByIndex(1))])
    listener.start()
    assert listener.error is None and listener.poll() == []
    fake.xid(1, 79)
    fake.xid(0, 31)
    events = listener.poll()
    assert [(e.gpu_index, e.code, e.source) for e in events] == [(1, 79, "nvml"), (0, 31, "nvml")]
    listener.close()


def test_nvml_listener_unsupported():
    fake = FakeNvml([FakeGpu(supported_events=0)])
    fake.nvmlInit()
    listener = NvmlXidListener(fake, [(0, fake.nvmlDeviceGetHandleByIndex(0))])
    listener.start()
    assert "NVML Xid events unavailable" in listener.error
    assert listener.poll() == []


def test_probe_reports_xids_from_kernel_and_nvml(tmp_path):
    import time
    log = tmp_path / "kmsg"
    log.write_text("4,2,200,-;NVRM: Xid (PCI:0000:11:00): 79, pid=11, name=python, "
                   "GPU has fallen off the bus.\n")
    fake = FakeNvml([FakeGpu(bus_id="00000000:10:00.0"), FakeGpu(bus_id="00000000:11:00.0")])
    probe = GpuProbe(fake, kmsg_path=str(log), in_initial_pid_ns=True)
    ranks = [RankProcess(pid=10, rank=0, env={"RANK": "0"}, create_time=time.time() - 10)]
    first = probe.read(ranks, "torchrun")
    assert first.host.xid_events[0].startswith("Xid 79 on GPU 1 (0000:11:00)")
    fake.xid(0, 48)
    second = probe.read(ranks, "torchrun")
    assert any(x.startswith("Xid 48 on GPU 0 (0000:10:00)") for x in second.host.xid_events)
    assert any("Xid 48" in w and "double-bit ECC" in w for w in second.warnings)
    # the boot-relative kernel Xid is older than the job: listed, not warned about
    assert not any("Xid 79" in w for w in second.warnings)
    probe.close()
