"""The benchmarks' watch on other load: CPU used outside the benchmark's own processes marks the run busy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from lab.bench import busy

_BURN = "import time\nend = time.time() + 30\nwhile time.time() < end: pass"


@pytest.fixture
def outsider() -> Iterator[int]:
    """A CPU burner that is not the benchmark's: started through a shell that exits, so init adopts it."""
    out = subprocess.run(
        ["sh", "-c", f'{sys.executable} -c "{_BURN}" >/dev/null 2>&1 & echo $!'],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout.strip())
    yield pid
    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", _BURN])
    yield process
    process.kill()
    process.wait()


def test_a_process_outside_the_benchmark_marks_the_run_busy(outsider: int) -> None:
    with busy.watch_other_load(interval=0.5) as watched:
        time.sleep(3)
    load = watched[0]
    assert load.mean_cores >= 0.5  # the burner spins one core; more load elsewhere only adds
    assert load.busy
    figures: dict[str, object] = {}
    line = busy.note(figures, watched)
    assert line.startswith("WARNING: other load on the machine")
    assert figures["other_load"] == {**load.as_json(), "busy": True}


def test_the_benchmarks_own_children_are_its_own_load_and_strangers_are_not(
    child: subprocess.Popen[bytes], outsider: int
) -> None:
    ours = busy._Watch(None, 1.0)._ours(None)
    assert os.getpid() in ours and child.pid in ours
    assert outsider not in ours


def test_a_quiet_result_reads_as_quiet() -> None:
    load = busy.OtherLoad(mean_cores=0.05, peak_cores=0.3, seconds=60.0, database_seen=True)
    assert not load.busy
    assert load.line().endswith("the machine was quiet")
    assert busy.line_in({"other_load": load.as_json()}) == load.line()
