"""The `/ui` page through the API server's service proxy, as `kubectl proxy` users open it
(`/api/v1/namespaces/mpsched-system/services/mpsched:metrics/proxy/ui`): every URL the page
uses is relative, so its script, style and data come through the same prefix. The fake API
server relays to a real extender over the embedded sample cluster; the browser sends the
kubeconfig's bearer token, as `kubectl proxy` would add it."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from tests.browser import chromium_or_skip, launch
from tests.ui.test_kubectl import plugin_setup

PREFIX = "/api/v1/namespaces/mpsched-system/services/mpsched:metrics/proxy"


async def test_the_page_works_under_the_proxys_prefix(tmp_path: Path) -> None:
    chromium_or_skip()
    async with (
        plugin_setup(tmp_path) as setup,
        launch(tmp_path / "profile") as browser,
        browser.page() as page,
    ):
        token = setup.fake.token
        await page.send("Network.setExtraHTTPHeaders", headers={"Authorization": f"Bearer {token}"})
        base = setup.api_url
        await page.navigate(f"{base}{PREFIX}/ui")
        await page.wait_for("window.mpschedUi && window.mpschedUi.loaded()")
        status = setup.service.status()
        gpus = sum(len(n["gpus"]) for n in status["nodes"])
        assert await page.evaluate("document.querySelectorAll('.gpu').length") == gpus
        await page.wait_for("window.mpschedUi.stats().some((s) => 'fetchMs' in s)")
        assert page.errors() == []
        paths = {urlsplit(u).path for u in page.requested_urls() if not u.startswith("data:")}
        assert {f"{PREFIX}/ui", f"{PREFIX}/ui/ui.js", f"{PREFIX}/ui/draw.js"} <= paths
        assert all(p.startswith(PREFIX + "/") for p in paths), paths
