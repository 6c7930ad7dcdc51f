"""The GPUs' NVLink fabric info (agents/nvml_fabric.py) through the NVML reader, against the fake pynvml."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pynvml as real
import pytest

from agents.gpu import GpuReading
from agents.nvml import Nvml, open_nvml
from agents.nvml_fabric import WithFabric, open_exporter_fabric
from lab.fakes.nvml import FakeFabric, FakeNvml

DOMAIN = "6a7c1f3e-2b5d-4e8f-9a01-3c4d5e6f7a8b"


def _reader(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> Nvml:
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reader = open_nvml()
    assert reader is not None
    reader.slow_period = 0.0
    return reader


@pytest.fixture
def nvl72(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeNvml, Nvml]]:
    """A GB200 compute tray: 4 GPUs in one NVLink domain and clique."""
    fake = FakeNvml(4)
    for gpu in fake.gpus:
        gpu.fabric = FakeFabric(cluster_uuid=DOMAIN, clique_id=7)
    reader = _reader(fake, monkeypatch)
    yield fake, reader
    reader.close()


def test_each_gpu_reports_its_domain_clique_and_state(nvl72: tuple[FakeNvml, Nvml]) -> None:
    fake, reader = nvl72
    inventory = [r.inventory() for r in reader.read()]
    assert [g["fabric"] for g in inventory] == [
        {
            "cluster_uuid": DOMAIN,
            "clique_id": 7,
            "state": "completed",
            "status": 0,
            "health": "healthy",
            "degraded_bw": False,
            "gfm": "connected",
        }
    ] * 4
    # The switch side fails: bandwidth degraded, the global fabric manager gone, the health summary says so.
    fake.gpus[2].fabric = FakeFabric(
        cluster_uuid=DOMAIN,
        clique_id=7,
        degraded_bw=True,
        gfm_connected=False,
        summary=real.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY,
    )
    fabric = reader.read()[2].fabric
    assert fabric is not None
    assert (fabric["health"], fabric["degraded_bw"], fabric["gfm"]) == ("unhealthy", True, "disconnected")


def test_fabric_info_is_a_slow_reading(nvl72: tuple[FakeNvml, Nvml]) -> None:
    fake, reader = nvl72
    reader.slow_period = 3600.0
    reader.read()
    reader.read()
    reader.read()
    assert fake.calls["nvmlDeviceGetGpuFabricInfoV"] == 4  # once per GPU, not once per sample
    assert all(r.fabric is not None for r in reader.read())  # the last reading goes with every sample


def test_a_gpu_being_registered_has_no_cluster_yet(nvl72: tuple[FakeNvml, Nvml]) -> None:
    fake, reader = nvl72
    fake.gpus[0].fabric = FakeFabric(
        cluster_uuid="00000000-0000-0000-0000-000000000000",
        clique_id=0,
        state=real.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
        status=real.NVML_ERROR_NOT_READY,
    )
    fabric = reader.read()[0].fabric
    assert fabric is not None
    assert (fabric["cluster_uuid"], fabric["state"], fabric["status"]) == (
        None,
        "in_progress",
        real.NVML_ERROR_NOT_READY,
    )


def test_no_fabric_reports_nothing_and_is_not_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(2)  # an HGX H100 board: NotSupported
    fake.gpus[1].fabric = FakeFabric(state=real.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED)  # answers, but "not supported"
    reader = _reader(fake, monkeypatch)
    for _ in range(3):
        readings = reader.read()
        assert [r.fabric for r in readings] == [None, None]
        assert all("fabric" not in r.inventory() for r in readings)
    # GPU 0: each way tried once (v3, v2, the old call), then never again; GPU 1 answers: asked every time.
    assert fake.gpu_calls[("nvmlDeviceGetGpuFabricInfoV", 0)] == 2
    assert fake.gpu_calls[("nvmlDeviceGetGpuFabricInfo", 0)] == 1
    assert fake.gpu_calls[("nvmlDeviceGetGpuFabricInfoV", 1)] == 3
    reader.close()


def test_older_drivers_fall_back_to_older_structures(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(1)
    fake.gpus[0].fabric = FakeFabric(clique_id=3, degraded_bw=True, version=2)  # a 550 driver: no health summary
    reader = _reader(fake, monkeypatch)
    fabric = reader.read()[0].fabric
    assert fabric is not None
    assert (fabric["clique_id"], fabric["health"], fabric["degraded_bw"]) == (3, None, True)
    reader.close()
    old = FakeNvml(1, missing=("nvmlDeviceGetGpuFabricInfoV",))  # a 535 driver: only the deprecated call
    old.gpus[0].fabric = FakeFabric(clique_id=3)
    reader = _reader(old, monkeypatch)
    fabric = reader.read()[0].fabric
    assert fabric is not None
    assert (fabric["cluster_uuid"], fabric["state"], fabric["degraded_bw"], fabric["gfm"]) == (
        FakeFabric().cluster_uuid,
        "completed",
        None,
        None,
    )
    reader.close()


def test_a_gpu_that_does_not_answer_reports_nothing_then_comes_back(nvl72: tuple[FakeNvml, Nvml]) -> None:
    fake, reader = nvl72
    fake.gpus[1].lost = True
    readings = reader.read()
    assert readings[1].fabric is None and readings[0].fabric is not None  # nothing stale, the others unaffected
    fake.gpus[1].lost = False
    fabric = reader.read()[1].fabric
    assert fabric is not None and fabric["cluster_uuid"] == DOMAIN


# -- beside dcgm-exporter, which exports no fabric info (agents/nvml_fabric.py ExporterFabric) -----------------------


class _Exporter:
    """What dcgm-exporter gives the agent: GPU readings with the exporter's index and UUID labels, no fabric."""

    def __init__(self, uuids: dict[int, str]) -> None:
        self.uuids = uuids
        self.closed = False

    def read(self) -> list[GpuReading]:
        return [GpuReading(i, {"DCGM_FI_DEV_GPU_UTIL": 97.0}, uuid=u) for i, u in self.uuids.items()]

    def close(self) -> None:
        self.closed = True


