"""Issue 27's pieces below the browser: the what-if form's controls, findings grouped with a sparkline, GPUs by
index, the cluster map grouped by rack where the inventory says, the evidence's numbers with their units."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.config import Settings
from service.incidents.schemas import FindingOut
from service.models import Gpu
from service.ui import formatting
from service.ui.views import policy_form
from service.ui.views.incident.finding_groups import FindingRow, group_findings, sparkline
from tests import rows


def test_each_policy_setting_gets_a_control_of_its_type_and_a_human_label() -> None:
    settings = Settings()
    fields = {f.name: f for f in policy_form.fields({n: getattr(settings, n) for n in policy_form.POLICY_SETTINGS})}
    assert fields["policy_mode"].kind == "select" and fields["policy_mode"].choices == ("act", "shadow", "approval")
    assert fields["policy_approval_required_for"].kind == "checkboxes"
    assert "reset_gpu" in fields["policy_approval_required_for"].choices
    assert fields["policy_reset_gpu_enabled"].kind == "checkbox" and fields["policy_reset_gpu_enabled"].value is True
    evict = fields["policy_evict_min_confidence"]
    # A share is typed as a percentage, as every page shows it (issue 40): 80 for the 0.8 in effect.
    assert (evict.kind, evict.bounds, evict.unit, evict.value) == (
        "number", {"step": "any", "min": "0", "max": "100"}, "%", 80,
    )  # fmt: skip
    assert fields["policy_max_evict_share_per_hour"].unit == "%"
    assert fields["policy_node_cooldown_s"].unit == "s"
    assert fields["policy_network_flap_count"].bounds["step"] == "1"
    assert all(f.label != f.name and "_" not in f.label for f in fields.values())


def test_a_cleared_checkbox_reads_false_through_its_hidden_twin() -> None:
    from starlette.datastructures import QueryParams

    assert policy_form.from_query(QueryParams("policy_reset_gpu_enabled=false"))["policy_reset_gpu_enabled"] == "false"
    both = QueryParams("policy_reset_gpu_enabled=false&policy_reset_gpu_enabled=true")
    assert policy_form.from_query(both)["policy_reset_gpu_enabled"] == "true"


def test_the_what_if_page_shows_labels_and_controls(ui) -> None:
    html = ui.get("/whatif").text
    assert "Evict at confidence of at least" in html and "<code" in html and "policy_evict_min_confidence" in html
    assert 'type="checkbox" name="policy_reset_gpu_enabled" value="true" checked' in html
    assert 'name="policy_reset_gpu_enabled" value="false"' in html
    answer = ui.get("/whatif", params={"run": "1", "policy_evict_min_confidence": "200"})
    assert answer.status_code == 422 and "policy_evict_min_confidence" in answer.text
    answer = ui.get("/whatif", params={"run": "1", "policy_evict_min_confidence": "most"})
    assert answer.status_code == 422 and "is not a percentage" in answer.text


def _finding(i: int, *, subject: str, at: datetime, confidence: float) -> FindingOut:
    return FindingOut(
        id=i, detector="counters", category="nvlink", subject_kind="gpu", subject=subject, node="g-node-1",
        confidence=confidence, blame="infrastructure", role="cause", action="evict", summary="NVLink errors",
        evidence={}, observed_at=at, created_at=at,
    )  # fmt: skip


def test_findings_group_by_detector_and_subject_with_the_first_and_latest_shown() -> None:
    now = datetime.now(UTC)
    out = [_finding(i, subject="g-node-1/3", at=now + timedelta(seconds=i), confidence=0.5 + i / 10) for i in range(5)]
    out.append(_finding(9, subject="g-node-1/4", at=now, confidence=0.9))
    groups = group_findings(
        FindingRow(finding=f, numbers=[], accuses=f.subject.endswith("/4"), subject=f.subject, summary=f.summary)
        for f in reversed(out)
    )
    assert [(g.subject, g.count) for g in groups] == [("g-node-1/4", 1), ("g-node-1/3", 5)]
    many = groups[1]
    assert [r.finding.id for r in (many.first, *many.middle, many.latest)] == [0, 1, 2, 3, 4]
    points = [tuple(map(float, p.split(","))) for p in many.spark.split()]
    assert len(points) == 5 and points[0][0] < points[-1][0] and points[0][1] > points[-1][1]  # rising confidence
    assert groups[0].spark == "" and sparkline(out[:1]) == ""


def test_gpus_by_index_where_the_inventory_knows_the_pci_address() -> None:
    names = formatting.GpuNames([("n1", 7, "00000000:DF:00.0")])
    assert names.subject("n1", "n1/0000:df:00") == "n1 GPU 7"
    assert names.subject("n1", "n1/3") == "n1 GPU 3"
    assert names.text("n1", "Xid 79 on n1 GPU 0000:df:00") == "Xid 79 on n1 GPU 7 (PCI 0000:df:00)"
    assert names.text("n2", "Xid 79 on n2 GPU 0000:df:00") == "Xid 79 on n2 GPU 0000:df:00"  # unknown: as it was
    summary = "gpu hardware: Xid 79 on n1 GPU 0000:df:00"
    assert names.text(None, summary) == "gpu hardware: Xid 79 on n1 GPU 7 (PCI 0000:df:00)"
    assert names.text(None, "Xid 79 on GPU 0000:df:00") == "Xid 79 on GPU 0000:df:00"  # no node named: as it was


def test_evidence_numbers_carry_units_and_no_exponent() -> None:
    pairs = dict(
        formatting.evidence_numbers(
            {"nvlink_tx_bytes": 7.036e10, "free_bytes": 3 * 2**30, "window_s": 30.0, "confidence": 0.62, "xid": 79,
             "tiny": 1.2e-7, "why": "skipped"},
            skip=("why",),
        )
    )  # fmt: skip
    assert pairs == {
        "nvlink tx bytes": "65.5 GiB/s",
        "free bytes": "3 GiB",
        "window s": "30 s",
        "confidence": "62%",
        "xid": "79",
        "tiny": "0.00000012",
    }


def test_the_cluster_map_groups_by_rack_where_nodes_say_and_lists_those_that_need_a_look(ui, session) -> None:
    for i in range(6):
        rows.node(session, f"rk-node-{i:04d}", labels={"rack": f"r{i // 3}"}, state="evicted" if i == 4 else "healthy")
    rows.node(session, "rk-other")
    session.add(Gpu(node_id=rows.node(session, "rk-gpu").id, index=0))
    session.flush()
    by_job = ui.get("/").text
    assert 'href="/?group=rack"' in by_job and 'href="/?group=switch"' not in by_job
    assert 'id="map-attention"' in by_job and ">rk-node-0004</a>" in by_job.split('id="map-attention"')[1]
    by_rack = ui.get("/", params={"group": "rack"}).text
    assert 'rack <span class="mono">r0</span>' in by_rack and 'rack <span class="mono">r1</span>' in by_rack
    assert "no rack label" in by_rack
    # Named tiles: the part of the name that differs, whole numbers kept.
    assert ">0004</a>" in by_rack
    assert ui.get("/", params={"group": "aisle"}).status_code == 422


def test_gpu_names_for_a_page_show_the_index_with_the_address_on_hover_and_escape_the_rest() -> None:
    names = formatting.GpuNames([("n1", 7, "00000000:DF:00.0")])
    html = str(names.html("n1", "<b>Xid 79</b> on n1 GPU 0000:df:00"))
    assert html == '&lt;b&gt;Xid 79&lt;/b&gt; on n1 <span class="gpu" title="PCI 0000:df:00">GPU 7</span>'
    # A reason already written with both (a decision's, stored since) reads the same way.
    assert str(names.html(None, "GPU 7 (PCI 0000:df:00)")) == '<span class="gpu" title="PCI 0000:df:00">GPU 7</span>'
    assert str(names.html("n2", "on n2 GPU 0000:df:00")) == "on n2 GPU 0000:df:00"  # unknown there: as it was
    assert str(names.html("n1", None)) == ""


def test_a_long_fault_shows_its_start_latest_and_strongest_with_the_rest_behind_toggles(ui, session) -> None:
    from service.models import Finding

    job = rows.job(session, "long-job")
    node = rows.node(session, "long-node-1")
    incident = rows.incident(session, job=job, suspects=[node.name])
    start = datetime.now(UTC) - timedelta(hours=1)
    for i in range(40):
        # Alternating detectors, so that no entry folds into the one before it.
        session.add(
            Finding(
                job_id=job.id, incident_id=incident.id, node_id=node.id, subject_kind="node", subject=node.name,
                role="cause", action="evict", dedup_key=f"long-{i}", detector=("counters", "signatures")[i % 2],
                category="gpu_hardware", confidence=0.6, summary=f"step {i} of a long fault",
                evidence={}, observed_at=start + timedelta(minutes=i),
            )
        )  # fmt: skip
    session.flush()
    ids = [f.id for f in session.query(Finding).filter(Finding.incident_id == incident.id).order_by(Finding.id)]
    incident.suspects = [
        {"node": node.name, "confidence": 0.99, "action": "evict", "reason": "a long fault", "finding_ids": ids}
    ]
    session.flush()
    html = ui.get(f"/incidents/{incident.id}").text
    # The suspect lists its strongest 4 findings, the other 36 behind a toggle.
    suspects = html[html.index('id="suspects"') : html.index("</section>", html.index('id="suspects"'))]
    assert f"36 more findings about {node.name}" in suspects
    assert suspects.split("<details", 1)[0].count('class="pill role-cause"') == 4
    timeline = html[html.index('id="timeline"') : html.index("</section>", html.index('id="timeline"'))]
    shown, hidden = timeline.split("<details>", 1)[0], timeline.split("<details>", 1)[1].split("</details>")[0]
    after = timeline.split("</details>", 1)[1]
    assert "more between them" in hidden
    assert "step 0 of a long fault" in shown and "step 39 of a long fault" in after  # how it began, the latest
    assert "step 20 of a long fault" in hidden and "step 20 of a long fault" not in shown + after
