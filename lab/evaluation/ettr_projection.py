"""The projected ETTR of a large job at a real fault rate, from a campaign's measured times (issue 44, point 5).

The campaign squeezes a fault into every few minutes of a small job, so its own ETTR mostly says how often it
injects. What carries over to a real job is what each fault cost until the loop acted: the service's detection
and decision, and the loop's act. This module prices a 16,384-GPU job's interruptions at Llama 3 405B's rate with
those measured times, adds what a restart costs at that size (assumed, configurable) and reports where the lost
time goes. Pure arithmetic on plain data: no database, no settings.

Source of the fault rate and mix: Meta, "The Llama 3 Herd of Models" (2024), section 3.3.4, Table 5 ("Root-cause
categorization of unexpected interruptions during a 54-day period of Llama 3 405B pre-training"): 419 unexpected
interruptions on 16,384 H100 GPUs in 54 days. The table's interruption counts are used (they add up to 419); its
percentage column does not match count / 419 (148 / 419 is 35.3%, printed 30.1%), so the counts are the rate.

Per interruption of a table row, lost training time =
    detection + decision + acted          measured: the campaign's faults of the row's category (their mean)
  + waiting for a spare + restart         assumed (Assumptions)
  + recomputation                         assumed: half a checkpoint interval (a fault lands uniformly in one)
and the checkpoints' own pauses cost `checkpoint_save_s` per interval of the time left (0: asynchronous saves).

Measured per campaign fault (simulated seconds from its injection):
- detection: until the first incident of its job the harness saw opened (at or after the injection);
- decision: from there until the decision its kind expects on its machine; for a fault with none (a user's bug,
  a planned drain, a miss) until a person dealt with it as the campaign plays them (the user's restart after
  USER_FIX_S, an operator's drain, the by-hand drain after FAULT_TIMEOUT_S), so a miss costs what it cost there;
- acted: from the decision until the loop (the scheduler) acted on it.
A row whose category the campaign did not draw uses the mean over every fault the campaign drew (and says so).
Every row is counted as a full stop of the job: a straggler's slow steps are charged as if the job had stopped
(an upper bound on its cost).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import fmean
from typing import Any

from lab.evaluation import campaign_scoring as scoring

DAY_S = 86400.0
SOURCE = (
    'Meta, "The Llama 3 Herd of Models" (2024), Table 5: 419 unexpected interruptions in 54 days of Llama 3 405B '
    "pre-training on 16,384 H100 GPUs"
)

# Table 5's rows: (component, interruptions in 54 days, the campaign's category that stands for it: lab/sim/mix.py).
LLAMA3_TABLE5: tuple[tuple[str, int, str], ...] = (
    ("Faulty GPU", 148, "faulty_gpu"),
    ("GPU HBM3 Memory", 72, "hbm3"),
    ("Software Bug", 54, "software_bug"),
    ("Network Switch/Cable", 35, "network_switch_cable"),
    ("Host Maintenance", 32, "host_maintenance"),
    ("GPU SRAM Memory", 19, "gpu_sram"),
    ("GPU System Processor", 17, "gpu_system_processor"),
    ("NIC", 7, "nic"),
    ("NCCL Watchdog Timeouts", 7, "nccl_watchdog"),
    ("Silent Data Corruption", 6, "silent_data_corruption"),
    ("GPU Thermal Interface + Sensor", 6, "gpu_thermal"),
    ("SSD", 3, "other"),
    ("Power Supply", 3, "other"),
    ("Server Chassis", 2, "other"),
    ("IO Expansion Board", 2, "other"),
    ("Dependency", 2, "other"),
    ("CPU", 2, "other"),
    ("System Memory", 2, "other"),
)

PARTS = ("detection", "decision", "acted", "spare_wait", "restart", "recomputation", "checkpoint_saves")
MEASURED_PARTS = ("detection", "decision", "acted")


@dataclass(frozen=True)
class Assumptions:
    """What the projection assumes rather than measures; each is a flag of `faultline eval --project-ettr`."""

    gpus: int = 16_384
    interruptions: int = 419  # in `days`: Llama 3's rate
    days: float = 54.0
    # As the campaign's jobs (lab/sim/realism.py checkpoint_every_s); a fault loses half of one on average.
    checkpoint_interval_s: float = 300.0
    checkpoint_save_s: float = 0.0  # each save's pause of training; 0: saved asynchronously (ByteRobust, Llama 3)
    # A 16k-GPU job's relaunch: processes, communicator set-up (MegaScale brought a 10k-GPU job's below 30 s) and
    # loading the checkpoint. Neither Llama 3 nor ByteRobust publishes one figure: an assumption.
    restart_s: float = 120.0
    spare_wait_s: float = 0.0  # warm standbys sized for the job (ml/spares.py): a spare is on hand


@dataclass(frozen=True)
class FaultTimes:
    """One campaign fault's measured times, in simulated seconds."""

    category: str
    detection_s: float
    decision_s: float
    acted_s: float

    @property
    def total_s(self) -> float:
        return self.detection_s + self.decision_s + self.acted_s


