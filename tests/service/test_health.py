"""/healthz names the dependency that is down; /metrics counts what ingest stored."""

from __future__ import annotations

from fastapi.testclient import TestClient
from pydantic import SecretStr

from service.app import create_app
from service.config import get_settings
from service.embedded import free_port
from tests.conftest import bearer
from tests.factories import batch


def test_broker_down_is_503_naming_the_broker(factory):
    settings = get_settings().model_copy(update={"redis_url": SecretStr(f"redis://127.0.0.1:{free_port()}/0")})
    with TestClient(create_app(settings, factory=factory)) as client:
        response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded" and body["database"] == "ok"
    assert body["broker"].startswith("error: ConnectionError")


def test_metrics_count_ingested_items(client, make_token):
    def samples() -> float:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith('faultline_ingest_items_total{kind="metrics"}'):
                return float(line.split()[-1])
        return 0.0

    before = samples()
    assert client.post("/api/v1/ingest", json=batch(gpus=3), headers=bearer(make_token("agent"))).status_code == 200
    assert samples() == before + 3
