"""A fake `scontrol`: a small program written into a test folder that records its argv and can be told to fail."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

_PROGRAM = """#!{python}
import json, pathlib, sys

here = pathlib.Path(__file__).resolve().parent
with open(here / "calls.jsonl", "a") as calls:
    calls.write(json.dumps(sys.argv[1:]) + "\\n")
failure = here / "fail.json"
if failure.exists():
    spec = json.loads(failure.read_text())
    sys.stderr.write(spec["stderr"])
    sys.exit(spec["code"])
"""


@dataclass(frozen=True)
class FakeScontrol:
    path: Path  # the program; its folder can go first on PATH

    def calls(self) -> list[list[str]]:
        log = self.path.parent / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def fail_with(self, stderr: str, code: int = 1) -> None:
        (self.path.parent / "fail.json").write_text(json.dumps({"stderr": stderr, "code": code}))

    def succeed(self) -> None:
        (self.path.parent / "fail.json").unlink(missing_ok=True)


def fake_scontrol(folder: Path) -> FakeScontrol:
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "scontrol"
    program.write_text(_PROGRAM.format(python=sys.executable))
    program.chmod(0o755)
    return FakeScontrol(program)