def fault_times(
    faults: Sequence[scoring.FaultOutcome],
    decisions: Sequence[scoring.DecisionRow],
    incidents: Sequence[scoring.IncidentRow],
) -> list[FaultTimes]:
    """Each (not shared-cause) fault's detection, decision and act times, as the module's docstring defines them."""
    verdicts, _ = scoring.judge(faults, decisions)
    out = []
    for v in verdicts:
        f = v.fault
        if f.component_kind:
            continue  # a component's fault is not a row of Table 5 (its machines are counted per machine there)
        to_action = max(0.0, f.dealt_s - f.injected_s)
        decided = min(v.decision_s, to_action) if v.decision_s is not None else to_action
        seen = [
            i.first_seen_s - f.injected_s
            for i in incidents
            if i.job_id == f.job_id and f.injected_s - scoring.CLOCK_SLACK_S <= i.first_seen_s <= f.dealt_s
        ]
        detected = min(max(0.0, min(seen)), decided) if seen else decided
        out.append(FaultTimes(f.category, detected, decided - detected, to_action - decided))
    return out


def mean_times(times: Iterable[FaultTimes]) -> dict[str, dict[str, float]]:
    """Category -> its faults' count and mean detection, decision and act times; "all" over every fault."""
    times = list(times)
    groups: dict[str, list[FaultTimes]] = {"all": times}
    for t in times:
        groups.setdefault(t.category, []).append(t)
    return {
        name: {
            "faults": len(ts),
            "detection_s": round(fmean(t.detection_s for t in ts), 1),
            "decision_s": round(fmean(t.decision_s for t in ts), 1),
            "acted_s": round(fmean(t.acted_s for t in ts), 1),
        }
        for name, ts in groups.items()
        if ts
    }


