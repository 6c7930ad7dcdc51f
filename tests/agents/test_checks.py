"""The stop-time checks (agents/checks) against fakes at their boundaries, built from real outputs
(tests/fixtures/checks/README.md): NVML (lab/fakes/nvml.py and a real H200's fields), dcgmi's JSON (NVIDIA's
own test document), PyTorch figures (published H100 measurements); and for real where this machine can: PyTorch
on the CPU, all-reduce over gloo between processes, the host's own /proc, the `faultline check` command."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from agents.agent import Agent
from agents.checks import collectives, compute, dcgm, driver, host
from agents.checks.collectives import Peer
from agents.checks.network import PortWatch
from agents.checks.result import CheckResult
from agents.checks.suite import Options, Refused, plan, run_suite, verdict
from agents.config import load
from agents.nvml import Nvml
from lab.fakes.nvml import FakeNvml
from tests import paths
from tests.procs import wait_for

FIXTURES = paths.FIXTURES / "checks"
H200 = json.loads((paths.FIXTURES / "hardware" / "h200" / "nvml_fields.json").read_text())
H100_GEMM_TFLOPS = 797.51  # zzc0721/torch-performance-test-data#79: H100 80GB HBM3, bf16 8192^3, torch 2.7
H100_COPY_GBPS = 2900.0  # about 87% of the datasheet's 3,350 GB/s, as a device-to-device copy reaches
H100_H2D_GBPS = 53.0  # pinned PCIe 5.0 x16


def _by_subject(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.subject: r for r in results}


# -- NVML driver state -------------------------------------------------------------------------------


def test_a_real_h200_idle_and_under_load_passes_the_driver_state() -> None:
    for state in ("idle", "busy"):
        fields = {k: (None if v != v else v) for k, v in H200[state][0]["fields"].items()}
        assert driver.judge(fields) == ([], None), state  # busy: clock reason 0x4 is the power cap, not a slowdown


def test_driver_state_fails_each_gpu_on_what_needs_a_reset_or_a_replacement() -> None:
    fake = FakeNvml(4)
    fake.nvmlInit()
    fake.gpus[1].remapped = (0, 3, 1, 0)  # uncorrectable rows remapped, one pending: reset the GPU
    fake.gpus[2].link_width = 8  # x8 of x16
    fake.gpus[3].clock_reasons = 0x8 | 0x4  # hw_slowdown beside the power cap
    results = _by_subject(driver.results_from(Nvml(fake, 4)))
    assert results["gpu:0"].status == "pass" and results["gpu:0"].measured == 0
    assert results["gpu:1"].status == "fail"
    assert results["gpu:1"].evidence["problems"] == ["row remap pending: 1"]
    assert results["gpu:1"].evidence["action"] == "reset_gpu"
    assert results["gpu:1"].evidence["fields"]["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] == 3
    assert results["gpu:2"].evidence["problems"] == ["PCIe link x8 of x16"]
    assert results["gpu:2"].evidence["action"] == "replace"
    assert results["gpu:3"].evidence["problems"] == ["clocks held back: hw_slowdown"]


def test_a_gpu_that_answers_nothing_and_a_down_nvlink_fail() -> None:
    fake = FakeNvml(2)
    fake.nvmlInit()
    reader = Nvml(fake, 2)
    fake.gpus[0].lost = True
    fake.gpus[1].nvlinks[5] = 0
    results = _by_subject(driver.results_from(reader))
    assert "answers no NVML query" in results["gpu:0"].evidence["problems"][0]
    assert results["gpu:1"].evidence["problems"] == ["NVLinks down: 1"]


def test_xid_events_since_boot_are_listed_per_gpu_from_the_kernel_log_or_na() -> None:
    kmsg = [  # /dev/kmsg records, as read_kmsg returns them: one Xid on GPU 1's bus, one on another GPU's
        "6,1201,5000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07",
        "3,1876,812345678,-;NVRM: Xid (PCI:0000:19:00): 119, pid=4242, name=python, Timeout after 6s of waiting "
        "for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20800a4c 0x4).",
        " SUBSYSTEM=pci",
        "3,1877,812345999,-;NVRM: Xid (PCI:0000:1b:00): 13, pid=4243, name=python, Graphics Exception",
    ]
    xids = driver.xids_since_boot((lambda: None, lambda: kmsg))  # no /dev/kmsg here: the second source answers
    assert xids is not None and set(xids) == {"0000:19:00", "0000:1b:00"}
    [gsp] = xids["0000:19:00"]
    assert (gsp["xid"], gsp["mnemonic"], gsp["action"]) == (119, "GSP_RPC_TIMEOUT", "RESET_GPU")
    fake = FakeNvml(2)
    fake.nvmlInit()
    results = _by_subject(driver.results_from(Nvml(fake, 2), xids=xids))
    assert [x["xid"] for x in results["gpu:1"].evidence["xid_since_boot"]] == [119]
    assert results["gpu:0"].evidence["xid_since_boot"] == []
    assert results["gpu:1"].status == "pass"  # evidence: the service acted on the Xid when it happened
    assert driver.xids_since_boot((lambda: None, lambda: None)) is None
    na = _by_subject(driver.results_from(Nvml(fake, 2), xids=None))
    assert na["gpu:0"].evidence["xid_since_boot"] == "n/a"


def test_xids_since_boot_come_from_the_kernel_log_the_agent_follows(tmp_path: Path) -> None:
    kern = tmp_path / "kern.log"  # --kmsg FILE: a kern.log (here in its ISO form), not this host's /dev/kmsg
    kern.write_text(
        "2026-11-26T12:00:00.000001+00:00 node-007 kernel: NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n"
        "2026-11-26T12:00:01.123456+00:00 node-007 kernel: NVRM: Xid (PCI:0000:19:00): 119, pid=4242, name=python, "
        "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL).\n"
    )
    xids = driver.xids_since_boot(driver.sources_for(str(kern)))
    assert xids is not None and [x["xid"] for x in xids["0000:19:00"]] == [119]
    assert driver.xids_since_boot(driver.sources_for("none")) is None  # --kmsg none: "n/a"
    assert driver.sources_for("auto") == (driver.read_kmsg, driver.read_journal)
    assert driver.sources_for("journald") == (driver.read_journal,)
    assert driver.read_file(str(tmp_path / "absent")) is None
    tail = driver.read_file(str(kern), max_bytes=len(kern.read_bytes()) - 10)  # the cut first line is left out
    assert tail is not None and len(tail) == 1 and "Xid" in tail[0]


def test_the_driver_s_recovery_action_fails_a_gpu_with_the_action_it_asks_for() -> None:
    fake = FakeNvml(3)
    fake.nvmlInit()
    reader = Nvml(fake, 3)
    fake.gpus[1].recovery_action = fake.NVML_GPU_RECOVERY_ACTION_GPU_RESET  # a GSP still hung after Xid 119
    fake.gpus[2].recovery_action = fake.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    results = _by_subject(driver.results_from(reader))
    assert results["gpu:0"].status == "pass"
    assert results["gpu:1"].evidence["problems"] == ["the driver asks for a GPU reset"]
    assert results["gpu:1"].evidence["action"] == "reset_gpu"
    assert results["gpu:1"].evidence["fields"][driver.RECOVERY_ACTION] == 1
    assert results["gpu:2"].evidence["action"] == "reboot"
    fake.gpus[1].lost = True  # a GPU that answers nothing, the recovery action included
    assert "answers no NVML query" in _by_subject(driver.results_from(reader))["gpu:1"].evidence["problems"][0]
    fake.missing = {"nvmlDeviceGetFieldValues"}  # an older driver: nothing to judge it by
    assert _by_subject(driver.results_from(reader))["gpu:2"].status == "pass"


def test_reading_the_kernel_ring_buffer_stops_at_its_end(tmp_path: Path) -> None:
    assert driver.read_kmsg(str(tmp_path / "absent")) is None
    if os.access(driver.KMSG, os.R_OK):  # a real /dev/kmsg (root, or kernel.dmesg_restrict=0): whole, then EAGAIN
        lines = driver.read_kmsg()
        assert lines is not None and all(";" in line for line in lines[:5])


def test_driver_state_without_nvml_is_not_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails, as on a node without nvidia-ml-py
    [result] = driver.run()
    assert result.status == "not_available" and "NVML" in result.evidence["reason"]


# -- dcgmi diag --------------------------------------------------------------------------------------


def test_nvidia_s_real_level_1_document_parses_to_passes_per_test_and_gpu() -> None:
    results = dcgm.parse((FIXTURES / "dcgmi_diag_r1_pass.txt").read_text(), level=1)
    assert {r.status for r in results} == {"pass"}
    deployment = [r for r in results if r.evidence["category"] == "Deployment"]
    assert len(deployment) == 9 and {r.subject for r in deployment} == {"node"}  # "0,1,...,7": all GPUs at once
    software = [r for r in results if r.check == "dcgm:software"]
    assert sorted(r.subject for r in software) == [f"gpu:{i}" for i in range(8)]
    assert results[0].evidence["dcgm_version"] == "3.1.0"


def test_a_failing_memory_test_names_its_gpu_with_dcgm_s_words() -> None:
    results = dcgm.parse((FIXTURES / "dcgmi_diag_r2_fail.json").read_text(), level=2)
    failed = [r for r in results if r.status == "fail"]
    assert [(r.check, r.subject) for r in failed] == [("dcgm:GPU Memory", "gpu:3")]
    assert failed[0].evidence["warnings"][0].endswith("(DCGM error 19)")
    skipped = {r.status for r in results if r.check == "dcgm:Diagnostic"}
    assert skipped == {"not_available"}
    warned = next(r for r in results if r.check == "dcgm:Targeted Stress" and r.subject == "gpu:5")
    assert warned.status == "pass" and "throttled" in warned.evidence["warnings"][0]
    assert verdict(results) == "fail"


@pytest.mark.parametrize(
    "text", ["", "Error: unable to connect to host engine", '{"DCGM GPU Diagnostic": {}}', "{nope"]
)
def test_output_without_a_diagnostic_document_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        dcgm.parse(text, level=1)


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "dcgmi"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_dcgmi_is_run_and_a_non_zero_exit_with_a_document_is_judged_by_the_document(tmp_path: Path) -> None:
    fixture = FIXTURES / "dcgmi_diag_r2_fail.json"
    results = dcgm.run(2, dcgmi=_script(tmp_path, f'[ "$*" = "diag -r 2 -j" ] || exit 9\ncat {fixture}\nexit 226\n'))
    assert [r.subject for r in results if r.status == "fail"] == ["gpu:3"]
    assert all(r.duration_s is not None for r in results)


def test_dcgmi_without_a_host_engine_is_not_available_and_a_hang_fails(tmp_path: Path) -> None:
    [absent] = dcgm.run(1, dcgmi=_script(tmp_path, 'echo "Error: unable to establish a connection" >&2\nexit 255\n'))
    assert absent.status == "not_available" and "connection" in absent.evidence["reason"]
    [hung] = dcgm.run(1, dcgmi=_script(tmp_path, "exec sleep 30\n"), timeout=0.5)
    assert hung.status == "fail" and "timed out" in hung.evidence["reason"]


# -- compute and numerics ----------------------------------------------------------------------------


class FakeCompute:
    """Eight H100s answering published figures; a test slows one or corrupts its bits."""

    def __init__(self, gpus: int = 8) -> None:
        self.scale = dict.fromkeys(range(gpus), 1.0)
        self.digests = dict.fromkeys(range(gpus), "5f0c9e1d7a2b3c4d")
        self.flaky: set[int] = set()
        self.broken: dict[int, str] = {}
        self._runs = 0

    def devices(self) -> list[tuple[int, str]]:
        return [(gpu, "NVIDIA H100 80GB HBM3") for gpu in self.scale]

    def _figure(self, gpu: int, base: float) -> float:
        if gpu in self.broken:
            raise RuntimeError(self.broken[gpu])
        return base * self.scale[gpu] * (1 + 0.004 * (gpu % 3))  # a spread of under 1% between healthy GPUs

    def gemm_tflops(self, gpu: int) -> float:
        return self._figure(gpu, H100_GEMM_TFLOPS)

    def memory_gbps(self, gpu: int) -> float:
        return self._figure(gpu, H100_COPY_GBPS)

    def h2d_gbps(self, gpu: int) -> float:
        return self._figure(gpu, H100_H2D_GBPS)

    def gemm_digest(self, gpu: int) -> str:
        self._runs += 1
        return self.digests[gpu] + (str(self._runs) if gpu in self.flaky else "")


def test_a_gpu_20_percent_below_its_node_fails_the_gemm_and_the_others_pass() -> None:
    fake = FakeCompute()
    fake.scale[6] = 0.8
    results = _by_subject(compute.run(fake, "gemm_bf16"))
    assert results["gpu:6"].status == "fail"
    assert results["gpu:6"].measured == pytest.approx(0.8 * H100_GEMM_TFLOPS, rel=0.01)
    assert results["gpu:6"].expected == pytest.approx(0.85 * results["gpu:0"].evidence["node_median"], abs=0.01)
    assert [s for s, r in results.items() if r.status == "fail"] == ["gpu:6"]
    assert results["gpu:0"].unit == "TFLOPS"


def test_memory_and_host_to_device_bandwidth_are_judged_the_same_way() -> None:
    fake = FakeCompute()
    assert {r.status for r in compute.run(fake, "memory_bandwidth")} == {"pass"}
    fake.scale[2] = 0.5  # a PCIe link trained down to half
    h2d = _by_subject(compute.run(fake, "h2d_bandwidth"))
    assert h2d["gpu:2"].status == "fail" and h2d["gpu:2"].unit == "GB/s"


def test_a_cuda_error_on_one_gpu_fails_that_gpu_only() -> None:
    fake = FakeCompute()
    fake.broken[4] = "CUDA error: an illegal memory access was encountered"
    results = _by_subject(compute.run(fake, "gemm_bf16"))
    assert results["gpu:4"].status == "fail" and "illegal memory" in results["gpu:4"].evidence["error"]
    assert sum(r.status == "pass" for r in results.values()) == 7


def test_numerics_fail_a_gpu_whose_bits_differ_from_the_others_or_from_its_own_first_run() -> None:
    fake = FakeCompute()
    fake.digests[2] = "0000000000000000"  # wrong, but the same twice
    fake.flaky.add(5)  # different every run
    results = _by_subject(compute.run(fake, "numerics"))
    assert results["gpu:2"].evidence["problems"] == ["its GEMM's bits differ from the other GPUs'"]
    assert "two runs of the same GEMM gave different bits" in results["gpu:5"].evidence["problems"]
    assert {s for s, r in results.items() if r.status == "fail"} == {"gpu:2", "gpu:5"}


def test_without_a_gpu_runtime_compute_checks_are_not_available() -> None:
    runtime, why = compute.open_torch()  # PyTorch here is a CPU build, or not installed (the README's `make test`)
    assert runtime is None and why is not None
    [result] = compute.run(runtime, "gemm_bf16", why_not=why)
    expected = "CUDA" if importlib.util.find_spec("torch") else "PyTorch is not installed"
    assert result.status == "not_available" and expected in result.evidence["reason"]


def test_compute_checks_run_in_a_child_process_that_never_brings_torch_into_the_agent() -> None:
    pytest.importorskip("torch")
    results = compute.run_isolated(timeout=120)  # this PyTorch is a CPU build: each says why it cannot run
    assert [r.check for r in results] == list(compute.CHECKS)
    assert {r.status for r in results} == {"not_available"} and "CUDA" in results[0].evidence["reason"]
    [hung] = compute.run_isolated(("gemm_bf16",), timeout=0.05)
    assert hung.status == "fail" and hung.evidence["reason"] == "timed out after 0.05 s"


def test_the_torch_measurements_run_for_real_on_the_cpu() -> None:
    torch = pytest.importorskip("torch")
    real = compute.TorchCompute(
        torch,
        device_type="cpu",
        gemm_n=128,
        gemm_iters=3,
        copy_bytes=2**20,
        copy_iters=3,
        h2d_bytes=2**20,
        h2d_iters=3,
        digest_n=64,
    )
    assert real.gemm_tflops(0) > 0 and real.memory_gbps(0) > 0 and real.h2d_gbps(0) > 0
    assert real.gemm_digest(0) == real.gemm_digest(0)  # the same inputs, the same bits
    [numerics] = compute.run(real, "numerics")
    assert numerics.status == "pass"


# -- collectives -------------------------------------------------------------------------------------


def test_all_reduce_between_two_local_ranks_measures_bus_bandwidth_and_checks_the_sums() -> None:
    pytest.importorskip("torch")
    result = collectives.allreduce("allreduce_node", nproc=2, backend="gloo", nbytes=2**20, iters=3, timeout=90)
    assert result.status == "pass", result.evidence
    assert result.measured is not None and result.measured > 0
    assert [r["wrong_elements"] for r in result.evidence["ranks"]] == [0, 0]


def test_cross_node_all_reduce_pairs_two_nodes_through_the_peer_the_service_names() -> None:
    pytest.importorskip("torch")
    port = collectives.free_port()
    out: dict[int, CheckResult] = {}

    def node(rank: int) -> None:
        peer = Peer.from_wire({"addr": "127.0.0.1", "port": port, "node_rank": rank})
        out[rank] = collectives.allreduce(
            "allreduce_peer", nproc=1, backend="gloo", peer=peer, nbytes=2**20, iters=3, timeout=90
        )

    threads = [threading.Thread(target=node, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out[0].status == out[1].status == "pass", (out[0].evidence, out[1].evidence)
    assert out[0].evidence["world_size"] == 2 and out[1].evidence["peer"]["node_rank"] == 1


def test_a_peer_that_never_comes_fails_at_the_timeout_and_leaves_no_process() -> None:
    pytest.importorskip("torch")
    peer = Peer(addr="127.0.0.1", port=collectives.free_port(), node_rank=0)
    started = time.monotonic()
    result = collectives.allreduce("allreduce_peer", nproc=1, backend="gloo", peer=peer, nbytes=2**16, timeout=4)
    assert result.status == "fail" and "timed out after 4 s" in result.evidence["errors"]
    assert time.monotonic() - started < 15


def test_a_rank_that_dies_ends_the_collective_at_once_not_at_the_timeout() -> None:
    # A rank whose GPU is gone exits at once; its peers would wait for it in the collective until the timeout.
    dead = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    waiting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    started = time.monotonic()
    timed_out = collectives._wait([waiting, dead], deadline=started + 60)
    assert not timed_out and time.monotonic() - started < 20
    assert dead.returncode == 3 and waiting.returncode is not None and waiting.returncode < 0  # killed


def test_ranks_still_running_at_the_deadline_are_killed_as_a_time_out() -> None:
    waiting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    assert collectives._wait([waiting], deadline=time.monotonic() + 1)
    assert waiting.returncode is not None and waiting.returncode < 0


def test_gpus_for_nccl_are_counted_without_pytorch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = tmp_path / "driver/nvidia/gpus"
    for bus in ("0000:18:00.0", "0000:2a:00.0"):
        (gpus / bus).mkdir(parents=True)
    assert collectives.gpu_count(str(tmp_path)) == 2
    assert collectives.gpu_count(str(tmp_path / "none")) == 0
    assert collectives.run("allreduce_node", procfs_root=str(tmp_path / "none")).status == "not_available"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7")
    assert collectives.gpu_count(str(tmp_path)) == 3


@pytest.mark.parametrize("raw", [{"addr": "a", "port": 0, "node_rank": 0}, {"addr": "a", "port": 80, "node_rank": 2}])
def test_a_bad_peer_is_refused(raw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Peer.from_wire(raw)


# -- ports and host ----------------------------------------------------------------------------------


def test_ports_fail_on_a_slow_link_and_on_errors_that_grew_during_the_checks(tmp_path: Path) -> None:
    sysfs = Path(shutil.copytree(paths.FIXTURES / "sysfs", tmp_path / "sys"))
    watch = PortWatch(sysfs)
    watch.start()
    port = sysfs / "class/infiniband/mlx5_1/ports/1"
    (port / "counters/symbol_error").write_text(str(int((port / "counters/symbol_error").read_text()) + 7) + "\n")
    (sysfs / "class/infiniband/mlx5_2/ports/1/rate").write_text("200 Gb/sec (4X HDR)\n")
    results = _by_subject(watch.finish())
    assert results["ib:mlx5_0/1"].status == "pass" and results["ib:mlx5_0/1"].measured == 400
    assert results["ib:mlx5_1/1"].evidence["problems"] == ["error counters grew during the checks: symbol_error +7"]
    assert results["ib:mlx5_2/1"].evidence["problems"] == ["200 Gb/s where the node's other ports run 400"]
    assert results["roce:mlx5_4/1"].status == "pass"  # 200 Gb/s, but the fastest of its kind


def test_host_checks_fail_a_node_short_of_memory(tmp_path: Path) -> None:
    proc = Path(shutil.copytree(paths.FIXTURES / "procfs", tmp_path / "proc"))
    ok = _by_subject(host.run(procfs_root=proc, sysfs_root=tmp_path, volumes=[str(tmp_path)]))
    assert ok["host"].status == "pass" and ok[f"vol:{tmp_path}"].check == "disk_free"
    meminfo = (proc / "meminfo").read_text().replace("MemAvailable:   1802345678 kB", "MemAvailable:   100000000 kB")
    (proc / "meminfo").write_text(meminfo)
    memory = next(r for r in host.run(procfs_root=proc, sysfs_root=tmp_path) if r.check == "memory_available")
    assert memory.status == "fail" and memory.measured == pytest.approx(4.73, abs=0.01)


# -- the suite ---------------------------------------------------------------------------------------


def test_the_suite_refuses_while_a_job_s_ranks_run_unless_forced(tmp_path: Path) -> None:
    checks = [("one", 5.0, lambda: [CheckResult("one", "node", "pass")])]
    options = Options(level=1, sysfs_root=str(tmp_path))
    with pytest.raises(Refused, match="2 training processes"):
        run_suite(options, busy_ranks=["rank0", "rank1"], checks=checks)
    forced = run_suite(Options(level=1, force=True, sysfs_root=str(tmp_path)), busy_ranks=["rank0"], checks=checks)
    assert [r.check for r in forced] == ["one", "ib_port"]


def test_a_check_that_hangs_or_raises_fails_without_stopping_the_others(tmp_path: Path) -> None:
    def boom() -> list[CheckResult]:
        raise RuntimeError("CUDA error: unspecified launch failure")

    checks = [
        ("hang", 0.3, lambda: time.sleep(30) or []),
        ("boom", 5.0, boom),
        ("fine", 5.0, lambda: [CheckResult("fine", "node", "pass")]),
    ]
    results = run_suite(Options(level=1, sysfs_root=str(tmp_path)), checks=checks)
    by_check = {r.check: r for r in results}
    assert by_check["hang"].status == "fail" and by_check["hang"].evidence["reason"] == "timed out after 0.3 s"
    assert "unspecified launch failure" in by_check["boom"].evidence["reason"]
    assert by_check["fine"].status == "pass" and verdict(results) == "fail"


def test_levels_add_checks_and_the_cross_node_one_needs_a_peer() -> None:
    names = {level: [name for name, _, _ in plan(Options(level=level))] for level in (1, 2, 3)}
    assert names[1] == ["nvml_state", "host", "dcgm"]
    assert names[2] == [*names[1], "compute", "allreduce_node"]
    assert names[3] == names[2]
    peer = Peer("10.0.0.7", 29533, 1)
    assert [n for n, _, _ in plan(Options(level=3, peer=peer))] == ["allreduce_peer", *names[2]]  # first: both meet
    assert [n for n, _, _ in plan(Options(level=3, peer=peer, only=["allreduce_peer"]))] == ["allreduce_peer"]
    with pytest.raises(ValueError, match="no check allreduce_peer at level 2"):
        plan(Options(level=2, peer=peer, only=["allreduce_peer"]))
    with pytest.raises(ValueError, match="level"):
        run_suite(Options(level=4), checks=[])


# -- the agent's directive and the command -----------------------------------------------------------


def _agent(tmp_path: Path, out: io.StringIO) -> Agent:
    flags = {"dry_run": True, "kmsg": "none", "ship_interval": 600.0, "spool_dir": tmp_path, "nvml_xid": "off"}
    return Agent(load(flags, config_file=None, environ={}), out=out)


def test_a_run_checks_directive_runs_the_suite_once_and_ships_the_results_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    out = io.StringIO()
    agent = _agent(tmp_path, out)
    agent.scan = lambda: []  # type: ignore[method-assign]  # a drained node (training jobs of this host aside)
    loop = threading.Thread(target=agent.run, daemon=True)
    loop.start()
    try:
        wait_for(lambda: len(out.getvalue().splitlines()) == 1, timeout=10, what="the first batch")
        directive = {"id": "d-1", "kind": "run_checks", "level": 1}
        agent._on_directives([directive, directive])  # repeated until it expires: acted on once
        wait_for(lambda: len(out.getvalue().splitlines()) == 2, timeout=60, what="the batch with the results")
    finally:
        agent.stopping.set()
        loop.join(timeout=10)
    batch = orjson.loads(out.getvalue().splitlines()[1])
    checks = batch["checks"]
    assert {c["directive_id"] for c in checks} == {"d-1"}
    assert {"nvml_state", "memory_available", "dcgm", "ib_port"} <= {c["check"] for c in checks}
    assert next(c for c in checks if c["check"] == "nvml_state")["status"] == "not_available"


def test_a_run_checks_directive_is_refused_while_ranks_run_and_a_bad_one_says_why(tmp_path: Path) -> None:
    out = io.StringIO()
    agent = _agent(tmp_path, out)
    agent.scan = lambda: ["a rank"]  # type: ignore[method-assign,return-value,list-item]
    agent._run_checks("d-2", {"id": "d-2", "kind": "run_checks", "level": 2})
    agent._run_checks("d-3", {"id": "d-3", "kind": "run_checks", "level": 2, "peer": {"addr": "x"}})
    batch = agent.build_batch(processes=False)
    refused = {c["directive_id"]: c["refused"] for c in batch["checks"]}
    assert "1 training processes run on this node" in refused["d-2"]
    assert refused["d-3"].startswith("bad directive")
    assert "checks" not in agent.build_batch(processes=False)  # shipped once


def test_faultline_check_by_hand(tmp_path: Path) -> None:
    # --force: other sessions may run training processes on this host; a drained node would not need it.
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "faultline", "check", "--level", "1", "--force", "--json", "--volume", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    document = json.loads(done.stdout)
    assert done.returncode == (1 if document["verdict"] == "fail" else 0)
    assert {r["check"] for r in document["results"]} >= {"nvml_state", "memory_available", "disk_free", "ib_port"}
    bad = subprocess.run(
        [sys.executable, "-m", "faultline", "check", "--peer", "nohost", "--level", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "--peer must be ADDR:PORT" in bad.stderr
    low = subprocess.run(
        [sys.executable, "-m", "faultline", "check", "--peer", "10.0.0.7:29533", "--level", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert low.returncode == 2 and "--level 3" in low.stderr
