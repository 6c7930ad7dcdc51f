"""ml/nvlink_domains.py: a domain's verdict from its trays' fabric info, fabric manager and NVLink findings."""

from __future__ import annotations

from ml.nvlink_domains import GpuFabric, Tray, cliques, gpu_trouble, judge, tray_trouble, usable

DOMAIN = "6a7c1f3e-2b5d-4e8f-9a01-3c4d5e6f7a8b"


def _gpu(index: int, **over: object) -> GpuFabric:
    values: dict[str, object] = {"clique_id": 7, "state": "completed", "status": 0, "health": "healthy"}
    values |= {"degraded_bw": False, "gfm": "connected"} | over
    return GpuFabric(index, DOMAIN, **values)  # type: ignore[arg-type]


def _tray(name: str, *gpus: GpuFabric, **over: object) -> Tray:
    return Tray(name, gpus or tuple(_gpu(i) for i in range(4)), **over)  # type: ignore[arg-type]


def test_a_healthy_domain_has_no_trouble() -> None:
    trays = [_tray(f"t{i}") for i in range(18)]
    verdict = judge(trays)
    assert (verdict.level, verdict.troubled, verdict.switch_side) == ("none", {}, [])
    assert all(usable(t) for t in trays)
    assert cliques(trays) == {7: [f"t{i}" for i in range(18)]}


def test_what_a_gpus_fabric_info_says_is_wrong() -> None:
    assert gpu_trouble(_gpu(0)) == []
    assert gpu_trouble(_gpu(1, state="in_progress")) == ["GPU 1 fabric registration in_progress"]
    assert gpu_trouble(_gpu(2, status=3)) == ["GPU 2 fabric status 3"]
    assert gpu_trouble(_gpu(3, health="limited_capacity", degraded_bw=True)) == [
        "GPU 3 fabric limited_capacity",
        "GPU 3 NVLink bandwidth degraded",
    ]
    # What the driver does not say is no trouble.
    assert gpu_trouble(GpuFabric(0, DOMAIN)) == []


def test_one_tray_is_the_trays_own_fault() -> None:
    trays = [_tray(f"t{i}") for i in range(18)]
    trays[4] = _tray("t4", nvlink_findings=3)
    verdict = judge(trays)
    assert verdict.level == "tray" and list(verdict.troubled) == ["t4"]
    assert "t4" in verdict.summary and not usable(trays[4])


def test_several_trays_at_once_is_the_switch_side() -> None:
    trays = [_tray(f"t{i}") for i in range(18)]
    trays[1] = _tray("t1", nvlink_findings=1)
    trays[9] = _tray("t9", _gpu(0, degraded_bw=True), _gpu(1), _gpu(2), _gpu(3))
    verdict = judge(trays)
    assert verdict.level == "domain" and sorted(verdict.troubled) == ["t1", "t9"]
    assert verdict.switch_side == ["fabric trouble on 2 of 18 trays at once"]
    assert judge(trays, min_trays=3).level == "tray"


def test_the_fabric_manager_degraded_is_the_switch_side() -> None:
    trays = [_tray(f"t{i}") for i in range(4)]
    trays[2] = _tray("t2", fabric_manager="stopped")
    verdict = judge(trays, min_trays=3)
    assert verdict.level == "domain" and verdict.switch_side == ["fabric manager stopped on t2"]
    assert tray_trouble(trays[2]) == ["fabric manager stopped"]
    # The global fabric manager cut off from most trays; from one tray only, that tray's management link.
    cut = [_tray(f"c{i}", *(_gpu(g, gfm="disconnected") for g in range(4))) for i in range(3)]
    verdict = judge([*cut, _tray("ok")], min_trays=5)
    assert verdict.switch_side == ["global fabric manager disconnected from 3 of 4 trays"]
    assert judge([cut[0], *(_tray(f"ok{i}") for i in range(3))], min_trays=5).level == "tray"
