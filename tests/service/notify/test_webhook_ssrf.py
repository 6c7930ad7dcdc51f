"""Webhooks post only to public addresses unless an operator allows a private host or range: checked when a
channel is created and again on every send, against the address actually connected to."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from service.config import get_settings
from service.notify import outbound, sender
from tests.conftest import bearer, count
from tests.receiver import receiver

REFUSED = [
    "http://169.254.169.254/latest/meta-data/",  # cloud metadata (link-local)
    "http://[fd00:ec2::254]/latest/meta-data/",  # the IPv6 metadata address (unique-local)
    "http://10.0.0.5:8080/hook",
    "http://192.168.1.1/hook",
    "http://172.16.0.1/hook",
    "http://100.64.0.1/hook",  # carrier-grade NAT
    "http://[::1]:9000/hook",
    "http://127.0.0.2:9000/hook",  # loopback, outside the tests' allowed 127.0.0.1/32
    "http://0.0.0.0:9000/hook",
    "http://[::ffff:169.254.169.254]/hook",  # IPv4-mapped IPv6
    "file:///etc/passwd",
    "gopher://127.0.0.1:6379/_FLUSHALL",
    "http://\u00fd\u00f7\u00b2.example/hook",  # not a valid IDNA host: the sender could not even parse it
]


@pytest.mark.parametrize("url", REFUSED)
def test_channels_to_internal_addresses_are_refused_at_creation(
    client: Any, make_token: Any, session: Any, url: str
) -> None:
    before = count(session, "notification_channels")
    response = client.post(
        "/api/v1/channels",
        json={"name": "metadata", "kind": "json", "url": url},
        headers=bearer(make_token("admin")),
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid"
    assert count(session, "notification_channels") == before


def test_an_allowed_range_or_host_may_be_private() -> None:
    import ipaddress

    loopback = ipaddress.ip_address("127.0.0.1")
    assert not outbound.allowed("relay.internal", loopback, [])
    assert outbound.allowed("relay.internal", loopback, ["127.0.0.0/8"])
    assert outbound.allowed("relay.internal", loopback, ["*.internal"])
    assert outbound.allowed("hooks.slack.com", ipaddress.ip_address("52.1.2.3"), [])


@pytest.fixture
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[str]]]:
    """Names this test decides the addresses of; every other name resolves as usual."""
    answers: dict[str, list[str]] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in answers:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in answers[host]]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield answers


def test_a_post_goes_to_the_checked_address_with_the_original_host(fake_dns: dict[str, list[str]]) -> None:
    settings = get_settings().model_copy(update={"webhook_allowed_private": ["127.0.0.1/32"]})
    with receiver() as chat:
        port = chat.url.rsplit(":", 1)[1]
        fake_dns["chat.example"] = ["127.0.0.1"]
        with outbound.client(settings) as http:
            outcome = sender.post(
                http, kind="json", url=f"http://chat.example:{port}/hook", body={"x": 1}, message_key="k"
            )
        assert outcome.ok, outcome
        (request,) = chat.requests
        assert request["headers"]["Host"] == f"chat.example:{port}" and request["path"] == "/hook"


def test_dns_rebinding_is_refused_at_send(fake_dns: dict[str, list[str]]) -> None:
    """The name was public when the channel was made; at send time it answers with the metadata address."""
    settings = get_settings()
    fake_dns["rebind.example"] = ["93.184.216.34"]
    assert outbound.creation_problem("http://rebind.example/hook", settings.webhook_allowed_private) is None
    fake_dns["rebind.example"] = ["169.254.169.254"]
    with outbound.client(settings) as http:
        outcome = sender.post(http, kind="json", url="http://rebind.example/hook", body={}, message_key="k")
    assert not outcome.ok and not outcome.retryable
    assert "169.254.169.254" in (outcome.error or "") and "link-local" in (outcome.error or "")


def test_a_name_with_a_public_and_a_private_address_is_refused(fake_dns: dict[str, list[str]]) -> None:
    fake_dns["split.example"] = ["93.184.216.34", "10.1.2.3"]
    problem = outbound.creation_problem("https://split.example/hook", [])
    assert problem is not None and "10.1.2.3" in problem


def test_a_redirect_is_not_followed() -> None:
    settings = get_settings().model_copy(update={"webhook_allowed_private": ["127.0.0.1/32"]})
    with receiver() as chat:
        chat.default = (302, {}, {"Location": "http://169.254.169.254/latest/meta-data/"})
        with outbound.client(settings) as http:
            outcome = sender.post(http, kind="json", url=f"{chat.url}/hook", body={}, message_key="k")
    assert not outcome.ok and not outcome.retryable and outcome.status_code == 302
    assert len(chat.requests) == 1


def test_loopback_is_refused_at_send_without_the_allowance() -> None:
    settings = get_settings().model_copy(update={"webhook_allowed_private": []})
    with receiver() as chat:
        with outbound.client(settings) as http:
            outcome = sender.post(http, kind="json", url=f"{chat.url}/hook", body={}, message_key="k")
        assert not outcome.ok and not outcome.retryable and "loopback" in (outcome.error or "")
        assert chat.requests == []


def test_the_refusal_says_why_and_a_public_host_is_accepted(
    client: Any, make_token: Any, fake_dns: dict[str, list[str]]
) -> None:
    headers = bearer(make_token("admin"))
    refused = client.post(
        "/api/v1/channels",
        json={"name": "metadata", "kind": "json", "url": "http://169.254.169.254/latest/meta-data/"},
        headers=headers,
    )
    assert (
        "link-local" in refused.json()["message"] and "FAULTLINE_WEBHOOK_ALLOWED_PRIVATE" in refused.json()["message"]
    )
    fake_dns["hooks.example.com"] = ["93.184.216.34"]
    accepted = client.post(
        "/api/v1/channels", json={"name": "chat", "kind": "json", "url": "https://hooks.example.com/x"}, headers=headers
    )
    assert accepted.status_code == 201, accepted.text