def project(measured: Mapping[str, Mapping[str, float]], assumptions: Assumptions = Assumptions()) -> dict[str, Any]:
    """The projected ETTR and where the lost time goes, from per-category mean times (`mean_times`)."""
    a = assumptions
    if "all" not in measured:
        raise ValueError("no campaign fault to measure the times from")
    wall_s = a.days * DAY_S
    per_fault = {
        "spare_wait": a.spare_wait_s,
        "restart": a.restart_s,
        "recomputation": a.checkpoint_interval_s / 2,
    }
    lost = dict.fromkeys(PARTS, 0.0)
    rows = []
    for component, count, category in LLAMA3_TABLE5:
        m = measured.get(category)
        source = category if m is not None else "all"
        m = m if m is not None else measured["all"]
        each = {"detection": m["detection_s"], "decision": m["decision_s"], "acted": m["acted_s"], **per_fault}
        for part, s in each.items():
            lost[part] += count * s
        rows.append(
            {
                "component": component,
                "interruptions": count,
                "category": category,
                "times_from": source,  # the category's own campaign faults, or "all" when it drew none
                "campaign_faults": int(measured[source]["faults"]),
                "lost_per_interruption_s": round(sum(each.values()), 1),
            }
        )
    interruptions = sum(count for _, count, _ in LLAMA3_TABLE5)
    # Scaled to the rate assumed (the table's rows add up to 419; a different count keeps the table's mix).
    scale = a.interruptions / interruptions
    lost = {part: s * scale for part, s in lost.items()}
    stopped = sum(lost.values())
    # The saves pause what training is left once the interruptions are taken out.
    saves = a.checkpoint_save_s / a.checkpoint_interval_s if a.checkpoint_interval_s > 0 else 0.0
    lost["checkpoint_saves"] = max(0.0, wall_s - stopped) * saves
    total = sum(lost.values())
    return {
        "source": SOURCE,
        "assumptions": asdict(a),
        "measured_parts": list(MEASURED_PARTS),
        "assumed_parts": [p for p in PARTS if p not in MEASURED_PARTS],
        "measured": {k: dict(v) for k, v in measured.items()},
        "hours_between_interruptions": round(wall_s / a.interruptions / 3600, 2) if a.interruptions else None,
        "lost_per_interruption_s": round(stopped / a.interruptions, 1) if a.interruptions else 0.0,
        "lost_h": {part: round(s / 3600, 2) for part, s in lost.items()},
        "lost_share": {part: round(s / wall_s, 5) for part, s in lost.items()},
        "ettr": round(max(0.0, 1 - total / wall_s), 4),
        "rows": rows,
    }


def project_report(report: Mapping[str, Any], assumptions: Assumptions = Assumptions()) -> dict[str, Any] | None:
    """The projection from a campaign's report (a fresh one or its saved JSON); None when it has no fault."""
    faults = [
        scoring.FaultOutcome(
            **{**f, "stale_incidents": tuple(f.get("stale_incidents", ())), "members": tuple(f.get("members", ()))}
        )
        for f in report.get("faults", [])
    ]
    times = fault_times(
        faults,
        [scoring.DecisionRow(**d) for d in report.get("decisions", [])],
        [scoring.IncidentRow(**i) for i in report.get("incidents", [])],
    )
    if not times:
        return None
    return project(mean_times(times), assumptions)


def format_projection(p: Mapping[str, Any]) -> str:
    a = p["assumptions"]
    lost, share = p["lost_h"], p["lost_share"]
    names = {
        "detection": "detection (measured)",
        "decision": "decision (measured)",
        "acted": "the loop acted (measured)",
        "spare_wait": f"waiting for a spare (assumed {a['spare_wait_s']:g} s)",
        "restart": f"restart (assumed {a['restart_s']:g} s)",
        "recomputation": f"recomputation (assumed: half of a {a['checkpoint_interval_s']:g} s checkpoint interval)",
        "checkpoint_saves": f"checkpoint saves (assumed {a['checkpoint_save_s']:g} s each)",
    }
    lines = [
        f"projected ETTR of a {a['gpus']:,}-GPU job at Llama 3's rate ({a['interruptions']} interruptions in "
        f"{a['days']:g} days, one every {p['hours_between_interruptions']} h): {p['ettr']:.4f}; "
        f"{p['lost_per_interruption_s']:.0f} s lost per interruption",
        f"  {'where the lost time goes':<72} {'hours':>7} {'share':>7}",
    ]
    lines += [f"  {names[k]:<72} {lost[k]:>7.2f} {100 * share[k]:>6.2f}%" for k in PARTS]
    lines.append(
        f"  {'Table 5 row':<31} {'count':>5} {'times from':>24} {'faults':>6} {'det s':>6} {'dec s':>6} "
        f"{'act s':>6} {'lost s':>7}"
    )
    for r in p["rows"]:
        m = p["measured"][r["times_from"]]
        lines.append(
            f"  {r['component']:<31} {r['interruptions']:>5} {r['times_from']:>24} {r['campaign_faults']:>6} "
            f"{m['detection_s']:>6.0f} {m['decision_s']:>6.0f} {m['acted_s']:>6.0f} "
            f"{r['lost_per_interruption_s']:>7.0f}"
        )
    lines.append(f"  source: {p['source']}")
    return "\n".join(lines)
