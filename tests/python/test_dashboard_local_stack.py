"""Tests of deploy/local/{up,down,load}.sh with a stand-in for the specd binary.

The stand-in answers like specd does on the outside (the "listening on" line, /readyz,
/livez, /metrics with every dashboard metric, /v1/models, 400 on a malformed body), so the
scripts' process handling, state file, Prometheus wiring and clean-up are tested without
building specd. The real binary in front of the real vLLM is exercised by the test suite.

Run: python3 -m pytest tests/python/test_dashboard_local_stack.py
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

STUB = textwrap.dedent(
    """\
    #!{python}
    import json, sys, threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    sys.path.insert(0, {tests!r})
    import types
    sys.modules.setdefault("pytest", types.SimpleNamespace(
        mark=types.SimpleNamespace(skipif=lambda *a, **k: (lambda f: f))))
    from test_dashboard_check import exposition

    args = sys.argv[1:]
    assert args[0] == "serve", args
    listen = args[args.index("--listen") + 1]
    host, port = listen.rsplit(":", 1)
    tick = [0]

    class H(BaseHTTPRequestHandler):
        def reply(self, code, body, ctype="application/json"):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path in ("/readyz", "/livez"):
                self.reply(200, "ok", "text/plain")
            elif self.path == "/metrics":
                tick[0] += 1
                self.reply(200, exposition(tick[0]), "text/plain; version=0.0.4")
            elif self.path == "/v1/models":
                self.reply(200, json.dumps({{"data": [{{"id": "stub-model"}}]}}))
            else:
                self.reply(404, "{{}}")

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                json.loads(body)
            except ValueError:
                self.reply(400, '{{"error": "bad request"}}')
                return
            self.reply(200, '{{"choices": []}}')

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer((host, int(port)), H)
    print(f"specd api listening on http://{{host}}:{{srv.server_address[1]}}", file=sys.stderr, flush=True)
    srv.serve_forever()
    """
)


@pytest.fixture
def stack(tmp_path):
    stub = tmp_path / "specd-stub"
    stub.write_text(STUB.format(python=sys.executable, tests=str(Path(__file__).parent)))
    stub.chmod(0o755)
    env = dict(os.environ, SPECD_LOCAL_STATE=str(tmp_path / "state"), SPECD_BIN=str(stub),
               SPECD_SCRAPE_INTERVAL="1s")
    yield env, tmp_path / "state"
    subprocess.run(["bash", str(ROOT / "deploy/local/down.sh")], env=env, capture_output=True)


def read_env(state):
    return dict(line.split("=", 1) for line in (state / "env").read_text().split())


def alive(pid):
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.skipif(shutil.which("prometheus") is None and os.geteuid() != 0,
                    reason="prometheus not installed and cannot be installed without root")
def test_up_load_check_down(stack):
    env, state = stack
    up = subprocess.run(["bash", str(ROOT / "deploy/local/up.sh"), "--upstream", "http://127.0.0.1:9"],
                        env=env, capture_output=True, text=True, timeout=180)
    assert up.returncode == 0, up.stderr
    urls = read_env(state)
    assert urls["UPSTREAM_URL"] == "http://127.0.0.1:9"
    assert "STARTED_VLLM" not in urls
    assert f"curl -sN {urls['SPECD_URL']}/v1/completions" in up.stdout
    assert '"model": "stub-model"' in up.stdout
    with urllib.request.urlopen(urls["PROMETHEUS_URL"] + "/api/v1/targets") as r:
        targets = json.load(r)["data"]["activeTargets"]
    assert [t["scrapeUrl"] for t in targets] == [urls["SPECD_URL"] + "/metrics"]

    again = subprocess.run(["bash", str(ROOT / "deploy/local/up.sh")], env=env,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "already recorded" in again.stderr

    load = subprocess.run(["bash", str(ROOT / "deploy/local/load.sh"), urls["SPECD_URL"], "1"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert load.returncode == 0, load.stderr
    assert "200" in load.stdout and "400" in load.stdout

    check = subprocess.run(
        ["bash", str(ROOT / "scripts/prometheus-check.sh"), "--specd", urls["SPECD_URL"],
         "--load", 'deploy/local/load.sh "$SPECD_URL" 1'],
        env=env, capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert check.returncode == 0, check.stdout + check.stderr

    down = subprocess.run(["bash", str(ROOT / "deploy/local/down.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    assert not (state / "env").exists()
    assert not alive(urls["SPECD_PID"]) and not alive(urls["PROMETHEUS_PID"])


def test_up_cleans_up_when_specd_fails(stack, tmp_path):
    env, state = stack
    bad = tmp_path / "specd-bad"
    bad.write_text("#!/bin/sh\necho 'error: cannot bind' >&2\nexit 3\n")
    bad.chmod(0o755)
    env = dict(env, SPECD_BIN=str(bad))
    up = subprocess.run(["bash", str(ROOT / "deploy/local/up.sh"), "--upstream", "http://127.0.0.1:9"],
                        env=env, capture_output=True, text=True, timeout=120)
    assert up.returncode != 0
    assert "specd exited" in up.stderr and "cannot bind" in up.stderr
    assert not (state / "env").exists(), "a failed start must not leave a recorded stack"
