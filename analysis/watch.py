"""python -m harness report --watch: the report rewritten whenever the store changes, and served.

Every `interval` seconds it lists the store (each sweep's row files and manifest, their sizes
and modification times: what a landing row, a new sweep or a compaction changes) and, when that
differs, rewrites REPORT.md and index.html with a stamp of the listing (octlm_analysis.page: the
page loads stamp.js every few seconds and reloads itself when the stamp changes, keeping the
reader's place). A sweep whose files did not change is not read again (octlm_analysis.point_lines).
The report folder is served on http://127.0.0.1:PORT meanwhile (a thread of http.server;
port 0: any free one); the page works as well opened from the disk. Ctrl-C stops it between
two writes or during one, whose files are written whole or not at all (harness.files).
"""

import functools
import sys
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from harness import files, store
from harness.errors import BadInput
from octlm_analysis.page import PAGE, stamp_of
from octlm_analysis.point_lines import fingerprint
from octlm_analysis.report import write_report


def watch(
    results: Path,
    report_dir: Path,
    config_dirs: list[Path],
    choose,
    port: int,
    interval: float,
    page_dir: Path | None = None,
    current_claims: bool = False,
) -> int:
    """Rewrite the report (in page_dir: the chosen sweeps' page) whenever rows land, and serve
    report_dir, which holds every page and their plots."""
    report_dir.mkdir(parents=True, exist_ok=True)
    try:
        server = _serve(report_dir, port) if port >= 0 else None
    except OSError as error:  # the port is taken, or not ours to take
        print(f"error: cannot serve on port {port}: {error.strerror}", file=sys.stderr)
        return 2
    page = (page_dir or report_dir) / PAGE
    where = (f"http://127.0.0.1:{server.server_address[1]}/{page.relative_to(report_dir)}"
             if server else page.resolve().as_uri())  # fmt: skip
    print(f"watching {results}; the page: {where} (Ctrl-C stops)", flush=True)
    # choose(): the sweeps to show (as --sweep and --all say), asked again at every write
    seen = None
    try:
        while True:
            listing = listed(results)
            if listing != seen:
                began = time.perf_counter()
                write_report(results, report_dir, config_dirs, choose(), stamp_of(*listing),
                             page_dir, current_claims)  # fmt: skip
                seen = listing
                print(f"{time.strftime('%H:%M:%S')} report written in "
                      f"{time.perf_counter() - began:.1f} s", flush=True)  # fmt: skip
            time.sleep(interval)
    except KeyboardInterrupt:
        print("\nstopped", file=sys.stderr)
        return 0
    except BadInput as error:  # a --sweep that is gone
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        if server:
            server.shutdown()


def listed(results: Path) -> list[str]:
    """Every sweep's row files and manifest with their sizes and modification times
    (octlm_analysis.point_lines.fingerprint: what a report reads), sorted."""
    return [
        f"{experiment}/{sweep}/{name} {size} {mtime}"
        for experiment in store.experiments(results)
        for sweep in store.sweeps(results, experiment)
        for name, size, mtime in fingerprint(store.SweepPaths(results, experiment, sweep).folder)
    ]


class _Served(SimpleHTTPRequestHandler):
    """The report folder's own files, to this machine's own page: no symlink followed (a link
    in outputs/report could name any file), no folder listed, and no request whose Host is not
    this address (a page elsewhere whose name resolves here: DNS rebinding)."""

    def log_message(self, *args) -> None:  # the page polls every few seconds: no log per poll
        pass

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def send_head(self):
        port = self.server.server_address[1]
        hosts = {f"{name}:{port}" for name in ("127.0.0.1", "localhost")}
        if self.headers.get("Host", "") not in hosts:
            self.send_error(403, "not this server's host")
            return None
        path = Path(self.translate_path(self.path))
        if _through_a_link(Path(self.directory), path / "index.html" if path.is_dir() else path):
            self.send_error(404, "not a file of the report")
            return None
        return super().send_head()

    def list_directory(self, path):
        self.send_error(404, "not a file of the report")
        return None


def _through_a_link(root: Path, path: Path) -> bool:
    """Whether `path` lies outside `root` or is reached through a symlink below it."""
    try:
        files.no_links(path, depth=len(path.relative_to(root).parts))
    except (ValueError, files.Linked):  # outside the root (relative_to), or through a link
        return True
    return False


def _serve(folder: Path, port: int) -> ThreadingHTTPServer:
    handler = functools.partial(_Served, directory=str(folder))
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
