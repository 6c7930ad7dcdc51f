"""Training log forms from more of the real world: NCCL verbs and IB async errors, THC-era CUDA errors, kernel
assertions, the stuck watchdog and the flight recorder, fp16 loss scaling, launchers, Megatron/DeepSpeed/HF/
Lightning/mmengine progress lines, and the launcher prefixes they come under.

Fixture lines are real (tests/fixtures/logs, each file cites its thread). Lines written here are either quoted
from a cited source or are a real line's variant (another host, another number) that the rules must read the
same way: the parser is judged on logs it has not seen.
"""

from __future__ import annotations

from datetime import UTC, datetime

from agents.events import Event
from agents.parsers import parse_text
from agents.parsers.training import TrainingLogParser
from agents.parsers.training.verbs import call_category, errno_name
from tests import paths
from tests.agents.test_parsers_training import check_event

LOGS = paths.FIXTURES / "logs"
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def corpus(name: str) -> str:
    return (LOGS / name).read_text().split("\n---\n", 1)[1]


def parse(text: str) -> list[Event]:
    events = parse_text(TrainingLogParser(path="/logs/train.log"), text, now=NOW)
    for event in events:
        check_event(event)
    return events


def one(text: str) -> Event:
    events = parse(text)
    assert len(events) == 1, [(e.kind, e.fields) for e in events]
    return events[0]


def of(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e.kind == kind]


# -- RDMA verbs and IB async events ----------------------------------------------------------------------------


def test_reg_mr_enomem_is_a_memlock_problem_of_the_node() -> None:
    event = one(corpus("nccl_ibv_reg_mr_enomem_nccltests_206.txt"))
    assert event.kind == "ib_verbs_error" and event.critical and event.severity == "error"
    assert event.fields == {
        "call": "ibv_reg_mr_iova2",
        "errno": "ENOMEM",
        "error": "Cannot allocate memory",
        "category": "memory_registration",
        "hint": "memlock",
    }


def test_ucx_registration_and_cq_failures_read_the_same_way() -> None:
    # UCX's wording (openucx/ucx PR #7930's "before" line; openucx/ucx #8229's title)
    reg = one(
        "[1644567389.121214] [hostname:183563:0]           ib_md.c:340  UCX  ERROR ibv_reg_mr(address=0x7f1bae800000,"
        " length=39845888, access=0xf) failed: Cannot allocate memory"
    )
    assert (reg.kind, reg.fields["call"], reg.fields["errno"], reg.fields["hint"]) == (
        "ib_verbs_error",
        "ibv_reg_mr",
        "ENOMEM",
        "memlock",
    )
    cq = one("ibv_create_cq(cqe=4096) failed: Cannot allocate memory")
    assert (cq.fields["call"], cq.fields["category"], cq.fields["errno"]) == ("ibv_create_cq", "resource", "ENOMEM")
    assert "hint" not in cq.fields


def test_create_qp_failures_keep_their_nccl_prefix() -> None:
    events = parse(corpus("nccl_ibv_create_qp_tf_nccl_562.txt"))
    assert [e.kind for e in events] == ["ib_verbs_error"] * 3
    assert [e.fields["device"] for e in events] == [4, 5, 6]
    assert events[0].fields["host"] == "hai-a100-3" and events[0].fields["src"] == "ibvwrap.c:130"
    assert {e.fields["call"] for e in events} == {"ibv_create_qp"} and events[0].fields["errno"] is None


def test_ofi_plugin_registration_failure_behind_pdsh_prefixes() -> None:
    events = parse(corpus("nccl_ofi_register_memory_enomem_nccl_563.txt"))
    verbs = of(events, "ib_verbs_error")
    assert len(verbs) == 1
    assert verbs[0].fields["call"] == "fi_mr_reg" and verbs[0].fields["errno"] == "ENOMEM"
    assert verbs[0].fields["host"] == "ip-10-0-87-143"
    # "10.0.87.143: 10.0.87.143: Traceback ..." is a traceback once both host prefixes are peeled
    [tb] = of(events, "traceback")
    assert tb.fields["n_frames"] == 3 and not tb.fields["complete"]


