"""Where things are, for tests in any folder of the suite: the suite itself, its fixtures, the repository."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"
REPO = TESTS.parent
