"""Stack aggregation: normalization, grouping, culprit localization with parallel groups, rounds, findings."""

from __future__ import annotations

import json
import random
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from lab.bench import stacks as bench_stacks
from ml import parallel
from ml.findings import JobInfo, StackSample
from ml.stacks import (
    MAX_TREE_DEPTH,
    analyze,
    analyze_rounds,
    classify,
    findings,
    main_thread_frames,
    normalize_frame,
    rank_ranges,
    round_findings,
)
from tests import paths
from tests.stored import check_evidence

FIXTURES = paths.FIXTURES / "stacks"
NOW = datetime(2025, 1, 1, tzinfo=UTC)
SITE = ("/usr/local/lib/python3.11/site-packages/", "/home/alice/.venv/lib/python3.11/site-packages/")
STD = ("/usr/lib/python3.11/", "/opt/conda/lib/python3.11/")

# Stacks outermost first as (function, file); files under torch/, megatron/ are packages, .py at top the app.
ENTRY = [("<module>", "train.py"), ("main", "train.py"), ("train_step", "train.py")]
ALL_REDUCE = [
    *ENTRY,
    ("wrapper", "torch/distributed/c10d_logger.py"),
    ("all_reduce", "torch/distributed/distributed_c10d.py"),
]
ALL_GATHER = [
    *ENTRY,
    ("gather_logits", "model.py"),
    ("all_gather_into_tensor", "torch/distributed/distributed_c10d.py"),
]
DATA = [
    *ENTRY,
    ("__next__", "torch/utils/data/dataloader.py"),
    ("_next_data", "torch/utils/data/dataloader.py"),
    ("_get_data", "torch/utils/data/dataloader.py"),
    ("get", "queue.py"),
    ("wait", "threading.py"),
]
COMPUTE = [
    *ENTRY,
    ("_wrapped_call_impl", "torch/nn/modules/module.py"),
    ("_call_impl", "torch/nn/modules/module.py"),
    ("forward", "model.py"),
]
SCHEDULE = [
    *ENTRY,
    ("forward_backward_pipelining_without_interleaving", "megatron/core/pipeline_parallel/schedules.py"),
]
RECV_FORWARD = [
    *SCHEDULE,
    ("recv_forward", "megatron/core/pipeline_parallel/p2p_communication.py"),
    ("_communicate", "megatron/core/pipeline_parallel/p2p_communication.py"),
]


def _path(path: str, variant: int) -> str:
    if path.startswith(("torch/", "megatron/")):
        return SITE[variant % 2] + path
    if path in ("queue.py", "threading.py", "contextlib.py"):
        return STD[variant % 2] + path
    return f"/mnt/job-{variant}/src/{path}"  # each machine has its own checkout directory


def frames(spec: list[tuple[str, str]], *, variant: int = 0, jitter: int = 0) -> list[dict[str, Any]]:
    """py-spy JSON frames, innermost first, as `py-spy dump --json` prints them."""
    out = []
    for depth, (name, path) in enumerate(reversed(spec)):
        out.append(
            {
                "name": name,
                "filename": _path(path, variant),
                "module": None,
                "short_filename": path,
                "line": 10 + depth + jitter,
                "locals": None,
                "is_entry": depth == len(spec) - 1,
                "is_shim_entry": False,
            }
        )
    return out


def sample(rank: int, node: str, spec: list[tuple[str, str]] | None, **kw: Any) -> StackSample:
    threads = []
    if spec is not None:
        main = {"pid": 100 + rank, "thread_id": 7 + rank, "thread_name": "MainThread", "os_thread_id": 100 + rank}
        threads = [{**main, "active": False, "owns_gil": False, "frames": frames(spec, **kw)}]
    return StackSample(rank=rank, node=node, pid=100 + rank, threads=threads, id=1000 + rank)


def make_job(world: int, per_node: int, **kw: Any) -> JobInfo:
    return JobInfo("job-1", world_size=world, rank_nodes={r: f"node-{r // per_node}" for r in range(world)}, **kw)