def test_async_events_port_error_catastrophic_and_benign() -> None:
    events = parse(corpus("nccl_ib_async_port_error_litllama_380.txt"))
    ports = of(events, "ib_async_event")
    assert len(ports) == 8 and all(e.critical for e in ports)
    assert ports[0].fields["event"] == "port error" and ports[0].fields["event_name"] == "IBV_EVENT_PORT_ERR"
    assert ports[0].fields["fatal"] is True and ports[0].fields["host"] == "...-48"
    # Open MPI's --tag-output names the rank; mpirun's stamp gives the time
    events = parse(corpus("nccl_ib_async_catastrophic_mpirun_nccl_230.txt"))
    fatal = of(events, "ib_async_event")
    assert [e.rank for e in fatal] == [12, 14, 13]
    assert fatal[0].fields["event_name"] == "IBV_EVENT_DEVICE_FATAL"
    assert fatal[0].ts == datetime(2019, 6, 2, 16, 13, 44, 884000, tzinfo=UTC)
    assert [e.fields["call"] for e in of(events, "ib_verbs_error")] == ["ibv_get_async_event"] * 3
    # a device-qualified event, and a state change that is not a fault
    qp = one("node201:127799:127863 [0] transport/net_ib.cc:101 NCCL WARN NET/IB : mlx5_0:1 Got async event : CQ error")
    assert (qp.fields["ib_device"], qp.fields["port"], qp.fields["event_name"]) == ("mlx5_0", 1, "IBV_EVENT_CQ_ERR")
    gid = one(
        "gpu3:4242:4300 [2] transport/net_ib.cc:101 NCCL WARN NET/IB : mlx5_2:1 Got async event : GID table change"
    )
    assert gid.kind == "ib_async_event" and gid.severity == "warning" and not gid.critical
    assert gid.fields["fatal"] is False


def test_errno_and_call_readings() -> None:
    assert errno_name("Cannot allocate memory") == "ENOMEM"
    assert errno_name("12") == "ENOMEM"
    assert errno_name("110 Connection timed out") == "ETIMEDOUT"
    assert errno_name("Invalid argument") == "EINVAL"
    assert errno_name("something else") is None
    assert call_category("ibv_reg_mr_iova2") == "memory_registration"
    assert call_category("ibv_alloc_pd") == "resource"
    assert call_category("ibv_modify_qp") == "connection"
    assert call_category("ibv_get_async_event") == "call"


# -- CUDA errors of PyTorch 0.x-1.x, kernel assertions ------------------------------------------------------------


def test_thc_out_of_memory_is_oom() -> None:
    for name in (
        "cuda_runtime_error_2_oom_thc_detnet_10.txt",
        "cuda_runtime_error_2_oom_thc_neuralmotifs_58.txt",
        "cuda_runtime_error_2_oom_thc_alphapose_154.txt",
    ):
        event = one(corpus(name))
        assert event.kind == "oom" and event.critical, name
    check = one("THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=383 error=2 : out of memory")
    assert check.kind == "oom"


def test_thc_runtime_errors_carry_code_and_source() -> None:
    check, lua = parse(corpus("thcudacheck_device_assert_cutorch_705.txt"))
    assert check.kind == "cuda_error" and check.fields["error"] == "device_assert"
    assert check.fields["cuda_code"] == 59 and check.fields["src"] == "/home/torch/cutorch/lib/THC/THCTensorCopy.cu:100"
    assert lua.fields["cuda_code"] == 59 and lua.fields["src"] == "/home/torch/cutorch/lib/THC/THCTensorCopy.cu:100"
    other = one("RuntimeError: cuda runtime error (77) : an illegal memory access was encountered at /pytorch/x.cu:9")
    assert other.fields["error"] == "illegal_memory_access" and other.fields["cuda_code"] == 77


