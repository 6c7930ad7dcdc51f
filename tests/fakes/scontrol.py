"""A fake `scontrol`: a small program written into a test folder that records its argv and can be told to fail.

It keeps each node's State= as `scontrol show node -o NODE` prints it (nodes.json): `update ... state=drain` makes it
IDLE+DRAIN, `state=resume` IDLE; a node it was never told of is "not found", as Slurm says of a node it lacks."""

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
states = here / "nodes.json"
nodes = json.loads(states.read_text()) if states.exists() else {{}}
args = sys.argv[1:]
if args[:2] == ["show", "node"]:
    name = args[-1]
    if name not in nodes:
        sys.stderr.write(f"Node {{name}} not found\\n")
        sys.exit(1)
    print(f"NodeName={{name}} Arch=x86_64 CoresPerSocket=48 CPUAlloc=0 State={{nodes[name]}} ThreadsPerCore=2")
elif args[:1] == ["update"]:
    fields = dict(a.split("=", 1) for a in args[1:] if "=" in a)
    if fields.get("state") == "drain":
        nodes[fields["nodename"]] = "IDLE+DRAIN"
    elif fields.get("state") == "resume":
        nodes[fields["nodename"]] = "IDLE"
    states.write_text(json.dumps(nodes))
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

    def set_state(self, node: str, state: str) -> None:
        """What `scontrol show node` prints as the node's State= (someone resumed it by hand, say)."""
        states = self.path.parent / "nodes.json"
        nodes = json.loads(states.read_text()) if states.exists() else {}
        states.write_text(json.dumps({**nodes, node: state}))

    def updates(self) -> list[list[str]]:
        """The calls that changed something (the loop also reads node states)."""
        return [call for call in self.calls() if call[:1] != ["show"]]


def fake_scontrol(folder: Path) -> FakeScontrol:
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "scontrol"
    program.write_text(_PROGRAM.format(python=sys.executable))
    program.chmod(0o755)
    return FakeScontrol(program)
