"""`apmw bench` against a real HTTP server that answers every completion with HTTP 500: the counts come with the
first fault's reason on stderr, and a run where no call succeeded is an error, not exit 0 with a table of zeros
(fuzz round 8: the reason was only in the results file).

The server is Python's own ``http.server`` on a loopback port, started here: a real socket and real HTTP
replies, a failing server by design."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.e2e.test_cli import EXAMPLES

APMW = [sys.executable, "-c", "from apmw.cli import main; main()"]


class _Failing(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(200, {"data": [{"id": "m"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send(500, {"error": "boom"})


@pytest.fixture
def failing_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("as_json", [False, True])
def test_a_server_that_fails_every_call_is_an_error_with_its_reason(failing_server, tmp_path, as_json):
    r = subprocess.run([*APMW, "bench", str(EXAMPLES / "support-chat.yaml"), "--endpoint", failing_server,
                        "--model", "m", "--agents", "1", "--duration-s", "2", "--warmup-s", "0", "--no-live",
                        "--out", str(tmp_path / "run.jsonl"), *(["--json"] if as_json else [])],
                       capture_output=True, text=True, timeout=120)
    said = " ".join(r.stderr.split())
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    assert "calls failed at 1 agents, the warm-up's included (server_error" in said and "0 succeeded" in said
    assert "the first: server_error: HTTP 500" in said and "boom" in said
    assert "error: no call succeeded" in said and str(tmp_path / "run.jsonl") in said
    if not as_json:         # the table into a pipe is printed whole (rich cut it to 80 columns: "tas…", "fai…")
        assert "…" not in r.stdout and "failed" in r.stdout
    if as_json:
        doc = json.loads(r.stdout)
        assert doc["levels"][0]["first_fault"]["fault"] == "server_error"
        assert doc["levels"][0]["errors"] >= 1
