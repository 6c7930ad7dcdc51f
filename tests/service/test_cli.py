"""The `faultline` command as an operator runs it."""

from __future__ import annotations

import os
import subprocess
import sys

from sqlalchemy import text


def faultline(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "faultline", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def test_token_create_prints_the_token_once_and_stores_its_hash(committed):
    result = faultline("token", "create", "--scope", "agent", "--node", "gpu-node-007")
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    assert token.startswith("fl_") and len(token) > 40
    assert "shown only once" in result.stderr
    with committed.connect() as conn:
        row = conn.execute(text("SELECT id, token_hash, scope, node_name FROM api_tokens")).one()
    assert token not in row.token_hash and row.scope == "agent" and row.node_name == "gpu-node-007"

    listing = faultline("token", "list")
    assert listing.returncode == 0 and token not in listing.stdout and "gpu-node-007" in listing.stdout
    # Ids come from a sequence that rolled-back tests advance too: take the one this token got.
    revoked = faultline("token", "revoke", str(row.id))
    assert revoked.returncode == 0 and f"revoked token {row.id}" in revoked.stderr
    assert "revoked" in faultline("token", "list").stdout


def test_bad_input_is_a_clear_error(committed):
    bound = faultline("token", "create", "--scope", "scheduler", "--node", "x")
    assert bound.returncode == 2 and "only agent tokens can be bound to a node" in bound.stderr
    scope = faultline("token", "create", "--scope", "root")
    assert scope.returncode == 2 and "invalid choice" in scope.stderr
    missing = faultline("token", "revoke", "999")
    assert missing.returncode == 2 and "no token with id 999" in missing.stderr


def test_missing_configuration_says_what_to_set():
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    result = subprocess.run(
        [sys.executable, "-m", "faultline", "migrate"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode != 0
    assert "FAULTLINE_DATABASE_URL" in result.stderr and "Traceback" not in result.stderr


def test_migrate_check_reports_an_up_to_date_database():
    result = faultline("migrate", "--check")
    assert result.returncode == 0 and "up to date" in result.stdout


def test_commands_with_their_own_parsers_are_dispatched():
    """`faultline ml`, `faultline eval` and `faultline bench stacks` parse their own options."""
    predicted = faultline("ml", "predict", "NET/IB : Got completion from peer 10.0.0.7<1234> with error 12")
    assert predicted.returncode == 0, predicted.stderr
    assert predicted.stdout.split("\t")[0] == "network"
    listing = faultline("eval", "--list")
    assert listing.returncode == 0 and "torch_hang" in listing.stdout and "gpu_lost" in listing.stdout
    bench = faultline("bench", "stacks", "--ranks", "512", "--repeat", "1")
    assert bench.returncode == 0, bench.stderr
    assert "ms" in bench.stdout
    wrong = faultline("eval", "--scenarios", "no_such_scenario")
    assert wrong.returncode == 2 and "no_such_scenario" in wrong.stderr