def snapshot(job: JobInfo, specs: dict[int, list[tuple[str, str]] | None], default: list[tuple[str, str]]):
    """One sample per rank of the job: `specs` overrides the default stack (None: py-spy failed)."""
    out = []
    for rank, node in sorted(job.rank_nodes.items()):
        spec = specs.get(rank, default)
        out.append(sample(rank, node, spec, variant=rank, jitter=rank % 5))
    return out


# --- normalization and grouping ----------------------------------------------------------------------------


def test_normalization_drops_lines_prefixes_addresses_and_numbering() -> None:
    a = {"name": "<lambda_3>", "filename": SITE[0] + "torch/x.py", "line": 10, "module": None}
    b = {"name": "<lambda_17>", "filename": SITE[1] + "torch/x.py", "line": 99, "module": None}
    assert normalize_frame(a) == normalize_frame(b) == ("<lambda>", "torch/x.py")
    native = {"name": "ncclProxyProgress 0x7f3a1c2b", "filename": "", "module": "/usr/lib/libnccl.so.2"}
    assert normalize_frame(native) == ("ncclProxyProgress 0x?", "libnccl.so.2")
    stdlib = {"name": "wait", "filename": "/opt/conda/lib/python3.10/threading.py", "module": None}
    assert normalize_frame(stdlib) == ("wait", "threading.py")
    hashes = [("a", "4f2a9b81c7d"), ("b", "9e01c3d4b2a")]
    generated = [{"name": "call", "filename": f"/tmp/torchinductor_{u}/cq/cq{h}.py"} for u, h in hashes]
    assert normalize_frame(generated[0]) == normalize_frame(generated[1]) == ("call", "cq#.py")


def test_line_numbers_and_install_paths_do_not_split_groups() -> None:
    job = make_job(16, 8)
    analysis = analyze(job, snapshot(job, {}, ALL_REDUCE))  # every rank: other prefix, checkout, lines
    assert len(analysis.groups) == 1
    assert analysis.groups[0].count == 16 and analysis.groups[0].ranks == "0-15"
    assert analysis.groups[0].state == "collective"
    assert analysis.groups[0].nodes == ["node-0", "node-1"]
    assert analysis.groups[0].frames[0] == "all_reduce (torch/distributed/distributed_c10d.py)"
    # Nothing stands apart: no machine is named, the finding asks for a diagnosis of the job.
    assert analysis.method == "inconclusive" and not analysis.suspects
    (finding,) = findings(job, analysis, observed_at=NOW)
    check_evidence([finding])
    assert finding.subject_kind == "job" and finding.action == "diagnose" and finding.subject == "job-1"


def test_different_functions_split_groups_and_ranks_are_ranges() -> None:
    job = make_job(16, 8)
    analysis = analyze(job, snapshot(job, {7: COMPUTE, 12: COMPUTE}, ALL_REDUCE))
    assert [(g.ranks, g.count, g.state) for g in analysis.groups] == [
        ("0-6,8-11,13-15", 14, "collective"),
        ("7,12", 2, "compute"),
    ]
    assert analysis.groups[1].op == "forward (model.py)"
    assert rank_ranges([5, 1, 2, 3, 9, 10]) == "1-3,5,9-10"


@pytest.mark.parametrize(
    ("spec", "state"),
    [
        (ALL_REDUCE, "collective"),
        (DATA, "data"),
        (COMPUTE, "compute"),
        (RECV_FORWARD, "collective"),
        ([*ENTRY, ("save_checkpoint", "ckpt.py"), ("wait", "threading.py")], "other"),
        ([*ENTRY, ("synchronize", "torch/cuda/__init__.py")], "compute"),
        ([*ENTRY, ("barrier", "deepspeed/comm/comm.py")], "collective"),
    ],
)
def test_state_from_innermost_meaningful_frame(spec: list[tuple[str, str]], state: str) -> None:
    normalized = [normalize_frame(f) for f in frames(spec)]
    assert classify(normalized).state == state