def test_kernel_assertion_lines_are_one_error() -> None:
    event = one(corpus("cuda_kernel_assertions_thc_index_flowtron_52.txt"))
    assert event.kind == "cuda_error" and event.critical
    assert event.fields["error"] == "device_assert" and event.fields["threads"] == 8
    assert event.fields["assertion"] == "srcIndex < srcSelectDimSize"
    assert event.fields["src"] == "C:/cb/pytorch_1000000000000/work/aten/src/THC/THCTensorIndex.cu:218"
    # PyTorch 2.x prints the kernel name between the source and the block; the error line after it is its own
    events = parse(
        "/opt/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [3,0,0], thread: [64,0,0] "
        'Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.\n'
        "/opt/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [3,0,0], thread: [65,0,0] "
        'Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.\n'
        "RuntimeError: CUDA error: device-side assert triggered"
    )
    assert [e.kind for e in events] == ["cuda_error", "cuda_error"]
    assert events[0].fields["threads"] == 2 and "index out of bounds" in events[0].fields["assertion"]


# -- the stuck watchdog, the flight recorder ---------------------------------------------------------------------


def test_watchdog_stuck_in_a_named_process_group() -> None:
    event = one(corpus("watchdog_stuck_expert_pg_msswift_7992.txt"))
    assert event.kind == "watchdog_stuck" and event.critical and event.rank == 4
    assert event.fields == {
        "category": "watchdog_stuck",
        "timeout_s": 480,
        "pending_work": None,
        "rank": 4,
        "pg": 12,
        "pg_name": "EXPERT_MODEL_PARALLEL_GROUP",
    }
    assert event.ts == datetime(2026, 2, 5, 18, 11, 6, 375750, tzinfo=UTC)  # the glog stamp, not the bare clock


def test_heartbeat_monitor_and_dump_notices() -> None:
    events = parse(corpus("heartbeat_monitor_dump_xdit_147.txt"))
    assert [e.kind for e in events] == ["watchdog_stuck"] * 2 + ["flight_recorder_dump"] * 2
    assert [e.fields["pending_work"] for e in events[:2]] == [3, 2]
    assert events[0].fields["category"] == "heartbeat_monitor" and [e.rank for e in events] == [0, 4, 0, 4]
    assert events[2].severity == "warning" and events[2].fields["terminating"] is False
    term = one(
        "[rank6]:[F429 14:03:49.385461578 ProcessGroupNCCL.cpp:1554] [PG ID 0 PG GUID 0(default_pg) Rank 6] "
        "[PG ID 0 PG GUID 0(default_pg) Rank 6] Terminating the process after attempting to dump debug info, "
        "due to ProcessGroupNCCL watchdog hang."
    )
    assert term.kind == "flight_recorder_dump" and term.fields["terminating"] is True
    assert term.fields["reason"] == "ProcessGroupNCCL watchdog hang" and term.rank == 6


def test_flight_recorder_reports_name_the_missing_ranks() -> None:
    event = one(corpus("fr_trace_missing_ranks_pytorch_140969.txt"))
    assert event.kind == "flight_recorder" and event.severity == "error"
    f = event.fields
    assert f["missing_ranks"] == [3, 4, 5, 6, 7] and f["expected_ranks"] == list(range(8))
    assert (f["collective"], f["record_id"], f["op"], f["group"]) == (31117, 31116, "nccl:all_reduce", "0:default_pg")
    assert f["world_size"] == 8 and f["state"] == "scheduled" and len(f["stack"]) == 3
    old = one(corpus("fr_trace_missing_rank_tutorial.txt"))
    assert (old.fields["collective"], old.fields["record_id"], old.fields["missing_ranks"]) == (5, 4, [1])
    assert old.fields["world_size"] == 2 and old.fields["stack"][-1] == "<module> at /home/cpio/test/crash.py:44"
    # the newest wording, and the one-line print of the first versions
    new = parse("Not all ranks joining collective, sequence number: 4\ncollective: nccl:all_reduce\nmissing ranks: {1}")
    assert new[0].fields["collective"] == 4 and new[0].fields["missing_ranks"] == [1]
    inline = one(
        "Not all ranks joining collective for group 0:default_pg collective nccl:broadcast  Missing ranks are {2, 5}"
    )
    assert inline.fields["missing_ranks"] == [2, 5] and inline.fields["op"] == "nccl:broadcast"


