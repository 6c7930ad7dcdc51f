"""The fleet circuit breaker's reset form (the banner every page shows while it is tripped)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Form, Request
from starlette.responses import Response

from service.breaker import service as breaker
from service.breaker.schemas import ResetIn
from service.db import session_scope
from service.errors import FaultlineError, Forbidden
from service.ui.auth import FormViewer
from service.ui.render import redirect
from service.validation import validated

router = APIRouter(include_in_schema=False)


@router.post("/breaker/reset")
def reset_breaker(
    request: Request,
    viewer: FormViewer,
    reason: Annotated[str, Form()] = "",
    return_to: Annotated[str, Form()] = "/",
) -> Response:
    """An operator resumes automatic take-outs, with a reason kept in the breaker's audit trail."""
    try:
        if viewer.scope not in ("operator", "admin"):
            raise Forbidden("only an operator resets the fleet breaker")
        body = validated(ResetIn, reason=reason)
        with session_scope(request.app.state.sessionmaker) as session:
            state = breaker.reset(
                session,
                reason=body.reason,
                actor=viewer.actor,
                now=datetime.now(UTC),
                settings=request.app.state.settings,
            )
    except FaultlineError as exc:
        return redirect(request, return_to, flash=f"Breaker not reset: {exc.message}", refused=True)
    held = f"; {state.held_decisions} held decision(s) still wait for a person" if state.held_decisions else ""
    return redirect(request, return_to, flash=f"Fleet breaker reset: automatic take-outs resume{held}.")