# --- localization ------------------------------------------------------------------------------------------


def test_rank_in_data_loading_while_rest_all_reduce_names_its_machine() -> None:
    job = make_job(32, 8, tp=8)
    analysis = analyze(job, snapshot(job, {19: DATA}, ALL_REDUCE))
    assert analysis.method == "named"
    assert analysis.culprit_ranks == [19]
    assert analysis.culprit_state == "data"
    assert [(node, conf) for node, conf, _ in analysis.suspects] == [("node-2", 0.9)]
    assert "rank 19 in data loading" in analysis.suspects[0][2]
    assert analysis.culprit_frames[0] == "wait (threading.py)"


def test_real_pyspy_dumps_of_a_hung_gloo_job() -> None:
    data = json.loads((FIXTURES / "pyspy_hang_dataloading_gloo4.json").read_text())
    job = JobInfo("gloo4", world_size=4, rank_nodes={d["rank"]: d["node"] for d in data["dumps"]})
    stacks = [StackSample(d["rank"], d["node"], d["pid"], d["threads"], id=i) for i, d in enumerate(data["dumps"])]
    analysis = analyze(job, stacks)
    assert analysis.dominant_state == "collective"
    assert analysis.groups[0].ranks == "0-2" and analysis.groups[0].op.startswith("all_reduce (")
    assert analysis.culprit_ranks == [3] and analysis.culprit_state == "data"
    assert analysis.culprit_frames[0] == "_stuck_in_data_loading (train.py)"
    assert analysis.method == "named" and [s[0] for s in analysis.suspects] == ["vnode-1"]
    assert analysis.tree["count"] == 4


def test_missing_stack_is_the_culprit_when_everyone_else_waits() -> None:
    job = make_job(16, 4)
    analysis = analyze(job, snapshot(job, {9: None}, ALL_REDUCE))
    assert analysis.culprit_ranks == [9] and analysis.culprit_state == "no_stack"
    assert analysis.method == "named" and [s[0] for s in analysis.suspects] == ["node-2"]
    assert analysis.suspects[0][1] < 0.9  # a failed dump is weaker evidence than a rank seen elsewhere
    assert any(g.state == "no_stack" and g.ranks == "9" for g in analysis.groups)


def test_failed_dump_elsewhere_does_not_dilute_a_rank_seen_elsewhere() -> None:
    job = make_job(16, 4)
    analysis = analyze(job, snapshot(job, {5: DATA, 14: None}, ALL_REDUCE))
    assert analysis.culprit_ranks == [5]
    assert [s[0] for s in analysis.suspects] == ["node-1"]


def test_pipeline_recv_whose_sender_never_arrived_names_the_sender() -> None:
    # tp=2, dp=2, pp=4 (stride 4 between stages); two ranks per machine: a TP pair shares one.
    job = make_job(16, 2, tp=2, pp=4)
    analysis = analyze(job, snapshot(job, {8: RECV_FORWARD, 9: RECV_FORWARD}, ALL_REDUCE))
    # Stage 2's TP pair waits for activations from stage 1 (ranks 4, 5), which went on to the all-reduce.
    assert analysis.culprit_ranks == [4, 5]
    assert analysis.method == "named" and [s[0] for s in analysis.suspects] == ["node-2"]
    assert "ranks 8-9 wait in _communicate for pipeline peers that never came: ranks 4-5" in analysis.suspects[0][2]


def test_recv_backward_points_at_the_next_stage() -> None:
    job = make_job(16, 2, tp=2, pp=4)
    recv_backward = [*SCHEDULE, ("recv_backward", "megatron/core/pipeline_parallel/p2p_communication.py")]
    analysis = analyze(job, snapshot(job, {4: recv_backward, 5: recv_backward}, ALL_REDUCE))
    assert analysis.culprit_ranks == [8, 9]
    assert [s[0] for s in analysis.suspects] == ["node-4"]


