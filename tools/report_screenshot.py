"""A table of `snakemake --report`'s HTML report as a reader sees it, in a real headless Chromium:
open the report, click through its menu to a grid's table, check that a cell's text is visible,
take a screenshot.

    python tools/report_screenshot.py results/report.html --grid h200_sweep --table advice \
        --visible fa4 --out docs/report_table.png

Chromium is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: the browser
reads commands from its fd 3 and writes replies and events to its fd 4, each a JSON message ended
by a NUL byte). Debian's `chromium` package; tests/test_workflow.py uses this module and skips,
saying so, where no Chromium is installed.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

# The flags that start Chromium headless on a machine without a network (python.md, "Known to work").
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)


def chromium() -> str | None:
    """The Chromium executable on PATH, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class BrowserError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page (attached with a flat session)."""

    def __init__(self, width: int = 1400, height: int = 900, timeout: float = 60.0):
        exe = chromium()
        if exe is None:
            raise BrowserError("no chromium on PATH (Debian: apt-get install chromium)")
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds():  # in the child: the pipe ends where Chromium looks for them
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=fds,
            pass_fds=(3, 4),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        self.session = None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    # ------------------------------------------------------------------ the protocol

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise BrowserError("no reply from Chromium in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium closed its pipe (exit code {self.proc.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, **params) -> dict:
        """Send one command (to the page's session once attached) and return its result."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    # ------------------------------------------------------------------ what a test does

    def open(self, path: Path) -> None:
        """Load a file and wait for its load event."""
        self.events.clear()
        self.call("Page.navigate", url=Path(path).resolve().as_uri())
        deadline = time.monotonic() + self.timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self._read_message(deadline))

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (awaited where it is a promise)."""
        result = self.call(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, what: str) -> object:
        """Poll an expression until it is truthy; its value."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        raise BrowserError(f"timed out waiting for {what}")

    def wait_for_frame(self, url_part: str) -> str:
        """The id of the newest child frame whose URL contains `url_part`, once there is one."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            tree = self.call("Page.getFrameTree")["frameTree"]
            found = [
                c["frame"]["id"]
                for c in tree.get("childFrames", [])
                if url_part in c["frame"].get("url", "")
            ]
            if found:
                return found[-1]
            time.sleep(0.2)
        raise BrowserError(f"no frame showing {url_part}")

    def evaluate_in(self, frame: str, expression: str):
        """An expression's value inside a child frame (its own world: a data: page is
        cross-origin to the report, so the report's scripts cannot look inside it)."""
        context = self.call("Page.createIsolatedWorld", frameId=frame)["executionContextId"]
        result = self.call(
            "Runtime.evaluate", expression=expression, contextId=context, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for_in(self, frame: str, expression: str, what: str):
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            value = self.evaluate_in(frame, expression)
            if value:
                return value
            time.sleep(0.2)
        raise BrowserError(f"timed out waiting for {what}")

    def click(self, x: float, y: float) -> None:
        """A left click at page coordinates, as a mouse makes it."""
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def close(self) -> None:
        try:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------- the report


# The centre of the innermost visible element of the menu (nav) whose text is `want`, or null.
FIND_TEXT = """(() => {
  const want = %s;
  const hits = [...document.querySelector('nav').querySelectorAll('*')].filter(e =>
    e.innerText && e.innerText.trim() === want && e.getBoundingClientRect().width > 0);
  if (!hits.length) return null;
  const r = hits[hits.length - 1].getBoundingClientRect();
  return [r.x + r.width / 2, r.y + r.height / 2];
})()"""

# The centre of the first button in the row of a result named `want` (its "view" eye), or null.
VIEW_BUTTON = """(() => {
  const want = %s;
  const label = [...document.querySelector('nav').querySelectorAll('*')].reverse().find(e =>
    e.innerText && e.innerText.trim() === want);
  let row = label;
  while (row && row.querySelectorAll('a, button').length < 2) row = row.parentElement;
  if (!row) return null;
  const r = row.querySelector('a, button').getBoundingClientRect();
  return r.width > 0 ? [r.x + r.width / 2, r.y + r.height / 2] : null;
})()"""

# In the frame showing a table: whether a cell whose text is `want` is drawn inside the frame's
# viewport and is the topmost element at its centre (not covered, not hidden, not scrolled away).
CELL_SHOWN = """(() => {
  const want = %s;
  const cell = [...document.querySelectorAll('td, th')].find(e => e.innerText.trim() === want);
  if (!cell) return 'no cell';
  const r = cell.getBoundingClientRect(), s = getComputedStyle(cell);
  const x = r.x + r.width / 2, y = r.y + r.height / 2;
  if (!(r.width > 0 && r.height > 0 && x < innerWidth && y < innerHeight && x > 0 && y > 0))
    return 'outside the view';
  if (s.visibility !== 'visible' || Number(s.opacity) === 0) return 'hidden';
  const top = document.elementFromPoint(x, y);
  return (top === cell || cell.contains(top)) ? [x, y] : 'covered';
})()"""


def click_until(b: Browser, target: str, shown: str, what: str, tries: int = 4) -> None:
    """Click the element `target` finds until the expression `shown` holds (a click the page
    was not yet ready for is repeated, as a reader would)."""
    for _ in range(tries):
        x, y = b.wait_for(target, what)
        b.click(x, y)
        deadline = time.monotonic() + b.timeout / tries
        while time.monotonic() < deadline:
            if b.evaluate(shown):
                return
            time.sleep(0.2)
    raise BrowserError(f"clicking {what} did not show what follows it")


def show_table(b: Browser, report: Path, grid: str, table: str) -> None:
    """Open the report and click, as a reader would: the grid under Results, its tables, the
    table's view button; wait until the table's page is shown."""
    b.open(report)
    b.wait_for("typeof app !== 'undefined' && !!document.querySelector('nav')", "the report")
    results, category = FIND_TEXT % json.dumps("Results"), FIND_TEXT % json.dumps(grid)
    tables, view = FIND_TEXT % json.dumps("tables"), VIEW_BUTTON % json.dumps(table)
    frame_shown = (
        "(() => { const f = document.querySelector('iframe');"
        f" return !!f && f.src.includes('filename={table}.html')"
        " && f.getBoundingClientRect().width > 0; })()"
    )
    b.wait_for(f"!!{results} || !!{category}", "the menu")
    if not b.evaluate(f"!!{category}"):  # one grid: its results are one click away, under Results
        click_until(b, results, f"!!{category} || !!{tables}", "Results")
    if not b.evaluate(f"!!{tables}"):
        click_until(b, category, f"!!{tables}", grid)
    click_until(b, tables, f"!!{view}", "tables")
    click_until(b, view, frame_shown, f"the view button of {table}")
    frame = b.wait_for_frame(f"filename={table}.html")
    b.wait_for_in(
        frame, "document.readyState === 'complete' && !!document.querySelector('td')", "its cells"
    )


def cell_visible(b: Browser, table: str, text: str):
    """[x, y] of a visible cell with this text in the shown table (in the frame), else why not."""
    deadline = time.monotonic() + 5  # the frame's page may still be parsing
    while True:
        frame = b.wait_for_frame(f"filename={table}.html")
        inside = b.evaluate_in(frame, CELL_SHOWN % json.dumps(text))
        if isinstance(inside, list) or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    if not isinstance(inside, list):
        return inside
    # ... and the frame itself is on screen there: the topmost element of the page at that point
    at = b.evaluate(
        "(() => { const f = document.querySelector('iframe').getBoundingClientRect();"
        f" const x = f.x + {inside[0]}, y = f.y + {inside[1]};"
        " return x < innerWidth && y < innerHeight &&"
        " document.elementFromPoint(x, y) === document.querySelector('iframe'); })()"
    )
    return inside if at else "the frame is covered or off screen there"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--grid", required=True)
    ap.add_argument("--table", required=True, help="a table's stem: advice, tflops, support ...")
    ap.add_argument("--visible", help="the text of a cell that must be visible")
    ap.add_argument("--out", type=Path, required=True, help="the screenshot (PNG)")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=900)
    a = ap.parse_args(argv)
    with Browser(a.width, a.height) as b:
        show_table(b, a.report, a.grid, a.table)
        print(b.screenshot(a.out))
        if a.visible:
            where = cell_visible(b, a.table, a.visible)
            if not isinstance(where, list):
                raise SystemExit(f"cell {a.visible!r} of {a.table}: {where}")
            print(f"cell {a.visible!r} visible at {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