def test_async_nccl_exception_names_its_collective() -> None:
    events = parse(corpus("nccl_async_exception_pt27_pytorch_149984.txt"))
    first = of(events, "nccl_error")[0]
    assert first.fields["seq"] == 2 and first.fields["op"] == "ALLREDUCE"
    assert first.fields["nccl_code"] == "ncclSystemError" and first.fields["nccl_version"] == "2.25.1"


# -- fp16 loss scaling, launchers ---------------------------------------------------------------------------------


def test_deepspeed_overflows_and_the_minimum() -> None:
    events = parse(corpus("deepspeed_loss_scale_minimum_chinesellama_534.txt"))
    overflows = of(events, "loss_scale_overflow")
    assert [e.fields["attempted"] for e in overflows] == [64, 32, 16, 8, 4]
    assert overflows[0].fields["reduced_to"] == 32 and overflows[0].rank == 0
    assert all(e.severity == "warning" and not e.fields["at_minimum"] for e in overflows)
    [floor] = of(events, "grad_norm_nan")
    assert floor.fields["reason"] == "loss_scale_minimum" and floor.fields["grad_norm"] == "inf"
    # the bars the overflow lines are glued to still count as progress
    assert [e.fields["step"] for e in of(events, "step")][:3] == [377, 378, 379]
    at_one = of(parse(corpus("deepspeed_overflow_at_min_scale_t5_hf_14531.txt")), "loss_scale_overflow")
    assert all(e.fields["at_minimum"] and e.severity == "error" for e in at_one)


def test_other_loss_scalers() -> None:
    # apex amp's and fairseq's wordings (their sources' messages)
    apex = one("Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0")
    assert apex.kind == "loss_scale_overflow" and apex.fields["reduced_to"] == 32768.0
    hysteresis = one(
        "[2024-07-17 19:44:06,829] [INFO] [loss_scaler.py:190:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping "
        "step. Attempted loss scale: 65536, but hysteresis is 2. Reducing hysteresis to 1"
    )
    assert hysteresis.fields["attempted"] == 65536 and hysteresis.fields["hysteresis"] == 2
    fairseq = one(
        "FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding. Try lowering the "
        "learning rate, using gradient clipping or increasing the batch size."
    )
    assert fairseq.kind == "grad_norm_nan" and fairseq.fields["reason"] == "loss_scale_minimum"


def test_deepspeed_launcher_exit_codes() -> None:
    killing, failed = parse(corpus("deepspeed_launcher_sigkill_deepspeed_3232.txt"))
    assert killing.kind == "elastic_error" and killing.severity == "warning" and killing.fields["pid"] == 13266
    assert failed.fields == {"category": "worker_failed", "exitcode": -9, "signal": "SIGKILL", "launcher": "deepspeed"}
    assert failed.severity == "error"
    called = one(
        "subprocess.CalledProcessError: Command '['/usr/bin/python', 'train.py']' returned non-zero exit status 1."
    )
    assert called.kind == "elastic_error" and called.fields["exitcode"] == 1 and called.fields["signal"] is None


# -- progress lines -----------------------------------------------------------------------------------------------