def test_tensor_parallel_peer_that_skipped_the_collective() -> None:
    # tp=4 over two machines (2 ranks each): ranks 4, 5, 6 wait in a TP all-gather, rank 7 went on.
    job = make_job(16, 2, tp=4)
    analysis = analyze(job, snapshot(job, {4: ALL_GATHER, 5: ALL_GATHER, 6: ALL_GATHER}, ALL_REDUCE))
    assert analysis.culprit_ranks == [7]
    assert [s[0] for s in analysis.suspects] == ["node-3"]


def test_whole_group_stuck_in_its_collective_names_its_machine() -> None:
    job = make_job(16, 4, tp=4)
    analysis = analyze(job, snapshot(job, {r: ALL_GATHER for r in (8, 9, 10, 11)}, ALL_REDUCE))
    assert analysis.culprit_ranks == [8, 9, 10, 11]
    assert analysis.method == "named" and [s[0] for s in analysis.suspects] == ["node-2"]


def test_culprits_on_two_machines_fall_back_to_the_smallest_covering_group() -> None:
    # tp=2, dp=2, pp=4, two ranks per machine. Ranks 0 and 4 (stages 0 and 1, same TP and DP index) are
    # elsewhere; their TP peers 1 and 5 are not, so the machines are not wholly down.
    job = make_job(16, 2, tp=2, pp=4)
    analysis = analyze(job, snapshot(job, {0: COMPUTE, 4: DATA}, ALL_REDUCE))
    assert analysis.method == "group_fallback"
    assert analysis.covering_group == ("pp", [0, 4, 8, 12])
    names = [s[0] for s in analysis.suspects]
    assert names[:2] == ["node-0", "node-2"] and sorted(names[2:]) == ["node-4", "node-6"]
    confidences = dict((s[0], s[1]) for s in analysis.suspects)
    assert confidences["node-0"] == confidences["node-2"] == 0.7 > confidences["node-4"]
    found = findings(job, analysis, observed_at=NOW)
    check_evidence(found)
    assert {f.subject for f in found} == {"node-0", "node-2", "node-4", "node-6"}
    assert all(f.confidence < 0.9 for f in found)
    assert found[0].evidence["covering_group"] == {"dim": "pp", "ranks": "0,4,8,12"}


def test_two_whole_machines_without_stacks_are_both_named() -> None:
    job = make_job(32, 2, tp=2, pp=4)
    analysis = analyze(job, snapshot(job, {6: None, 7: None, 22: None, 23: None}, ALL_REDUCE))
    assert analysis.method == "named"
    assert sorted(s[0] for s in analysis.suspects) == ["node-11", "node-3"]


def test_outliers_spread_over_unrelated_groups_are_inconclusive() -> None:
    job = make_job(64, 8, tp=2, pp=4)
    analysis = analyze(job, snapshot(job, {0: COMPUTE, 13: COMPUTE, 38: DATA, 63: COMPUTE}, ALL_REDUCE))
    assert analysis.method == "inconclusive" and not analysis.suspects
    assert analysis.culprit_ranks == [0, 13, 38, 63]
    (finding,) = findings(job, analysis, observed_at=NOW)
    assert finding.subject_kind == "job" and finding.action == "diagnose" and finding.confidence < 0.5


def test_odd_input_is_skipped_not_raised() -> None:
    job = make_job(8, 4)
    junk = [
        StackSample(rank=0, node="node-0", pid=1, threads="not a list"),  # type: ignore[arg-type]
        StackSample(rank=1, node="node-0", pid=1, threads=[None, {"frames": None}, {"frames": [None, 3]}]),
        StackSample(rank=-4, node="node-0", pid=1, threads=[]),
        StackSample(rank=2, node="node-0", pid=1, threads=[{"frames": [{"name": ["x"], "filename": {}}]}]),
    ]
    analysis = analyze(job, junk + snapshot(job, {}, ALL_REDUCE)[3:])
    assert [(g.ranks, g.state) for g in analysis.groups] == [("3-7", "collective"), ("0-2", "no_stack")]
    assert analyze(job, []).method == "inconclusive"
    assert findings(job, analyze(JobInfo("empty"), []), observed_at=NOW) == []


