"""``/docs`` renders in a real browser with every request outside the service refused (offline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from atlas.settings import Settings
from service.app import create_app
from tests.service.conftest import LiveServer
from tests.service.dashboard_helpers import CHROMIUM, CHROMIUM_ARGS

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]


def test_swagger_ui_renders_offline(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    app = create_app(Settings(data_dir=tmp_path / "d", sketch_dim=256, device="cpu"),
                     overrides={"lm": None, "start_runner": False})
    server = LiveServer(app).start()
    base = server.url
    outside: list[str] = []

    def only_the_service(route: Any) -> None:
        if route.request.url.startswith(base):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.route("**/*", only_the_service)
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(f"{base}/docs")
                page.wait_for_selector(".swagger-ui .info .title", timeout=20_000)
                assert "FisherAtlas" in page.inner_text(".swagger-ui .info .title")
                page.wait_for_selector(".opblock", timeout=20_000)
                assert page.locator(".opblock").count() >= 10  # the operations are listed
                assert not errors, errors
            finally:
                browser.close()
    finally:
        server.stop()
    assert not outside, f"the docs page fetched from outside the service: {outside}"
