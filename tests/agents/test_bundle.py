"""The evidence bundle's collector (agents/bundle.py) against fake nvidia-smi, dcgmi and nvidia-bug-report.sh on PATH
(tests/fixtures/bundle), py-spy on a real process, its time and size bounds, missing tools; and its upload."""

from __future__ import annotations

import gzip
import io
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import orjson
import pytest

from agents import bundle
from agents.bundle_upload import upload
from agents.history import RecentBatches
from agents.stacks import find_py_spy
from tests.receiver import serving

FIXTURES = Path(__file__).parent.parent / "fixtures"
FAKE_BIN = FIXTURES / "bundle" / "bin"
SYSTEM_PATH = "/usr/bin:/bin"  # sh, cat, gzip, od, head, sleep: what the fakes use


def _members(body: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        names = tar.getnames()
        assert names[0] == "manifest.json", "the manifest comes first: the service reads only that far"
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def _parts(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in manifest["parts"]}


@pytest.fixture
def fake_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{FAKE_BIN}:{SYSTEM_PATH}")


@pytest.fixture
def kernel_log(tmp_path: Path) -> Path:
    path = tmp_path / "kern.log"
    path.write_text(
        "Nov 29 01:00:00 gpu-node-017 kernel: nvidia-nvlink: Nvlink Core is being initialized\n"
        "Nov 29 01:02:03 gpu-node-017 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, "
        "GPU has fallen off the bus.\n"
    )
    return path


def _collect(sources: bundle.Sources, **kwargs: Any) -> tuple[bytes, dict[str, Any]]:
    args: dict[str, Any] = {"bundle_id": "b-1", "node": "gpu-node-017", "decision_id": 7}
    args |= {"timeout_s": 60.0, "max_bytes": 20 * 2**20} | kwargs
    return bundle.collect(sources, **args)


def test_a_bundle_holds_every_part_from_the_fake_tools_and_a_manifest_that_says_so(
    fake_tools: None, kernel_log: Path
) -> None:
    history = [orjson.dumps({"batch_id": "a", "metrics": [{"gpu": 0}]}), orjson.dumps({"batch_id": "b"})]
    body, manifest = _collect(bundle.Sources(kmsg=str(kernel_log), history=lambda: history, targets=lambda: []))

    members = _members(body)
    assert orjson.loads(members["manifest.json"]) == manifest
    parts = _parts(manifest)
    assert [p["name"] for p in manifest["parts"]] == [
        "kernel_log",
        "agent_samples",
        "nvidia_smi",
        "py_spy",
        "dcgmi_diag",
        "nvidia_bug_report",
    ]
    assert members["kernel.log"] == kernel_log.read_bytes()
    assert b"fallen off the bus" in members["kernel.log"]
    assert members["agent-samples.jsonl"].splitlines() == history
    assert members["nvidia-smi-q.txt"] == (FIXTURES / "bundle" / "nvidia_smi_q.txt").read_bytes()
    assert members["dcgmi-diag-r1.txt"] == (FIXTURES / "checks" / "dcgmi_diag_r1_pass.txt").read_bytes()
    assert gzip.decompress(members["nvidia-bug-report.log.gz"]).startswith(b"_____")
    for name in ("kernel_log", "agent_samples", "nvidia_smi", "dcgmi_diag", "nvidia_bug_report"):
        assert parts[name]["status"] == "ok", parts[name]
        assert parts[name]["bytes"] == len(members[parts[name]["file"]])
        assert parts[name]["truncated"] is False
        assert parts[name]["seconds"] >= 0
    assert parts["py_spy"]["status"] == "skipped" and "no training processes" in parts["py_spy"]["error"]
    assert manifest["bundle_id"] == "b-1" and manifest["decision_id"] == 7 and manifest["node"] == "gpu-node-017"
    assert manifest["seconds"] < 30


def test_missing_tools_are_noted_in_the_manifest_never_an_error(
    monkeypatch: pytest.MonkeyPatch, kernel_log: Path, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # none of the tools
    body, manifest = _collect(bundle.Sources(kmsg=str(kernel_log), history=None, targets=None))
    parts = _parts(manifest)
    for name, tool in (("nvidia_smi", "nvidia-smi"), ("dcgmi_diag", "dcgmi"), ("nvidia_bug_report", "nvidia-bug")):
        assert parts[name]["status"] == "missing"
        assert tool in parts[name]["error"] and "not installed" in parts[name]["error"]
        assert "file" not in parts[name]
    assert parts["agent_samples"]["status"] == "skipped"
    assert parts["kernel_log"]["status"] == "ok"
    assert set(_members(body)) == {"manifest.json", "kernel.log"}


def test_no_kernel_log_is_said_plainly(fake_tools: None, tmp_path: Path) -> None:
    _, manifest = _collect(bundle.Sources(kmsg="none"))
    assert _parts(manifest)["kernel_log"]["status"] == "skipped"
    assert "--kmsg none" in _parts(manifest)["kernel_log"]["error"]
    _, manifest = _collect(bundle.Sources(kmsg=str(tmp_path / "gone.log")))
    assert _parts(manifest)["kernel_log"]["status"] == "missing"


def test_the_bundle_stays_under_its_size_cap_and_says_what_was_cut(
    fake_tools: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    big_log = tmp_path / "kern.log"
    with big_log.open("w") as handle:
        for i in range(60_000):
            handle.write(f"Nov 29 01:00:00 node kernel: line {i:06d} of a long kernel log\n")
    monkeypatch.setenv("FAKE_BUG_REPORT_BYTES", str(2 * 2**20))  # incompressible: over any cap below
    cap = 512 * 1024
    body, manifest = _collect(bundle.Sources(kmsg=str(big_log)), max_bytes=cap)

    assert len(body) <= cap
    parts = _parts(manifest)
    assert parts["kernel_log"]["truncated"] is True
    kernel = _members(body)["kernel.log"]
    assert kernel.endswith(b"line 059999 of a long kernel log\n"), "the newest lines are kept"
    assert kernel.startswith(b"Nov 29"), "from a whole line"
    assert parts["nvidia_bug_report"]["truncated"] is True
    assert sum(p["bytes"] for p in manifest["parts"]) <= cap


def test_a_hanging_tool_is_killed_at_the_bundle_time_and_the_rest_is_skipped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kernel_log: Path
) -> None:
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "nvidia-smi").write_text("#!/bin/sh\nsleep 60\n")
    (slow / "nvidia-smi").chmod(0o755)
    for tool in ("dcgmi", "nvidia-bug-report.sh"):
        shutil.copy(FAKE_BIN / tool, slow / tool)
    monkeypatch.setenv("PATH", f"{slow}:{SYSTEM_PATH}")

    started = time.monotonic()
    _, manifest = _collect(bundle.Sources(kmsg=str(kernel_log)), timeout_s=2.0)
    took = time.monotonic() - started

    assert took < 6, f"a 2 s bundle took {took:.1f} s"
    parts = _parts(manifest)
    assert parts["nvidia_smi"]["status"] == "timeout" and "killed" in parts["nvidia_smi"]["error"]
    assert 1.5 <= parts["nvidia_smi"]["seconds"] < 4
    assert parts["dcgmi_diag"]["status"] == "skipped" and "no time left" in parts["dcgmi_diag"]["error"]
    assert parts["kernel_log"]["status"] == "ok", "what came before the hang is kept"


@pytest.fixture
def training_process() -> Iterator[subprocess.Popen[bytes]]:
    code = "import time\ndef waiting_in_all_reduce():\n    time.sleep(120)\nwaiting_in_all_reduce()\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    time.sleep(0.5)
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed")
def test_py_spy_dumps_the_training_processes(fake_tools: None, training_process: subprocess.Popen[bytes]) -> None:
    targets = [{"pid": training_process.pid, "job_id": "llm-42", "rank": 3}]
    body, manifest = _collect(bundle.Sources(kmsg="none", targets=lambda: targets))
    part = _parts(manifest)["py_spy"]
    assert part["status"] == "ok", part
    [dumped] = orjson.loads(_members(body)["py-spy.json"])
    assert dumped["pid"] == training_process.pid and dumped["rank"] == 3 and dumped["job_id"] == "llm-42"
    frames = [f["name"] for thread in dumped["threads"] for f in thread["frames"]]
    assert "waiting_in_all_reduce" in frames


def test_a_process_py_spy_cannot_read_is_an_error_in_the_part(fake_tools: None) -> None:
    if find_py_spy() is None:
        pytest.skip("py-spy is not installed")
    _, manifest = _collect(bundle.Sources(kmsg="none", targets=lambda: [{"pid": 2**22 + 17, "rank": 0}]))
    part = _parts(manifest)["py_spy"]
    assert part["status"] == "error" and "no process could be dumped" in part["error"]


def test_recent_batches_keep_the_last_minutes_within_their_bytes() -> None:
    recent = RecentBatches(max_age_s=300, max_bytes=100)
    recent.add(b"x" * 40, now=0)
    recent.add(b"y" * 40, now=100)
    assert recent.snapshot(now=200) == [b"x" * 40, b"y" * 40]
    recent.add(b"z" * 40, now=250)  # 120 bytes: the oldest goes
    assert recent.snapshot(now=250) == [b"y" * 40, b"z" * 40]
    assert recent.snapshot(now=401) == [b"z" * 40], "older than 300 s goes"


class _Upload(BaseHTTPRequestHandler):
    answers: list[int] = []
    received: list[tuple[str, bytes, dict[str, str]]] = []
    lock = threading.Lock()

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        with self.lock:
            self.received.append((self.path, body, dict(self.headers)))
            status = self.answers.pop(0) if self.answers else 201
        payload = orjson.dumps({"error": "x", "message": f"answer {status}"})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_: Any) -> None:
        pass


