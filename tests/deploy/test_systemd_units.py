"""deploy/systemd: each unit runs a command faultline accepts, under the environment file it names, whose every
variable is a setting the process knows; logs go to the journal; the service's units start after migrations."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import pytest

from agents.config import ENV_PREFIX, SETTINGS
from faultline.cli import build_parser
from service.config import Settings
from tests.paths import REPO

SYSTEMD = REPO / "deploy" / "systemd"
UNITS = sorted(SYSTEMD.glob("*.service"))
SERVICE_PROCESSES = ("faultline-api", "faultline-worker", "faultline-beat")


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive in systemd
    parser.read(path)
    return parser


def _env_keys(path: Path) -> list[str]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    return [line.split("=", 1)[0] for line in lines if line and not line.startswith("#")]


def test_there_is_a_unit_for_each_process():
    names = {unit.stem for unit in UNITS}
    assert names == {*SERVICE_PROCESSES, "faultline-migrate", "faultline-agent", "faultline-adapter-slurm"}


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.stem)
def test_the_unit_runs_a_command_faultline_accepts(unit):
    service = _unit(unit)["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[0] == "/opt/faultline/bin/faultline"
    try:
        build_parser().parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"{unit.name}: faultline refuses {argv[1:]}")
    if service.get("Type") != "oneshot":
        assert service["Restart"] == "always" and service["StandardError"] == "journal"


@pytest.mark.parametrize("name", SERVICE_PROCESSES)
def test_the_service_waits_for_migrations_and_knows_every_variable(name):
    unit = _unit(SYSTEMD / f"{name}.service")
    assert "faultline-migrate.service" in unit["Unit"]["Requires"]
    env_file = SYSTEMD / Path(unit["Service"]["EnvironmentFile"]).name
    known = {f"FAULTLINE_{field.upper()}" for field in Settings.model_fields} | {"PROMETHEUS_MULTIPROC_DIR"}
    for key in _env_keys(env_file):
        assert key in known, f"{env_file.name}: {key} is no setting of the service"


def test_the_agent_knows_every_variable_of_its_file():
    unit = _unit(SYSTEMD / "faultline-agent.service")
    env_file = SYSTEMD / Path(unit["Service"]["EnvironmentFile"]).name
    keys = _env_keys(env_file)
    assert "FAULTLINE_AGENT_ENROL_TOKEN" in keys and "FAULTLINE_AGENT_TOKEN_FILE" in keys
    for key in keys:
        assert key.startswith(ENV_PREFIX) and key.removeprefix(ENV_PREFIX).lower() in SETTINGS, key
    # The kept token lies in the unit's StateDirectory, which systemd creates and keeps across restarts.
    token_file = next(line for line in env_file.read_text().splitlines() if line.startswith(ENV_PREFIX + "TOKEN_FILE"))
    assert token_file.split("=", 1)[1].startswith("/var/lib/" + unit["Service"]["StateDirectory"] + "/")
