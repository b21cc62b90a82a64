"""JupyterLab as a student meets it: a real `jupyter lab` server, headless Chromium driven by
Playwright, and the few things the browser tests do through the UI (menus, the toolbar, the
keyboard).

The server runs on 127.0.0.1, on a free port, with a random token, and with its own Jupyter
directories (config, data, runtime, settings, workspaces) under a temporary folder, so that
nothing a user configured changes what the tests see. ``LabServer.stop`` ends the server and
every process it started (kernels, and the workers those kernels spawned), found through
``/proc``: each kernel runs in a session of its own, and its workers stay in it.

The DOM selectors used are JupyterLab 4's stable ones: ``.jp-NotebookPanel``, ``.jp-Cell``,
``.jp-InputPrompt``, ``.jp-OutputArea-output``, the toolbar's kernel indicator
``.jp-Notebook-ExecutionIndicator[data-status]``, and menu and toolbar items by their
``data-command`` (the JupyterLab command they run).
"""

from __future__ import annotations

import copy
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import nbformat
from nbformat import NotebookNode

# Debian's chromium is launched as it is, never a browser that Playwright downloads; these flags
# keep it headless and off the network (no updates, sync, field trials or QUIC probes).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
# A common laptop screen: what a student sees at the default zoom.
VIEWPORT = {"width": 1280, "height": 800}

PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
KERNEL_INDICATOR = f"{PANEL} .jp-Notebook-ExecutionIndicator"
CELLS = f"{PANEL} .jp-Notebook .jp-Cell"


# --------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class Proc:
    """One process as /proc shows it; ``start`` (clock ticks after boot) tells a process from a
    later one that reuses its pid."""

    pid: int
    ppid: int
    sid: int
    start: int
    cmdline: str