def test_main_thread_is_chosen_whatever_the_order() -> None:
    # Threads as in tests/fixtures/logs/pyspy_dump_multithread_mlengineering.txt, in py-spy's JSON shape.
    def thread(name: str | None, os_id: int, spec: list[tuple[str, str]]) -> dict[str, Any]:
        return {"pid": 42, "thread_id": os_id * 16, "thread_name": name, "os_thread_id": os_id, "frames": frames(spec)}

    dispatcher = [
        ("_bootstrap", "threading.py"),
        ("_bootstrap_inner", "threading.py"),
        ("run", "threading.py"),
        ("__call__", "pubsub_v1/subscriber/_protocol/helper_threads.py"),
        ("_get_many", "pubsub_v1/subscriber/_protocol/helper_threads.py"),
        ("get", "queue.py"),
        ("wait", "threading.py"),
    ]
    main = [("<module>", "slurmeventd.py"), ("main", "slurmeventd.py"), ("result", "concurrent/futures/_base.py")]
    threads = [thread("Thread-CallbackRequestDispatcher", 43, dispatcher), thread("MainThread", 42, main)]
    named = StackSample(0, "n", 42, threads)
    assert main_thread_frames(named)[0]["name"] == "result"
    unnamed = StackSample(0, "n", 42, [thread(None, 43, dispatcher), thread(None, 42, main)])
    assert main_thread_frames(unnamed)[0]["name"] == "result"  # the thread whose OS id is the pid
    assert main_thread_frames(StackSample(0, "n", 42, [])) is None


def test_merged_tree_is_small_and_keeps_the_outlier_branch() -> None:
    job = make_job(1024, 8)
    deep = [*ENTRY, *[(f"layer_{i}", "model.py") for i in range(60)], ("forward", "model.py")]
    rng = random.Random(1)
    collective = ("all_reduce", "torch/distributed/distributed_c10d.py")
    specs = {r: [*ENTRY, (f"helper_{rng.randrange(40)}", "util.py"), collective] for r in range(0, 1024, 50)}
    specs[777] = deep
    analysis = analyze(job, snapshot(job, specs, ALL_REDUCE))
    assert analysis.culprit_ranks == [777]

    def depth(node: dict[str, Any]) -> int:
        return 1 + max((depth(c) for c in node["children"]), default=0)

    def names(node: dict[str, Any]) -> list[str]:
        return [node["name"], *(n for c in node["children"] for n in names(c))]

    tree = analysis.tree
    assert tree["count"] == 1024 and set(tree) == {"name", "count", "children"}
    assert depth(tree) <= MAX_TREE_DEPTH + 1
    assert "forward (model.py)" in names(tree)  # the culprit's branch survives, with count 1
    assert not any(n.startswith("helper_") for n in names(tree))  # 1-rank branches of victims are folded
    assert any(n.startswith("(other") for n in names(tree))
    assert len(json.dumps(tree)) < 20_000


# --- findings ----------------------------------------------------------------------------------------------


