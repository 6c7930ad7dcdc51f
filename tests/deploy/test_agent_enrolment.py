"""An agent enrols against a real API process: `faultline agent` with only an enrolment token trades it for its
node's own token, keeps it (mode 0600) and ships with it; later starts read the kept token; another agent claiming
the same node, a node outside the pattern, and an expired enrolment token are refused with the reason."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from agents.config import AgentConfig
from agents.enrol import EnrolmentFailed, obtain_token
from service.models import AgentEnrolment, ApiToken
from service.tokens import service as tokens
from tests.procs import api_server

pytestmark = pytest.mark.slow
FAULTLINE = str(Path(sys.executable).with_name("faultline"))


def _enrolments(engine, node: str) -> int:
    with Session(engine) as session:
        return session.scalar(select(func.count()).where(AgentEnrolment.node_name == node)) or 0


def test_an_agent_enrols_once_keeps_its_token_and_ships_with_it(committed, tmp_path):
    with Session(committed) as session:
        grant = tokens.create(session, scope="enrol", name="cluster a", node_pattern="gpu-*").token
        admin = tokens.create(session, scope="admin").token
        session.commit()
    state = tmp_path / "state"
    with api_server(log=tmp_path / "api.log") as url:
        env = {
            **os.environ,
            "FAULTLINE_AGENT_SERVER": url,
            "FAULTLINE_AGENT_ENROL_TOKEN": grant,
            "FAULTLINE_AGENT_TOKEN_FILE": str(state / "token"),
            "FAULTLINE_AGENT_SPOOL_DIR": str(state / "spool"),
        }
        args = [FAULTLINE, "agent", "--once", "--node-name", "gpu-017", "--kmsg", "none"]
        first = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert first.returncode == 0, first.stderr
        token = (state / "token").read_text().strip()
        assert stat.S_IMODE((state / "token").stat().st_mode) == 0o600
        # The kept token is an agent token bound to this node, and its batch arrived under it.
        with Session(committed) as session:
            record = session.scalar(select(ApiToken).where(ApiToken.token_hash == tokens.hash_token(token)))
            assert record is not None and record.scope == "agent" and record.node_name == "gpu-017"
        node = httpx.get(f"{url}/api/v1/nodes/gpu-017", headers={"Authorization": f"Bearer {admin}"})
        assert node.status_code == 200 and node.json()["last_seen_at"]

        # A restart reads the kept token: no second exchange (which the service would refuse).
        again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert again.returncode == 0, again.stderr
        assert (state / "token").read_text().strip() == token and _enrolments(committed, "gpu-017") == 1

        # Another agent claiming gpu-017 (no kept token: a copy of the enrolment token elsewhere) is refused.
        impostor = {**env, "FAULTLINE_AGENT_TOKEN_FILE": str(tmp_path / "other" / "token")}
        refused = subprocess.run(args, env=impostor, capture_output=True, text=True, timeout=120, check=False)
        assert refused.returncode == 2 and "(409)" in refused.stderr and "already enrolled" in refused.stderr
        assert not (tmp_path / "other" / "token").exists()


def test_wrong_node_and_expired_enrolment_tokens_are_refused(committed, tmp_path):
    with Session(committed) as session:
        grant = tokens.create(session, scope="enrol", node_pattern="gpu-*").token
        expired = tokens.create(session, scope="enrol", expires_at=datetime.now(UTC) - timedelta(minutes=1)).token
        session.commit()
    with api_server(log=tmp_path / "api.log") as url:

        def config(node: str, enrol_token: str) -> AgentConfig:
            return AgentConfig(server=url, enrol_token=enrol_token, node_name=node, token_file=tmp_path / node)

        with pytest.raises(EnrolmentFailed, match=r"\(403\).*does not match"):
            obtain_token(config("login-01", grant))
        with pytest.raises(EnrolmentFailed, match=r"\(401\).*expired"):
            obtain_token(config("gpu-002", expired))
        assert not (tmp_path / "login-01").exists() and not (tmp_path / "gpu-002").exists()
        assert obtain_token(config("gpu-003", grant)).startswith("fl_")
