"""schemathesis over the API's own OpenAPI document, against a real API process, with each scope's token:
no answer may be a 5xx, and every answer must be one the document declares, in the shape it declares.

Generation is deterministic (the same cases every run) and bounded (FAULTLINE_TEST_FUZZ_EXAMPLES per
operation and phase), so the run fits `make test`'s time budget. Checks that judge business rules the
schema cannot state (a silence ending in the past, a cursor the API never issued) are left out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from service.embedded import free_port
from service.tokens import service as tokens
from tests.procs import running, wait_api

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,ignored_auth"
EXAMPLES = int(os.environ.get("FAULTLINE_TEST_FUZZ_EXAMPLES", "8"))
# The admin run goes last: it may revoke the other scopes' tokens (never the last admin token).
SCOPES = ("agent", "scheduler", "operator", "admin")


def test_no_server_error_and_every_answer_matches_the_schema_for_every_scope(committed, tmp_path: Path) -> None:
    with Session(committed) as session:
        scoped = {scope: tokens.create(session, scope=scope, name=f"fuzz-{scope}").token for scope in SCOPES}
        session.commit()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Long polls answer at once, so a generated `wait=60` costs nothing.
    env = {"FAULTLINE_DECISION_MAX_WAIT_S": "0.1"}
    with running(["faultline", "serve", "--port", str(port)], env=env, log=tmp_path / "api.log"):
        wait_api(url)
        failed = {}
        for scope in SCOPES:
            argv = [
                sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
                "--header", f"Authorization: Bearer {scoped[scope]}", "--checks", CHECKS,
                "--max-examples", str(EXAMPLES), "--generation-deterministic", "--workers", "1",
                "--request-timeout", "20", "--suppress-health-check", "all",
            ]  # fmt: skip
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=900, env={**os.environ, "NO_COLOR": "1"}
            )
            summary = done.stdout[done.stdout.rfind("SUMMARY") :]
            print(f"--- {scope} ---\n{summary}")
            if done.returncode != 0:
                failed[scope] = done.stdout[-6000:]
    assert not failed, "\n".join(f"=== {scope} ===\n{out}" for scope, out in failed.items())