def test_findings_content_and_stable_keys() -> None:
    job = make_job(64, 8, tp=8)
    stacks = snapshot(job, {42: DATA, 3: None}, ALL_REDUCE)
    analysis = analyze(job, stacks)
    (finding,) = findings(job, analysis, observed_at=NOW)
    check_evidence([finding])
    assert (finding.detector, finding.category, finding.subject_kind) == ("stacks", "hang", "node")
    assert (finding.subject, finding.node, finding.action) == ("node-5", "node-5", "evict")
    assert (finding.role, finding.blame, finding.confidence) == ("cause", "infrastructure", 0.9)
    assert finding.observed_at == NOW and "node-5" in finding.summary and "data loading" in finding.summary
    evidence = json.loads(json.dumps(finding.evidence))  # JSON-able
    assert evidence["method"] == "named" and evidence["culprit_ranks"] == "42"
    assert evidence["culprit_frames"][0] == "wait (threading.py)"
    # Only the outliers' stacks are referenced; the rest are counted.
    assert evidence["signals"] == [{"type": "stack", "id": 1042}, {"type": "stack", "id": 1003}]
    assert evidence["signals_omitted"] == 62
    assert evidence["groups"][0]["ranks"] == "0-2,4-41,43-63" and evidence["groups"][0]["count"] == 62
    assert evidence["tree"]["count"] == 64
    again = findings(job, analyze(job, list(reversed(stacks))), observed_at=datetime.now(UTC))
    assert again[0].key == finding.key
    other = findings(job, analyze(job, snapshot(job, {43: DATA}, ALL_REDUCE)), observed_at=NOW)
    assert other[0].key != finding.key and other[0].subject == "node-5"
    assert findings(job, analysis, observed_at=NOW, category="straggler")[0].category == "straggler"


# --- rounds (fail-slow) ------------------------------------------------------------------------------------


def _rounds(job: JobInfo, slow: set[int], out_in: set[int], noise: float, seed: int) -> list[list[StackSample]]:
    rng = random.Random(seed)
    rounds = []
    for k in range(5):
        specs = {r: COMPUTE for r in job.rank_nodes if rng.random() < noise}
        specs.update({r: COMPUTE for r in slow if k in out_in})
        rounds.append(snapshot(job, specs, ALL_REDUCE))
    return rounds


def test_rounds_find_the_machine_out_of_the_collective_in_most_rounds() -> None:
    job = make_job(64, 8, tp=8)
    result = analyze_rounds(job, _rounds(job, {26, 27}, out_in={0, 1, 3, 4}, noise=0.03, seed=3))
    assert result.stragglers == [26, 27]
    assert result.method == "named" and [s[0] for s in result.suspects] == ["node-3"]
    (finding,) = round_findings(job, result, observed_at=NOW)
    check_evidence([finding])
    assert (finding.category, finding.subject, finding.action) == ("straggler", "node-3", "evict")
    assert json.loads(json.dumps(finding.evidence))["rounds"] == 5
    assert finding.evidence["signals"][0]["type"] == "stack"


def test_noisy_healthy_job_gives_no_straggler() -> None:
    job = make_job(512, 8, tp=8)
    result = analyze_rounds(job, _rounds(job, set(), out_in=set(), noise=0.2, seed=5))
    assert result.stragglers == [] and result.method == "inconclusive"
    assert round_findings(job, result, observed_at=NOW) == []


def test_a_single_round_is_not_enough() -> None:
    job = make_job(16, 8)
    result = analyze_rounds(job, [snapshot(job, {3: COMPUTE}, ALL_REDUCE)])
    assert result.stragglers == [] and round_findings(job, result, observed_at=NOW) == []


def test_real_rounds_of_a_slow_rank_and_of_a_healthy_job() -> None:
    def load(name: str) -> tuple[JobInfo, list[list[StackSample]]]:
        data = json.loads((FIXTURES / f"pyspy_rounds_{name}_gloo4.json").read_text())
        rounds = [[StackSample(d["rank"], d["node"], d["pid"], d["threads"]) for d in r] for r in data["rounds"]]
        return JobInfo(name, world_size=4, rank_nodes={d.rank: d.node for d in rounds[0]}), rounds

    job, rounds = load("slow")
    result = analyze_rounds(job, rounds)
    assert result.stragglers == [2] and [s[0] for s in result.suspects] == ["vnode-1"]
    assert result.straggler_frames[0] == "_simulate_compute (train.py)"
    job, rounds = load("healthy")
    assert analyze_rounds(job, rounds).stragglers == []


# --- benchmark ---------------------------------------------------------------------------------------------


