"""The incident page, in parts: page.py assembles it; evidence, stacks, logs and timeline shape what it cites."""

from service.ui.views.incident.evidence import Chart, charts, numbers
from service.ui.views.incident.logs import LogGroup, LogLine, log_groups
from service.ui.views.incident.page import (
    LOG_LIMIT,
    STACK_LIMIT,
    TIMELINE_LIMIT,
    FindingRow,
    IncidentPage,
    SilenceView,
    SuspectView,
    incident_page,
    override_choices,
)
from service.ui.views.incident.stacks import TREE_DEPTH, StackGroupRow, StackView, TreeNode, stack_tree, stack_views
from service.ui.views.incident.timeline import Entry, capped

__all__ = [
    "LOG_LIMIT",
    "STACK_LIMIT",
    "TIMELINE_LIMIT",
    "TREE_DEPTH",
    "Chart",
    "Entry",
    "FindingRow",
    "IncidentPage",
    "LogGroup",
    "LogLine",
    "SilenceView",
    "StackGroupRow",
    "StackView",
    "SuspectView",
    "TreeNode",
    "capped",
    "charts",
    "incident_page",
    "log_groups",
    "numbers",
    "override_choices",
    "stack_tree",
    "stack_views",
]