def test_megatron_counts_and_a_loss_left_out() -> None:
    base = (
        " iteration     {step}/    8000 | consumed samples:       216512 | elapsed time per iteration (ms): 7613.1 |"
        " learning rate: 6.680E-06 | global batch size:    64 |{loss} loss scale: 1.0 | grad norm: 0.752 |"
        " number of skipped iterations:   {skipped} | number of nan iterations:   {nan} |"
    )
    lines = [
        base.format(step=3383, loss=" lm loss: 7.334521E-01 |", skipped=0, nan=0),
        base.format(step=3384, loss="", skipped=0, nan=0),  # Megatron leaves a NaN loss out of its line
        base.format(step=3385, loss="", skipped=1, nan=0),  # a skipped iteration has no loss to print
        base.format(step=3386, loss=" lm loss: 7.1E-01 |", skipped=0, nan=2),
    ]
    events = parse("\n".join(lines))
    assert [e.kind for e in events] == ["step", "step", "nan_loss", "step", "step", "nan_loss"]
    assert events[1].fields["loss_missing"] is True and "loss" not in events[1].fields
    assert events[2].fields == {"step": 3384, "loss": "nan", "reason": "loss_missing"}
    assert events[3].fields["skipped"] == 1 and "loss_missing" not in events[3].fields
    assert events[5].fields == {"step": 3386, "loss": "nan", "reason": "nan_iterations", "nan_iterations": 2}


def test_megatron_first_line_without_loss_is_only_progress() -> None:
    for name in ("megatron_ds_nan_loss_missing_pr434.txt", "megatron_fp16_skipped_no_loss_nccl_743.txt"):
        [step] = parse(corpus(name))
        assert step.kind == "step" and "loss" not in step.fields, name


def test_megatron_variants() -> None:
    ds = of(parse(corpus("deepspeed_log_dist_megatron_ds_bf16_deepspeed_3742.txt")), "step")
    # "| step: 1172.13 |" in a timer line is a duration, not a step
    assert [e.fields["step"] for e in ds] == [34, 35]
    assert ds[0].fields["loss"] == 11.18665 and ds[1].fields == {"step": 35, "skipped": 0, "lr": 2.1731931451279077e-06}
    bridge, nan = parse(
        "iteration 5/50 | elapsed time per iteration: 21392.5 ms | learning rate: 1.35E-04 | grad norm: nan |"
    )
    assert bridge.kind == "step" and bridge.fields["elapsed_ms"] == 21392.5
    assert nan.kind == "grad_norm_nan" and nan.fields == {"step": 5, "grad_norm": "nan"}
    mtp = of(parse(corpus("megatron_bridge_mtp_losses_4024.txt")), "step")
    assert [e.fields["loss"] for e in mtp] == [0.8716962, 0.8535482, 0.8641004]


def test_trainer_dicts_bars_and_runner_lines() -> None:
    hf = parse(corpus("hf_trainer_grad_norm_nan_modernbert_233.txt"))
    assert [e.kind for e in hf] == ["step", "grad_norm_nan"] * 3
    quoted = parse('{"loss": 1.25, "grad_norm": "nan", "learning_rate": 2e-05, "epoch": 1.0}')
    assert quoted[0].fields["loss"] == 1.25
    bar = parse("Epoch 3:  41%|████      | 120/291 [01:02<01:29,  1.91it/s, v_num=7, train_loss_step=nan]")
    assert [e.kind for e in bar] == ["step", "nan_loss"] and bar[0].fields["step"] == 120
    mmengine = parse(corpus("mmengine_grad_norm_nan_xtuner_187.txt"))
    steps = of(mmengine, "step")
    assert [e.fields["step"] for e in steps] == [200, 210, 220, 230, 240, 250] and steps[0].fields["total"] == 735
    assert (
        steps[0].fields["loss"] == 2.7522
        and steps[0].fields["grad_norm"] == 3.0608
        and steps[0].fields["lr"] == 1.987e-4
    )
    mmcv = parse(
        "2021-11-22 01:32:34,502 - mmocr - INFO - Epoch [1][200/62598]\tlr: 1.000e-03, loss: 0.9186, grad_norm: nan"
    )
    assert [e.kind for e in mmcv] == ["step", "grad_norm_nan"] and mmcv[0].fields["loss"] == 0.9186
    nano = parse("iter 4200: loss 3.1234, time 52.31ms, mfu 31.20%")
    assert nano[0].fields == {"step": 4200, "loss": 3.1234, "elapsed_ms": 52.31}
    lit = of(parse(corpus("nccl_ib_async_port_error_litllama_380.txt")), "step")
    assert [e.fields["step"] for e in lit] == [83592, 83593, 83594] and lit[0].fields["elapsed_ms"] == 4401.19