def test_bench_names_the_culprit_and_prints_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_stacks.main(["--ranks", "1024", "--repeat", "2", "--tp", "8", "--pp", "4"]) == 0
    out = capsys.readouterr().out
    assert "analyze: min" in out and "found the culprit's machine" in out


def test_full_size_job_is_analyzed_quickly() -> None:
    job, samples, culprit, node = bench_stacks.synthetic_hang(16384, tp=8, pp=8, seed=7)
    started = time.perf_counter()
    analysis = analyze(job, samples)
    elapsed = time.perf_counter() - started
    assert analysis.culprit_ranks == [culprit] and [s[0] for s in analysis.suspects] == [node]
    assert len(analysis.groups) > 3  # distinct but healthy signatures (stages, TP peers) are not blamed
    assert elapsed < 5.0  # about 0.15 s on a 2-core machine; generous against a slow CI box


def test_rounds_stragglers_on_two_machines_fall_back_to_their_group() -> None:
    # tp=4, pp=2, four ranks per machine: ranks 26 and 58 are one PP group (stages 0 and 1) on two machines.
    job = make_job(64, 4, tp=4, pp=2)
    result = analyze_rounds(job, _rounds(job, {26, 58}, out_in={0, 2, 3, 4}, noise=0.03, seed=4))
    assert result.stragglers == [26, 58]
    assert result.method == "group_fallback" and result.covering_group == ("pp", [26, 58])
    assert sorted(s[0] for s in result.suspects) == ["node-14", "node-6"]
    assert all(s[1] < 0.85 for s in result.suspects)
    check_evidence(round_findings(job, result, observed_at=NOW))


def test_mostly_failed_dumps_blame_no_machine() -> None:
    job = make_job(16, 4)
    analysis = analyze(job, snapshot(job, {r: None for r in range(9)}, ALL_REDUCE))
    assert analysis.method == "inconclusive" and not analysis.suspects
    assert analysis.groups[0].state == "no_stack" and analysis.groups[0].count == 9


def test_framework_checkouts_keep_their_package_path() -> None:
    # Megatron-LM usually runs from a clone, not site-packages: its comm helpers must still read as waiting.
    a = {
        "name": "finish_grad_sync",
        "filename": "/workspace/Megatron-LM/megatron/core/distributed/param_and_grad_buffer.py",
    }
    b = {"name": "finish_grad_sync", "filename": "/home/bob/mlm-v2/megatron/core/distributed/param_and_grad_buffer.py"}
    assert normalize_frame(a) == normalize_frame(b)
    entry = normalize_frame({"name": "train_step", "filename": "/workspace/Megatron-LM/megatron/training/training.py"})
    assert classify([normalize_frame(a), entry]).state == "collective"


def test_a_machine_caught_at_another_moment_is_not_a_straggler() -> None:
    """Agents dump when their directive reaches them: one machine's ranks can all be caught mid-compute."""
    job = make_job(32, 8)
    skewed = set(range(16, 24))
    result = analyze_rounds(job, _rounds(job, skewed, out_in={0, 1, 2, 3, 4}, noise=0.0, seed=1))
    assert result.stragglers == [] and round_findings(job, result, observed_at=NOW) == []
    lone = analyze_rounds(job, _rounds(job, {17}, out_in={0, 1, 2, 3, 4}, noise=0.0, seed=1))
    assert lone.stragglers == [17] and lone.suspects[0][:2] == ("node-2", 0.85)


def test_a_slow_rank_stands_apart_from_its_machine_mate_while_machines_are_skewed() -> None:
    """Rounds as a real 4x2 DDP job gave them: machines caught at different moments, rank 3 always computing."""
    job = make_job(8, 2)
    computing = [{3}, set(range(8)), {0, 1, 3, 6, 7}, {3}, {0, 1, 3, 6}]
    rounds = [snapshot(job, {r: COMPUTE for r in busy}, ALL_REDUCE) for busy in computing]
    result = analyze_rounds(job, rounds)
    assert result.stragglers == [3]
    assert [s[0] for s in result.suspects] == ["node-1"]