def test_upload_retries_a_busy_service_and_stops_at_a_final_answer() -> None:
    _Upload.received = []
    _Upload.answers = [503, 201]
    with serving(_Upload) as url:
        answer = upload(server=url, token="fl_t", node="n1", bundle_id="b-1", body=b"tar.gz")
        assert answer.stored and answer.status == 201
        assert len(_Upload.received) == 2
        path, body, headers = _Upload.received[-1]
        assert path == "/api/v1/nodes/n1/bundles/b-1" and body == b"tar.gz"
        assert headers["Authorization"] == "Bearer fl_t" and headers["Content-Type"] == "application/gzip"

        _Upload.answers = [413]
        answer = upload(server=url, token="fl_t", node="n1", bundle_id="b-2", body=b"big")
        assert not answer.stored and answer.status == 413 and "answer 413" in answer.message
        assert len(_Upload.received) == 3, "a 413 is final: no retry"


def test_upload_gives_up_on_an_unreachable_service() -> None:
    with socket.socket() as sock:  # a free port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    answer = upload(server=f"http://127.0.0.1:{port}", token="t", node="n1", bundle_id="b", body=b"x", give_up_s=1.5)
    assert not answer.stored and answer.status == 0 and "unreachable" in answer.message
    assert time.monotonic() - started < 20
