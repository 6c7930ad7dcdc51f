"""What if: the policy form, prefilled with the settings in effect, and a backtest of the stored incidents under it.

Read-only: the backtest runs in a READ ONLY savepoint that is rolled back (decisions.backtest.read_only).
"""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import Request
from fastapi.routing import APIRouter
from starlette.responses import Response

from service.arguments import duration_s
from service.decisions import backtest, backtest_report, overrides
from service.deps import DbSession
from service.errors import FaultlineError, InvalidInput
from service.ui.auth import ViewerDep
from service.ui.render import page
from service.ui.views import admin, policy_form

router = APIRouter(include_in_schema=False)


@router.get("/whatif")
def whatif(request: Request, session: DbSession, _: ViewerDep) -> Response:
    settings = request.app.state.settings
    query = request.query_params
    form: dict[str, Any] = overrides.current(settings)
    window = {"since": query.get("since", "7d"), "until": query.get("until", ""), "jobs": query.get("jobs", "")}
    context: dict[str, Any] = {
        "fields": policy_form.fields(form),
        "window": window,
        "result": None,
        "errors": [],
    }
    if "run" not in query:
        return page(request, "whatif.html", context)
    # The form as typed, shown again whatever happens.
    form = policy_form.from_query(query)
    context["fields"] = policy_form.fields(form)
    try:
        candidate = overrides.candidate(settings, policy_form.as_settings(form))
        try:
            span = timedelta(seconds=duration_s(window["since"]))
        except argparse.ArgumentTypeError as exc:
            raise InvalidInput(f"since: {exc}") from None
        until = admin.utc_time(window["until"], field="until") or datetime.now(UTC)
        jobs = sorted({j for j in re.split(r"[\s,]+", window["jobs"]) if j})
        with backtest.read_only(session):
            result = backtest.run(
                session, settings=settings, candidate=candidate, since=until - span, until=until, job_ids=jobs
            )
    except FaultlineError as exc:
        context["errors"] = admin.error_lines(exc) or [exc.message]
        return page(request, "whatif.html", context, status_code=exc.status_code)
    context["result"] = backtest_report.as_dict(result)
    # Shares as percentages, as the form shows them.
    context["changed"] = {
        name: (policy_form.shown(name, v["current"]), policy_form.shown(name, v["candidate"]))
        for name, v in context["result"]["changed_settings"].items()
    }
    return page(request, "whatif.html", context)
