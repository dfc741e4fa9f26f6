"""Pure rank/GPU mapping rules: CUDA_VISIBLE_DEVICES, PID namespaces, device choice, sharing."""

from __future__ import annotations

from trainwatch.probes.read.gpus.gpu_map import (
    DeviceId, expected_device, parse_visible_devices, pick_device, proc_in_initial_pid_ns, sharing,
)

DEVICES = [
    DeviceId(0, "GPU-1111aaaa-0000-0000-0000-000000000000"),
    DeviceId(1, "GPU-2222bbbb-0000-0000-0000-000000000000"),
    DeviceId(2, "GPU-3333cccc-0000-0000-0000-000000000000"),
    DeviceId(3, "GPU-4444dddd-0000-0000-0000-000000000000"),
]


def test_unset_means_every_device():
    assert parse_visible_devices(None, DEVICES).indices == (0, 1, 2, 3)


def test_indices_with_spaces_and_order_kept():
    assert parse_visible_devices(" 2, 0 ", DEVICES).indices == (2, 0)


def test_empty_and_minus_one_hide_everything():
    assert parse_visible_devices("", DEVICES).indices == ()
    assert parse_visible_devices("-1", DEVICES).indices == ()


def test_reading_stops_at_first_invalid_entry_like_cuda():
    assert parse_visible_devices("1,7,2", DEVICES).indices == (1,)


def test_uuid_and_unique_prefix():
    assert parse_visible_devices("GPU-3333cccc-0000-0000-0000-000000000000", DEVICES).indices == (2,)
    assert parse_visible_devices("GPU-4444", DEVICES).indices == (3,)
    assert parse_visible_devices("2222bbbb", DEVICES).indices == (1,)


def test_ambiguous_prefix_resolves_nothing():
    result = parse_visible_devices("GPU-", DEVICES)
    assert result.indices == () and result.unresolved == ("GPU-",)


def test_mig_forms():
    old = parse_visible_devices("MIG-GPU-2222bbbb-0000-0000-0000-000000000000/1/0", DEVICES)
    assert old.indices == (1,)
    new = parse_visible_devices("MIG-5f2b9d1e-aaaa-bbbb-cccc-000000000000", DEVICES)
    assert new.indices == () and new.unresolved == ("MIG-5f2b9d1e-aaaa-bbbb-cccc-000000000000",)


def test_expected_device_follows_local_rank():
    assert expected_device((2, 3), 1) == 3
    assert expected_device((2,), 5) == 2  # one visible device: every local rank uses it
    assert expected_device((0, 1), None) is None
    assert expected_device((0, 1), 4) is None


def test_initial_namespace_detection():
    assert proc_in_initial_pid_ns("pid:[4026531836]")
    assert not proc_in_initial_pid_ns("pid:[4026532001]")


def test_pick_device_prefers_expected_then_most_memory():
    assert pick_device({}, 3) == 3
    assert pick_device({0: 500, 2: 9000}, 2) == 2
    assert pick_device({0: 500, 2: 9000}, 1) == 2
    assert pick_device({0: None, 1: None}, None) == 0


def test_sharing():
    shared = sharing({0: 0, 1: 0, 2: 1, 3: None})
    assert shared == {0: (1,), 1: (0,), 2: (), 3: ()}
