"""The UI serves every front-end file itself (clusters are often offline): vendored from npm, pinned."""

from __future__ import annotations

import json
import re

from tests import paths

UI = paths.REPO / "service" / "ui"


def test_the_vendored_htmx_is_the_version_package_json_pins() -> None:
    pinned = json.loads((UI / "assets" / "package.json").read_text())["dependencies"]["htmx.org"]
    locked = json.loads((UI / "assets" / "package-lock.json").read_text())["packages"]["node_modules/htmx.org"]
    served = (UI / "static" / "vendor" / "htmx.min.js").read_text()
    assert locked["version"] == pinned
    assert f'version:"{pinned}"' in served, "run `make assets` after changing service/ui/assets/package.json"


def test_templates_reference_no_other_host() -> None:
    for template in (UI / "templates").glob("*.html"):
        for url in re.findall(r'(?:src|href)="([^"]+)"', template.read_text()):
            assert not re.match(r"(https?:)?//", url), f"{template.name} loads {url} from elsewhere"


def test_static_files_are_served_with_their_types(client) -> None:
    script = client.get("/static/vendor/htmx.min.js")
    assert script.status_code == 200
    assert script.headers["content-type"].startswith(("text/javascript", "application/javascript"))
    style = client.get("/static/faultline.css")
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")
    assert client.get("/static/../config.py").status_code == 404
