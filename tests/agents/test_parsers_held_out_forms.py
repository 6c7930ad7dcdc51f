"""Forms that the logs held out on 2026-11-30 showed the parsers did not read (tests/fixtures/logs, `# held_out:`):
NCCL 2.19's wording of IB async events, a C++ library's CHECK of a CUDA call, a logger's key-value table with a NaN
loss and its loss scale kept as a log2. Lines are quoted from the fixture named beside them, or are a real line's
variant the rules must read the same way (said so)."""

from __future__ import annotations

from tests.agents.test_parsers_real_world import corpus, of, one, parse


def test_nccl_async_error_events_name_the_port_and_its_event() -> None:
    # ib_port_flap_llm_d_191.txt: "... transport/net_ib.cc:199 NCCL WARN NET/IB : mlx5_32:1 Got async error event:
    # port error", then "... port active" 8 s later, then "port error" again
    events = of(parse(corpus("ib_port_flap_llm_d_191.txt")), "ib_async_event")
    assert [(e.fields["event_name"], e.fields["fatal"], e.critical) for e in events] == [
        ("IBV_EVENT_PORT_ERR", True, True),
        ("IBV_EVENT_PORT_ACTIVE", False, False),
        ("IBV_EVENT_PORT_ERR", True, True),
    ]
    assert {(e.fields["ib_device"], e.fields["port"]) for e in events} == {("mlx5_32", 1)}


def test_nccl_async_fatal_events_on_a_queue_pair_or_the_device() -> None:
    # NCCL 2.19's other two wordings (transport/net_ib.cc), on a line as NCCL prints it
    qp = one("n1:7:9 [0] transport/net_ib.cc:112 NCCL WARN NET/IB : mlx5_0:1 async fatal event on QP (0x55d0c8a0): "
             "local work queue catastrophic error")  # fmt: skip
    assert (qp.kind, qp.fields["event_name"], qp.fields["ib_device"], qp.critical) == (
        "ib_async_event", "IBV_EVENT_QP_FATAL", "mlx5_0", True,
    )  # fmt: skip
    device = one("n1:7:9 [0] NCCL WARN NET/IB : mlx5_2:1 async fatal event: local catastrophic error")
    assert (device.fields["event_name"], device.fields["port"]) == ("IBV_EVENT_DEVICE_FATAL", 1)


def test_a_cuda_check_of_a_cpp_library_is_a_cuda_error() -> None:
    # illegal_memory_access_oob_k2_859.txt: "[F] /ceph-dan/k2/k2/csrc/array.h:385:T k2::Array1<T>::operator[](int32_t)
    # const [with T = int; int32_t = int] Check failed: ret == cudaSuccess (700 vs. 0)  Error: an illegal memory
    # access was encountered."
    [event] = of(parse(corpus("illegal_memory_access_oob_k2_859.txt")), "cuda_error")
    assert (event.fields["error"], event.fields["cuda_code"], event.critical) == ("illegal_memory_access", 700, True)
    # The same CHECK without the words: the number says them.
    bare = one("F1130 12:00:01.5 kernel.cu:88] Check failed: err == cudaSuccess (719 vs. 0)")
    assert (bare.kind, bare.fields["error"]) == ("cuda_error", "launch_failure")


def test_a_loggers_table_row_with_a_nan_loss() -> None:
    # loss_nan_guided_diffusion_50.txt: "| loss          | nan       |", "| loss_q0       | nan       |", ...;
    # "| mse | nan |" and "| vb | nan |" are no loss
    events = parse(corpus("loss_nan_guided_diffusion_50.txt"))
    assert len(of(events, "nan_loss")) == 5
    assert one("| grad_norm | inf |").kind == "grad_norm_nan"
    # a row with more cells is several fields on one line: a NaN there may be a neighbour's
    assert of(parse("| loss | 2.31 | grad_norm | nan |"), "nan_loss") == []


def test_a_loss_scale_kept_as_its_log2() -> None:
    # loss_nan_guided_diffusion_50.txt: "Found NaN, decreased lg_loss_scale to -16199.354": the scale is 2^-16199,
    # far under 1: every step overflows
    [first, *_] = of(parse(corpus("loss_nan_guided_diffusion_50.txt")), "loss_scale_overflow")
    assert first.fields["at_minimum"] and first.severity == "error"
    # Early in a run (the scale calibrating, a variant): 2^17.354 is no floor.
    early = one("Found NaN, decreased lg_loss_scale to 17.354")
    assert not early.fields["at_minimum"] and early.severity == "warning"
    assert round(early.fields["reduced_to"]) == round(2**17.354)


def test_the_heartbeat_monitors_first_line_is_the_monitors_too() -> None:
    # heartbeat_monitor_no_heartbeat_tp8_sglang_1691.txt: "[rank7]:[E1019 01:04:03.357615073 ProcessGroupNCCL.cpp:1375]
    # [PG 3 Rank 7] First PG on this rank that detected no heartbeat of its watchdog.", then "Heartbeat monitor timed
    # out!": read as the monitor's, not left to the classifier as an unknown error
    events = parse(corpus("heartbeat_monitor_no_heartbeat_tp8_sglang_1691.txt"))
    assert of(events, "unmatched_error") == []
    stuck = of(events, "watchdog_stuck")
    assert len(stuck) == 6 and {e.fields["category"] for e in stuck} == {"heartbeat_monitor"}
    assert sorted({e.rank for e in stuck}) == [0, 1, 6, 7]


def test_nvml_saying_a_gpu_is_lost_is_the_gpus_hardware() -> None:
    # gpu_is_lost_nvidia_smi_owod_81.txt: "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost.
    # Reboot the system to recover this GPU"
    lost = one(corpus("gpu_is_lost_nvidia_smi_owod_81.txt"))
    assert (lost.kind, lost.fields["error"], lost.fields["pci"], lost.critical) == (
        "cuda_error", "gpu_lost", "0000:02:00.0", True,
    )  # fmt: skip
    # xid79_gpu_is_lost_remapped_rows_gpud_604.txt: "failed to get device remapped rows: ERROR_GPU_IS_LOST"
    [gpud] = of(parse(corpus("xid79_gpu_is_lost_remapped_rows_gpud_604.txt")), "cuda_error")
    assert gpud.fields["error"] == "gpu_lost"
    # "lost" in other words is nothing of the kind
    assert of(parse("INFO lost 3 batches to a slow reader, retrying\n"), "cuda_error") == []