def _read_proc(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone meanwhile, or not ours to read
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its last ")"
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has exited; only its exit status is left
        return None
    cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return Proc(pid, int(fields[1]), int(fields[3]), int(fields[19]), cmdline)


def processes() -> dict[int, Proc]:
    """Every live process on this machine, by pid."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (proc := _read_proc(int(entry))) is not None:
            found[proc.pid] = proc
    return found


def descendants(pid: int) -> list[Proc]:
    """The live children of ``pid``, their children, and so on."""
    table = processes()
    children = defaultdict(list)
    for proc in table.values():
        children[proc.ppid].append(proc)
    found, todo = [], [pid]
    while todo:
        for child in children[todo.pop()]:
            found.append(child)
            todo.append(child.pid)
    return found


def alive(proc: Proc) -> bool:
    """Whether this very process (not a later one with its pid) still runs."""
    now = _read_proc(proc.pid)
    return now is not None and now.start == proc.start


def spawned_workers(kernel: Proc) -> list[Proc]:
    """The kernel's multiprocessing workers (spawned: ``spawn_main`` in their command line),
    without multiprocessing's resource tracker, which lives as long as the kernel."""
    return [
        p
        for p in descendants(kernel.pid)
        if "spawn_main" in p.cmdline and "resource_tracker" not in p.cmdline
    ]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


# --------------------------------------------------------------------------- the server


class LabServer:
    """``jupyter lab`` serving ``root``, as this Python's JupyterLab, with ``env`` added to the
    environment its kernels inherit."""

    def __init__(self, root: Path, state: Path, env: dict[str, str]):
        self.root, self.state, self.env = root, state, env
        self.port = 0
        self.token = secrets.token_hex(24)
        self.log = state / "jupyter-lab.log"
        self.proc: subprocess.Popen | None = None
        self._sessions: set[int] = set()  # the server's own session and every kernel's
        self._since = 0  # the server's start, in clock ticks after boot

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> None:
        """Start the server and wait until its REST API answers."""
        dirs = {
            "JUPYTER_CONFIG_DIR": "config",
            "JUPYTER_DATA_DIR": "data",
            "JUPYTER_RUNTIME_DIR": "runtime",
            "JUPYTERLAB_SETTINGS_DIR": "settings",
            "JUPYTERLAB_WORKSPACES_DIR": "workspaces",
        }
        # as a student's: ipykernel does not show what the workers write to stderr (their
        # progress, their tracebacks) when it finds PYTEST_CURRENT_TEST set
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | self.env
        for var, name in dirs.items():
            env[var] = str(self.state / name)
            (self.state / name).mkdir(parents=True, exist_ok=True)
        # JupyterLab asks once whether to fetch Jupyter's news from the web: no.
        news = (
            self.state / "settings/@jupyterlab/apputils-extension/notification.jupyterlab-settings"
        )
        news.parent.mkdir(parents=True, exist_ok=True)
        news.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        self.port = free_port()
        args = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",  # fail, rather than serve on another port
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            "--ServerApp.terminals_enabled=False",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.news_url=None",
            "--LabApp.extension_manager=readonly",  # no extension listing from PyPI
        ]
        if os.geteuid() == 0:  # as CI runs (JupyterLab refuses root otherwise)
            args.append("--ServerApp.allow_root=True")
        with open(self.log, "wb") as log:
            # its own session: Ctrl-C in the terminal reaches pytest, whose teardown stops it
            self.proc = subprocess.Popen(
                args,
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if (me := _read_proc(self.proc.pid)) is not None:
            self._since = me.start
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"jupyter lab exited with {self.proc.returncode}:\n{self.tail()}"
                )
            try:
                self.api("GET", "/api/status")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.25)
        raise RuntimeError(f"jupyter lab did not answer within {timeout:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        """The end of the server's log (its kernels' and workers' stderr land there too)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def api(self, method: str, path: str) -> object:
        """One call to the server's REST API, with the token; the decoded JSON answer."""
        request = urllib.request.Request(
            self.url + path, method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def kernel_of(self, notebook: str) -> Proc:
        """The kernel process of the open notebook at ``notebook`` (relative to the root)."""
        sessions = self.api("GET", "/api/sessions")
        kernel_id = next(s["kernel"]["id"] for s in sessions if s["path"] == notebook)
        connection_file = f"kernel-{kernel_id}.json"
        kernel = next(
            p
            for p in descendants(self.proc.pid)
            if "ipykernel" in p.cmdline and connection_file in p.cmdline
        )
        self._sessions.add(kernel.sid)
        return kernel

    def shut_down_notebook(self, notebook: str) -> None:
        """Close the notebook's session and its kernel (through the REST API, not the UI)."""
        for session in self.api("GET", "/api/sessions"):
            if session["path"] == notebook:
                self.api("DELETE", f"/api/sessions/{session['id']}")

    def ours(self) -> list[Proc]:
        """Every live process of the server's tree or of a session it or a kernel started: a
        worker whose kernel died is reparented away from the tree, but keeps its session. (The
        server runs in a session of its own, whose id is its pid.) Only processes started since
        the server count, so that a later session that reuses an old kernel's pid is not ours."""
        if self.proc is None:
            return []
        self._sessions.add(self.proc.pid)
        server = _read_proc(self.proc.pid)
        tree = {p.pid: p for p in descendants(self.proc.pid)}
        if server is not None:
            tree[server.pid] = server
        self._sessions |= {p.sid for p in tree.values()}
        for p in processes().values():
            if p.sid in self._sessions and p.start >= self._since and p.pid != os.getpid():
                tree.setdefault(p.pid, p)
        return list(tree.values())

    def stop(self, grace: float = 20.0) -> list[Proc]:
        """Stop the server as Ctrl-C would (it shuts its kernels down), then kill whatever of
        its processes is left. Returns those that had to be killed."""
        if self.proc is None:
            return []
        before = self.ours()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        left = [p for p in {*before, *self.ours()} if alive(p)]
        for p in left:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(alive(p) for p in left) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.proc = None
        return left


# --------------------------------------------------------------------------- the browser


def launch_browser(playwright, chromium: str, profile: Path):
    """A browser context with a fresh profile in ``profile``. ``chromium`` is the browser's
    path, or ``playwright`` for the build that `playwright install chromium` fetched."""
    options = {"headless": True, "args": list(CHROMIUM_FLAGS), "viewport": VIEWPORT}
    if chromium != "playwright":
        options["executable_path"] = chromium
    context = playwright.chromium.launch_persistent_context(str(profile), **options)
    context.set_default_timeout(60_000)
    return context


def open_notebook(page, lab: LabServer, notebook: str, timeout_s: float = 120.0) -> None:
    """Open ``notebook`` in JupyterLab (a fresh workspace: no other tab) and wait until the
    page is connected to its kernel and shows it idle. The toolbar's indicator alone says
    "idle" before any kernel exists (then "initializing", then "idle" again), and a cell run
    in that moment makes JupyterLab ask which kernel to start; so the server is asked first
    whether a browser is connected to the notebook's kernel."""
    page.goto(f"{lab.url}/lab/tree/{quote(notebook)}?reset&token={lab.token}")
    page.locator(CELLS).first.wait_for()
    deadline = time.monotonic() + timeout_s
    while not any(
        s["path"] == notebook and (s.get("kernel") or {}).get("connections", 0) > 0
        for s in lab.api("GET", "/api/sessions")
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no kernel connected to {notebook} within {timeout_s:.0f} s")
        page.wait_for_timeout(250)
    page.wait_for_function(
        f"() => document.querySelector({KERNEL_INDICATOR!r})?.dataset.status === 'idle'",
        timeout=max(1.0, deadline - time.monotonic()) * 1000,
    )


def menu(page, top: str, command: str) -> None:
    """Click a menu bar entry (``Run``) and the item that runs ``command`` (JupyterLab's
    command id, e.g. ``runmenu:run-all``, shown as "Run All Cells")."""
    page.get_by_role("menuitem", name=top, exact=True).click()
    page.locator(f".lm-Menu .lm-Menu-item[data-command={command!r}]").click()


def toolbar(page, command: str) -> None:
    """Click the notebook toolbar's button for ``command`` (e.g. ``notebook:interrupt-kernel``,
    the square stop button)."""
    page.locator(f"{PANEL} .jp-NotebookPanel-toolbar [data-command={command!r}]").click()


def select_cell(page, index: int) -> None:
    """Make cell ``index`` the active one, in command mode (a click on its prompt)."""
    page.locator(CELLS).nth(index).locator(".jp-InputPrompt").click()


def prompts(page) -> list[str]:
    """Every code cell's prompt as shown: ``[3]:`` ran, ``[*]:`` runs or waits, ``[ ]:`` not
    run; a collapsed cell shows none (``""``)."""
    return page.eval_on_selector_all(
        f"{CELLS}.jp-CodeCell .jp-InputPrompt", "els => els.map(e => e.textContent.trim())"
    )


_RUN_STATE = f"""() => ({{
    status: document.querySelector({KERNEL_INDICATOR!r})?.dataset.status,
    prompts: [...document.querySelectorAll({CELLS + " .jp-InputPrompt"!r})]
        .map(e => e.textContent.trim()),
}})"""


def wait_for_run(page, timeout_s: float, while_waiting: Callable[[], None] | None = None) -> None:
    """Wait until what was asked to run has run: the kernel idle, no cell running or waiting
    (``[*]``), and at least one numbered prompt. Start from blank prompts (a notebook whose
    outputs were cleared), so that a number can only come from this run. ``while_waiting`` is
    called at every look (4 a second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = page.evaluate(_RUN_STATE)
        shown = state["prompts"]
        if (
            state["status"] == "idle"
            and not any("*" in p for p in shown)
            and any(re.fullmatch(r"\[\d+\]:", p) for p in shown)
        ):
            return
        if while_waiting is not None:
            while_waiting()
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"still running after {timeout_s:.0f} s: kernel {state['status']}, "
                f"prompts {' '.join(p for p in shown if p)}"
            )
        page.wait_for_timeout(250)


def save(page, path: Path, timeout_s: float = 30.0) -> NotebookNode:
    """Save the notebook from the toolbar and read the file JupyterLab wrote."""
    before = path.stat().st_mtime_ns
    toolbar(page, "docmanager:save")
    deadline = time.monotonic() + timeout_s
    while path.stat().st_mtime_ns == before:
        if time.monotonic() > deadline:
            raise TimeoutError(f"JupyterLab did not save {path.name} within {timeout_s:.0f} s")
        time.sleep(0.1)
    page.wait_for_selector(".lm-TabBar-tab.jp-mod-current:not(.jp-mod-dirty)")
    return nbformat.read(path, as_version=4)


# --------------------------------------------------------------------------- outputs


def sanitize_patterns(cfg: Path) -> list[tuple[str, str]]:
    """The regex-replace pairs of an nbval sanitize file, read as nbval reads them."""
    from nbval.plugin import get_sanitize_patterns

    return get_sanitize_patterns(cfg.read_text())


def nbval_compares(cell: NotebookNode) -> bool:
    """Whether `pytest --nbval` compares this code cell's outputs (no ``# NBVAL_IGNORE_OUTPUT``
    or ``# NBVAL_SKIP``, as a comment or a tag), by nbval's own marker parsing."""
    from nbval.plugin import find_comment_markers, find_metadata_tags

    options = dict(find_metadata_tags(cell.metadata) or ())
    options.update(find_comment_markers(cell.source))
    return options.get("check", True) and not options.get("skip", False)


def compared_outputs(cell: NotebookNode, patterns: list[tuple[str, str]]) -> dict[str, list]:
    """What nbval compares of a cell's outputs: each stream's text (streams of one name joined)
    and every output's data but images, sanitised, grouped by stream name or MIME type."""
    from nbval.plugin import coalesce_streams

    def clean(text: str) -> str:
        for regex, replace in patterns:
            text = re.sub(regex, replace, text)
        return text

    seen: dict[str, list] = defaultdict(list)
    for out in coalesce_streams(copy.deepcopy(cell.outputs)):
        if out.output_type == "stream":
            seen[out.name].append(clean(out.text))
        elif out.output_type == "error":
            seen["error"].append(f"{out.ename}: {clean(out.evalue)}")
        else:
            for mime, value in out.get("data", {}).items():
                if mime not in ("image/png", "image/jpeg"):
                    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
                    seen[mime].append(clean(text))
    return dict(seen)


def errors(nb: NotebookNode) -> list[tuple[int, str]]:
    """Every error output of the notebook, as (cell index, "Name: message")."""
    return [
        (index, f"{out.ename}: {out.evalue}")
        for index, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.output_type == "error"
    ]
