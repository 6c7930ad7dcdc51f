"""Signing in to the web UI: operator tokens, sessions, CSRF on forms, an authenticating proxy's header."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from service.models import ApiToken, Decision, UiSession
from tests import rows
from tests.conftest import count, sign_in


def test_pages_send_a_stranger_to_the_sign_in_page_and_back(client, make_token) -> None:
    response = client.get("/decisions?state=pending", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == "/login?next=/decisions%3Fstate%3Dpending"
    form = client.get(response.headers["location"])
    assert 'name="next" value="/decisions?state=pending"' in form.text
    token = make_token("operator", name="alice")
    signed_in = client.post("/login", data={"token": token, "next": "/decisions?state=pending"}, follow_redirects=False)
    assert signed_in.status_code == 303
    assert signed_in.headers["location"] == "/decisions?state=pending"
    cookie = signed_in.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=lax" in cookie
    page = client.get("/decisions")
    assert page.status_code == 200
    assert "alice · operator" in page.text


def test_htmx_requests_without_a_session_are_told_where_to_sign_in(client) -> None:
    response = client.get("/", headers={"HX-Request": "true"}, follow_redirects=False)
    assert response.status_code == 401
    assert response.headers["hx-redirect"] == "/login?next=/"


def test_tokens_that_are_not_for_people_are_refused_with_the_reason(client, make_token, session) -> None:
    for scope in ("agent", "scheduler"):
        response = client.post("/login", data={"token": make_token(scope)}, follow_redirects=False)
        assert response.status_code == 403
        assert f"not a {scope} one" in response.text
    unknown = client.post("/login", data={"token": "fl_nope"}, follow_redirects=False)
    assert unknown.status_code == 401
    assert "not known" in unknown.text
    assert count(session, "ui_sessions") == 0


def test_an_offsite_next_goes_home(client, make_token) -> None:
    token = make_token("operator")
    for evil in ("https://evil.example/", "//evil.example/", "/\\evil.example"):
        response = client.post("/login", data={"token": token, "next": evil}, follow_redirects=False)
        assert response.headers["location"] == "/"


def test_a_revoked_token_ends_its_sessions(client, make_token, session) -> None:
    ui = sign_in(client, make_token("operator", name="bob"))
    assert ui.get("/").status_code == 200
    token = session.scalar(select(ApiToken).where(ApiToken.name == "bob"))
    token.revoked_at = datetime.now(UTC)
    session.flush()
    assert ui.get("/", follow_redirects=False).status_code == 303


def test_an_expired_session_signs_out(ui, session) -> None:
    session.execute(UiSession.__table__.update().values(expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    assert ui.get("/", follow_redirects=False).status_code == 303


def test_forms_need_the_session_csrf_token_and_change_nothing_without_it(ui, session) -> None:
    _, _, _, decision = rows.eviction(session)
    decision.state = "awaiting_approval"
    session.flush()
    for fields, headers in (({}, {}), ({"csrf_token": "forged"}, {}), ({}, {"X-CSRF-Token": "forged"})):
        response = ui.client.post(f"/decisions/{decision.id}/approve", data=fields, headers=headers)
        assert response.status_code == 403
        assert "CSRF" in response.text
    session.refresh(decision)
    assert decision.state == "awaiting_approval"
    assert ui.post(f"/decisions/{decision.id}/approve", {"return_to": "/"}).status_code == 303
    session.refresh(decision)
    assert decision.state == "pending"
    assert decision.actor == "operator:oncall-op"


def test_sign_out_ends_the_session(ui, session) -> None:
    assert ui.post("/logout").headers["location"] == "/login"
    assert count(session, "ui_sessions") == 0
    assert ui.get("/", follow_redirects=False).status_code == 303


def _behind_proxy(app, peer: str, **settings):
    from fastapi.testclient import TestClient

    app.state.settings = app.state.settings.model_copy(
        update={"ui_trusted_user_header": "X-Forwarded-User", **settings}
    )
    return TestClient(app, client=(peer, 40000))


def test_a_trusted_proxy_header_signs_the_user_in(app, session) -> None:
    client = _behind_proxy(app, "10.1.2.3", ui_trusted_proxies=["10.0.0.0/8"], ui_proxy_admins=["root"])
    page = client.get("/", headers={"X-Forwarded-User": "carol@example.com"})
    assert page.status_code == 200
    assert "carol@example.com · operator" in page.text
    assert "faultline_session" in page.headers["set-cookie"]
    # The session it opened carries a CSRF token like any other, so forms work the same way.
    again = client.get("/", headers={"X-Forwarded-User": "carol@example.com"})
    assert "set-cookie" not in again.headers
    assert count(session, "ui_sessions") == 1
    admin = client.get("/", headers={"X-Forwarded-User": "root"})
    assert "root · admin" in admin.text


def test_the_proxy_header_from_an_untrusted_address_is_ignored(app) -> None:
    client = _behind_proxy(app, "192.168.7.7", ui_trusted_proxies=["10.0.0.0/8"])
    response = client.get("/", headers={"X-Forwarded-User": "mallory"}, follow_redirects=False)
    assert response.status_code == 303


def test_operator_decisions_through_the_ui_are_recorded_as_the_person(ui, session) -> None:
    _, _, _, decision = rows.eviction(session)
    response = ui.post(f"/decisions/{decision.id}/reject", {"message": "known flaky link"}, htmx=True)
    assert response.status_code == 200
    assert "is now rejected" in response.text
    row = session.get(Decision, decision.id)
    session.refresh(row)
    assert (row.state, row.outcome_message, row.actor) == ("rejected", "known flaky link", "operator:oncall-op")


def test_expired_sessions_are_pruned_and_live_ones_kept(ui, session) -> None:
    from service.ui import sessions

    now = datetime.now(UTC)
    assert sessions.prune_expired(session, now=now) == 0
    assert sessions.prune_expired(session, now=now + timedelta(hours=13)) == 1
    assert count(session, "ui_sessions") == 0