def test_real_rounds_where_the_slow_ranks_mate_computes_beside_it_ask_for_more() -> None:
    """The eval's torch_slow, seed 1: in 5 rounds rank 3 is always computing, but so is its mate in 4."""
    data = json.loads((FIXTURES / "pyspy_rounds_slow_ddp8_mates.json").read_text())
    rounds = [[StackSample(d["rank"], d["node"], d["pid"], d["threads"]) for d in r] for r in data["rounds"]]
    job = JobInfo("slow", world_size=8, rank_nodes={d.rank: d.node for d in rounds[0]})
    result = analyze_rounds(job, rounds)
    assert result.stragglers == [] and result.leading == [3]
    assert round_findings(job, result, observed_at=NOW) == []


def test_a_rank_always_in_its_own_work_is_named_once_enough_rounds_outweigh_the_others_rate() -> None:
    """Rank 3 computes in every round; the others are caught computing in about 45% of theirs."""
    job = make_job(8, 2)
    rng = random.Random(11)
    rounds = [
        snapshot(job, {r: COMPUTE for r in range(8) if r == 3 or rng.random() < 0.45}, ALL_REDUCE) for _ in range(12)
    ]
    assert analyze_rounds(job, rounds[:5]).leading == [3]
    settled = next(
        (n, result) for n in range(5, 13) if (result := analyze_rounds(job, rounds[:n], looks=n - 4)).stragglers
    )
    n, result = settled
    assert result.stragglers == [3] and [s[0] for s in result.suspects] == ["node-1"] and n <= 12
    assert f"in {n}/{n} rounds" in result.why and result.suspects[0][1] >= 0.8


def test_a_rank_that_stands_apart_clearly_needs_no_more_rounds() -> None:
    job = make_job(8, 2)
    rounds = [snapshot(job, {3: COMPUTE, r: COMPUTE}, ALL_REDUCE) for r in (0, 5, 1, 6, 7)]
    result = analyze_rounds(job, rounds)
    assert result.stragglers == [3] and result.leading == []


def test_sequential_looks_keep_noise_from_passing() -> None:
    """Healthy jobs with noisy rounds, tested after every added round: no straggler, whatever the seed."""
    job = make_job(64, 8)
    for seed in range(40):
        rng = random.Random(seed)
        rounds = [
            snapshot(job, {r: COMPUTE for r in job.rank_nodes if rng.random() < 0.1}, ALL_REDUCE) for _ in range(12)
        ]
        for n in range(5, 13):
            assert analyze_rounds(job, rounds[:n], looks=n - 4).stragglers == [], (seed, n)


def test_a_role_apart_in_every_round_is_no_lead() -> None:
    job = make_job(16, 4, tp=4, pp=2)
    stage = set(range(8, 16))  # a whole pipeline stage computes while the other waits
    result = analyze_rounds(job, [snapshot(job, dict.fromkeys(stage, COMPUTE), ALL_REDUCE) for _ in range(5)])
    assert result.stragglers == [] and result.leading == []


def test_a_covering_group_of_most_of_the_job_is_not_named() -> None:
    """The accusation spray: culprits whose smallest covering group spans most of the job's machines leave
    the analysis job-level ("localizing"), instead of sending every machine to diagnostics."""
    # tp=2, pp=4, dp=1 on 4 machines of 2 ranks: the PP group of ranks 0, 2, 4, 6 spans all 4 machines.
    job = make_job(8, 2, tp=2, pp=4)
    analysis = analyze(job, snapshot(job, {0: COMPUTE, 2: DATA}, ALL_REDUCE))
    assert analysis.method == "inconclusive" and analysis.suspects == []
    assert "no small parallel group covers them" in analysis.why
    assert parallel.nameable_group(4, 8) and not parallel.nameable_group(5, 8) and not parallel.nameable_group(9, 64)
