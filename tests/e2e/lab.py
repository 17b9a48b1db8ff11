"""A real JupyterLab on 127.0.0.1 driven by Playwright with Debian's chromium.

Used by the end-to-end tests and by ``bench/bench_widget.py``. JupyterLab runs
with an empty token, news and update checks off, and ``windowingMode: none``
so every cell's output stays in the page (as JupyterLab's own galata tests
configure it); its user settings live in a temporary folder.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import nbformat

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic"]
ROOT = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "e2e"  # the browser tests' screenshots
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_notebook(path: pathlib.Path, cells: list[str]) -> None:
    """A notebook with a kernelspec (without one, Lab asks for a kernel)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


@contextlib.contextmanager
def jupyterlab(root: pathlib.Path, app: str = "jupyterlab") -> Iterator[str]:
    """Start JupyterLab (or, with ``app="notebook"``, Jupyter Notebook 7)
    serving ``root``; yields its base URL."""
    settings = root / ".lab-settings"
    # Notebook 7 lacks some of these plugins and fails on settings for a plugin it has no schema of
    for name, value in SETTINGS.items() if app == "jupyterlab" else ():
        f = settings / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(value))
    port = _free_port()
    # the kernels compile as a user's do: without the unit tests' fast-compile flags (tests/conftest.py),
    # which change what XLA:CPU computes where a value overflows (a LayerNorm of 1e20 gives NaN with them)
    xla = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith(("--xla_backend_optimization_level", "--xla_llvm_disable_expensive_passes"))]
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(xla),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", app, "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
           f"--ServerApp.root_dir={root}", "--allow-root"]
    if app == "jupyterlab":
        cmd += ["--LabApp.news_url=None", f"--LabApp.workspaces_dir={root / '.lab-workspaces'}",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.expose_app_in_browser=True"]  # window.jupyterapp: the tests switch themes with it
    log = open(root / "jupyterlab.log", "w")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{app} did not start:\n{(root / 'jupyterlab.log').read_text()[-3000:]}") from None
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


_playwright: Any = None


def _driver() -> Any:
    """Playwright's driver, one per process: its sync API cannot be started twice in one thread
    (the shared `Lab`'s chromium and a test's own browser share it)."""
    global _playwright
    if _playwright is None:
        from playwright.sync_api import sync_playwright

        _playwright = sync_playwright().start()
        atexit.register(_playwright.stop)
    return _playwright


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    b = _driver().chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
    try:
        yield b
    finally:
        b.close()


def start_kernel(url: str, path: str) -> None:
    """Start the kernel of notebook ``path`` (a session for it) before its page opens: the page then
    connects to it and starts none itself. A page starting its own kernel on a busy machine could ask
    with the "Select Kernel" dialog; accepting it swapped the kernel just started for another, and
    the page's poll of /api/kernels in between met jupyter_server's half-made kernel (a 500: its
    ``last_activity`` not set yet)."""
    body = json.dumps({"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}}).encode()
    req = urllib.request.Request(f"{url}/api/sessions", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=120).close()


#: What JupyterLab logs, on a busy machine, when a kernel connection is replaced (the page's session
#: taking the kernel `start_kernel` started) while its own background requests were still out: the
#: debugger's state and the kernel subshell it asks ipykernel 7 for. Neither request comes from yax
#: or the notebook; every other console and page error fails the test.
_JUPYTERLAB_OWN = re.compile(
    r"Canceled future for (debug_request|create_subshell_request) message before replies were done")


class Notebook:
    """An open notebook page (its kernel started first, `start_kernel`); collects console errors."""

    def __init__(self, page: Any, url: str, name: str, path: str = "lab/tree"):
        self.page = page
        self.errors: list[str] = []
        page.on("console", lambda m: self._error(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self._error(f"page error: {e}\n{e.stack or ''}"))
        page.on("response", lambda r: self.errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
        start_kernel(url, name.split("?")[0])
        page.goto(f"{url}/{path}/{name}")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
        self.settle()
        self.idle()

    def _error(self, text: str) -> None:
        if _JUPYTERLAB_OWN.search(text):
            print("JupyterLab's own (not counted):", text)
        else:
            self.errors.append(text)

    def settle(self) -> None:
        """Accept the "Select Kernel" dialog (with the notebook's own kernel) if it shows: on a busy
        machine JupyterLab can ask though the notebook names its kernel and the kernel is up."""
        dialog = self.page.locator(".jp-Dialog", has_text="Select Kernel")
        if dialog.count():
            dialog.locator(".jp-mod-accept").click()
            dialog.wait_for(state="detached")

    def idle(self, timeout: float = 180) -> None:
        self.page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=timeout * 1000)

    def run(self, index: int, timeout: float = 180) -> str:
        """Run cell ``index`` (0-based), wait for the kernel, return its output text."""
        cell = self.page.locator(".jp-Notebook .jp-CodeCell").nth(index)
        prompt = cell.locator(".jp-InputPrompt")
        before = prompt.inner_text()
        run = self.page.locator('jp-button[data-command="notebook:run-cell-and-select-next"]').first
        for _ in range(5):
            # Select the cell, then the toolbar's Run button: a Ctrl+Enter needs the editor's focus
            # and the shortcuts registered, and on a busy machine five in a row went unheard.
            self.settle()
            try:
                cell.locator(".jp-InputArea-editor").click(timeout=10_000)
                run.click(timeout=10_000)
            except Exception:  # covered by a dialog that came up meanwhile: settle, then again
                continue
            try:
                self.page.wait_for_function(
                    "([el, before]) => el.textContent !== before", arg=[prompt.element_handle(), before],
                    timeout=10_000)
                break
            except Exception:
                continue
        # the prompt goes from [ ] or [n] through [*] to a new [m] when the cell is done
        self.page.wait_for_function(
            "(el) => /\\[\\d+\\]/.test(el.textContent)", arg=prompt.element_handle(), timeout=timeout * 1000)
        self.idle(timeout)
        return cell.locator(".jp-OutputArea").inner_text()

    def printed(self, index: int, tag: str) -> Any:
        """Run cell ``index`` and read the JSON it printed after ``TAG=``."""
        out = self.run(index)
        line = next((x for x in out.splitlines() if x.startswith(tag + "=")), None)
        assert line is not None, out
        return json.loads(line[len(tag) + 1:])

    def shot(self, name: str) -> None:
        """A screenshot of the page's first explorer: ``artifacts/e2e/<name>.png``."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.locator(".yax-explorer").first.screenshot(path=str(ARTIFACTS / f"{name}.png"))

    @contextlib.contextmanager
    def failing(self, name: str) -> Iterator[None]:
        """On a failure inside: a screenshot of the whole page (``artifacts/e2e/<name>-failure.png``)
        and the console errors printed, then the failure."""
        try:
            yield
        except BaseException:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(ARTIFACTS / f"{name}-failure.png"), full_page=True)
            print("console errors:", self.errors)
            raise

    def last_output(self, index: int) -> str:
        return self.page.locator(".jp-Notebook .jp-CodeCell").nth(index).locator(".jp-OutputArea").inner_text()


def drag(page: Any, source: Any, target: Any) -> None:
    """HTML5 drag and drop with the mouse. Pressing the mouse in a cell's
    output makes JupyterLab activate that cell and scroll it into view, so
    the target's position is read again once it has stopped moving."""
    source.click()  # activates the cell now, so it is scrolled before the drag starts
    page.wait_for_timeout(500)
    source.scroll_into_view_if_needed()
    box = source.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 2 + 5, box["y"] + box["height"] / 2 + 5, steps=2)
    target.scroll_into_view_if_needed()
    seen = []
    for _ in range(50):  # until the same position three times in a row
        seen.append(target.bounding_box())
        if len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3]:
            break
        page.wait_for_timeout(100)
    for _ in range(10):  # aim again until the pointer is really over the target
        box = target.bounding_box()
        x, y = box["x"] + min(60, box["width"] / 2), box["y"] + box["height"] / 2
        page.mouse.move(x, y, steps=3)
        page.wait_for_timeout(100)
        if target.evaluate("(el, [x, y]) => el.contains(document.elementFromPoint(x, y))", [x, y]):
            break
    page.mouse.up()


class Lab:
    """One JupyterLab and one chromium shared by the browser tests of a test process (starting
    them takes longer than most tests). Each test module opens its notebook in a context of its
    own with `notebook`, which shuts the notebook's kernel down when the module is done."""

    def __init__(self, root: pathlib.Path, url: str, chromium: Any):
        self.root, self.url, self.browser = root, url, chromium

    @contextlib.contextmanager
    def notebook(self, name: str, cells: list[str], width: int = 1400, height: int = 1000,
                 permissions: tuple[str, ...] = ()) -> Iterator[Notebook]:
        write_notebook(self.root / name, cells)
        context = self.browser.new_context(viewport={"width": width, "height": height})
        if permissions:
            context.grant_permissions(list(permissions), origin=self.url)
        try:
            # a workspace of its own: the shared one would reopen the notebooks of earlier modules
            stem = pathlib.Path(name).stem
            yield Notebook(context.new_page(), self.url, f"{name}?reset", path=f"lab/workspaces/{stem}/tree")
        finally:
            context.close()
            self.shutdown(name)

    def shutdown(self, name: str) -> None:
        """Shut down the kernels of notebook ``name`` (a closed page leaves them running)."""
        with urllib.request.urlopen(f"{self.url}/api/sessions", timeout=10) as r:
            sessions = json.load(r)
        for s in sessions:
            if s.get("path", "").endswith(name):
                req = urllib.request.Request(f"{self.url}/api/sessions/{s['id']}", method="DELETE")
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(req, timeout=30).close()