def _beside_exporter(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, uuids: dict[int, str]) -> WithFabric:
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    fabric = open_exporter_fabric()
    assert fabric is not None
    return WithFabric(_Exporter(uuids), fabric)


def test_beside_the_exporter_each_gpu_gets_its_fabric_matched_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(4)
    for gpu in fake.gpus:
        gpu.fabric = FakeFabric(cluster_uuid=DOMAIN, clique_id=7)
    nvml_uuids = [f"GPU-0d6f4c1e-9a51-4c2b-8f7e-{i:012x}" for i in range(4)]  # the fake's UUIDs
    # The exporter leaves GPU 1 out and numbers the rest its own way: the UUID says which GPU is which.
    source = _beside_exporter(fake, monkeypatch, {0: nvml_uuids[0], 1: nvml_uuids[3], 2: "GPU-unknown"})
    fake.gpus[3].fabric = FakeFabric(cluster_uuid=DOMAIN, clique_id=7, degraded_bw=True)
    readings = source.read()
    fabrics = [r.fabric for r in readings]
    assert fabrics[0] is not None and fabrics[0]["degraded_bw"] is False
    assert fabrics[1] is not None and fabrics[1]["degraded_bw"] is True  # NVML's GPU 3
    assert fabrics[2] is not None and fabrics[2]["cluster_uuid"] == DOMAIN  # no such UUID: by its index
    assert readings[0].inventory()["fabric"]["cluster_uuid"] == DOMAIN
    # Read every period, not every sample; the last reading goes with every sample in between.
    source.read()
    assert fake.calls["nvmlDeviceGetGpuFabricInfoV"] == 4
    source.fabric.clock = lambda: 1e12
    fake.gpus[0].fabric = FakeFabric(cluster_uuid=DOMAIN, clique_id=7, gfm_connected=False)
    assert source.read()[0].fabric["gfm"] == "disconnected"  # type: ignore[index]
    source.close()
    assert fake.initialized == 0 and isinstance(source.source, _Exporter) and source.source.closed


def test_beside_the_exporter_no_fabric_lets_nvml_go(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(2)  # an HGX H100 board: every GPU answers NotSupported
    source = _beside_exporter(fake, monkeypatch, {0: "GPU-a", 1: "GPU-b"})
    assert [r.fabric for r in source.read()] == [None, None]
    assert fake.initialized == 0  # shut down for good after the first read
    source.fabric.clock = lambda: 1e12
    calls = fake.total_calls()
    assert [r.fabric for r in source.read()] == [None, None]
    assert fake.total_calls() == calls
    source.close()
    assert fake.initialized == 0


def test_beside_the_exporter_without_nvml_nothing_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` fails: no nvidia-ml-py, no driver
    assert open_exporter_fabric() is None
