"""The `/ui` page's static files, served by `extender.http.ui`: plain HTML, CSS and JavaScript
written by hand (no build step, no package manager), using only what the extender serves (no
script, style or font from the network)."""

from typing import Final

#: The page itself.
PAGE: Final = "index.html"
#: Every file served under /ui/, with its content type.
ASSETS: Final = {
    "index.html": "text/html; charset=utf-8",
    "ui.js": "text/javascript; charset=utf-8",
    "draw.js": "text/javascript; charset=utf-8",
    "ui.css": "text/css; charset=utf-8",
}
