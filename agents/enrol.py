"""This node's agent token: from its token file, or by exchanging an enrolment token once (then kept in the file).

The exchange is `POST /api/v1/tokens/enrol {"node_name": ...}` with the enrolment token as the bearer. The service
answers it once per node: a second exchange for the same node is refused (409) while the first token lives, so
the token file must outlive the agent (a hostPath in Kubernetes, /var/lib/faultline-agent on bare metal).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import httpx
from tenacity import stop_after_delay

from agents.config import AgentConfig
from agents.http_errors import Unavailable, error_message, post_json

log = logging.getLogger(__name__)
ENROL_PATH = "/api/v1/tokens/enrol"
PATIENCE_S = 300.0  # the service may still be starting (a DaemonSet rolls out beside the API); then exit, restart


class EnrolmentFailed(Exception):
    """No token: the file is unreadable, or the service refused the exchange; the message says what to do."""


def read_token_file(path: Path) -> str | None:
    """The token kept in `path`, or None when there is no such file yet."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise EnrolmentFailed(f"cannot read the token file {path}: {exc}") from exc
    return token or None


def write_token_file(path: Path, token: str) -> None:
    """Write the token readable by this user only, whole or not at all (a crash leaves no half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)


def exchange(
    server: str,
    enrol_token: str,
    node_name: str,
    *,
    patience_s: float = PATIENCE_S,
    transport: httpx.BaseTransport | None = None,
) -> str:
    """Trade the enrolment token for this node's agent token; retries while the service is unreachable."""
    with httpx.Client(base_url=server.rstrip("/"), timeout=10.0, transport=transport) as http:
        try:
            response = post_json(
                http,
                ENROL_PATH,
                {"node_name": node_name},
                headers={"Authorization": f"Bearer {enrol_token}"},
                stop=stop_after_delay(patience_s),
            )
        except Unavailable as exc:
            raise EnrolmentFailed(f"could not enrol within {patience_s:g} s: {exc}") from exc
    if response.status_code != 201:
        raise EnrolmentFailed(
            f"the service refused to enrol node {node_name!r} ({response.status_code}): {error_message(response)}"
        )
    return str(response.json()["token"])


def obtain_token(config: AgentConfig, *, transport: httpx.BaseTransport | None = None) -> str:
    """The token this agent sends: the kept one, else a new one from the enrolment exchange (then kept)."""
    path = config.token_path
    kept = read_token_file(path)
    if kept:
        return kept
    if not config.enrol_token:
        raise EnrolmentFailed(f"no token: {path} does not exist and no enrolment token was given (--enrol-token)")
    assert config.server  # checked with the config
    # A Secret made from a file keeps its trailing newline, which no HTTP header may carry.
    token = exchange(config.server, config.enrol_token.strip(), config.node_name, transport=transport)
    write_token_file(path, token)
    log.info("enrolled node %s; its agent token is kept in %s", config.node_name, path)
    return token