def test_prose_is_not_progress() -> None:
    assert of(parse("We ran this for 3 iterations: it failed each time"), "step") == []
    assert of(parse("Iteration 3 of the sweep used lr 0.1"), "step") == []
    assert parse("[INFO] [stage2.py:1628:step] reduced bucket size") == []


def test_nan_and_oom_wordings_beyond_the_step_lines() -> None:
    # the Trainer's closing summary and an eval dict name their loss with a prefix
    summary = one("{'train_runtime': 1234.5, 'train_samples_per_second': 3.2, 'train_loss': nan, 'epoch': 3.0}")
    assert summary.kind == "nan_loss"
    assert one("{'eval_loss': nan, 'eval_runtime': 12.1, 'epoch': 1.0}").kind == "nan_loss"
    # autograd's anomaly mode names the backward function that produced it
    autograd = one("RuntimeError: Function 'MulBackward0' returned nan values in its 0th output.")
    assert autograd.kind == "grad_norm_nan"
    # the host's allocator, not a GPU's
    host = one(
        "RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: not enough memory: "
        "you tried to allocate 21474836480 bytes."
    )
    assert host.kind == "oom" and host.fields["host"] is True and host.fields["tried_bytes"] == 21474836480
    # a registration failure in a plugin's own words
    reg = one("gpu1:12:13 [0] NCCL WARN NET/IB : Failed to register memory: Cannot allocate memory")
    assert reg.kind == "ib_verbs_error" and reg.fields["errno"] == "ENOMEM" and reg.fields["hint"] == "memlock"
    assert parse("Using fp16 inference mode with loss scaling disabled") == []


def test_store_and_nccl_init_timeouts() -> None:
    store = parse(corpus("c10d_client_socket_timeout_controlnet_382.txt"))
    assert [e.kind for e in store] == ["collective_timeout"] * 2
    assert store[1].fields == {
        "backend": "store",
        "timeout_ms": 1_800_000,
        "op": "connect",
        "peer": "127.0.0.1",
        "peer_port": 48391,
    }
    [init, cpp] = parse(corpus("nccl_uniqueid_socket_timeout_pytorch_82091.txt"))
    assert init.kind == "nccl_error" and init.rank == 2
    assert (init.fields["category"], init.fields["root_rank"], init.fields["store_error"]) == (
        "init_store",
        0,
        "Socket Timeout",
    )
    assert cpp.kind == "cpp_exception"
    # NeMo-Run's task tag before torchrun's prefixes: the rank is still read, the C++ dump still opens a block
    nemo = parse(corpus("nccl_uniqueid_store_wait_timeout_nemo_14399.txt"))
    [err] = of(nemo, "nccl_error")
    assert err.rank == 1 and err.fields["local_rank"] == 1 and err.fields["root_rank"] == 0
    assert "wait timeout after 600000ms" in err.fields["store_error"]
    assert [e.kind for e in nemo][-1] == "cpp_exception"


def test_loose_loggers_values_before_the_step() -> None:
    lion = parse(corpus("bracket_loss_nan_lion_9.txt"))
    steps = of(lion, "step")
    assert [e.fields["step"] for e in steps] == [89, 104, 119, 134, 149]
    assert steps[0].fields["loss"] == 51566519.44 and len(of(lion, "nan_loss")) == 4
    # an epoch header alone is not a step; the meter lines under it are
    meters = parse(corpus("epoch_meter_logger_rtm3d_4.txt"))
    assert [e.fields["step"] for e in meters] == [35, 85, 135, 185] and meters[0].fields["loss"] == 2.1274
