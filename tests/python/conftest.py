"""Fixtures for the Python tests: the real vLLM test upstream and a specd in front of it."""

import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _upstream() -> str:
    url = os.environ.get("SPECD_TEST_UPSTREAM")
    if url:
        return url
    out = subprocess.run(
        ["bash", str(ROOT / "scripts/vllm-cpu-upstream.sh"), "start"],
        check=True, capture_output=True, text=True,
    ).stdout
    return [l for l in out.splitlines() if l.startswith("UPSTREAM=")][-1].split("=", 1)[1]


@pytest.fixture(scope="session")
def upstream() -> str:
    return _upstream()


def start_specd(upstream: str, *extra: str):
    binary = os.environ.get("SPECD_BIN", str(ROOT / "target/release/specd"))
    proc = subprocess.Popen(
        [binary, "serve", "--upstream", upstream, "--listen", "127.0.0.1:0", "--health-interval", "0.2", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        # As the Rust tests: a call to the CPU vLLM on a loaded machine can outlast the
        # 30 s verify timeout meant for a GPU server.
        env={**os.environ, "SPECD_VERIFY_TIMEOUT": os.environ.get("SPECD_VERIFY_TIMEOUT", "300")},
    )
    url = None
    # As the Rust tests' READY_TIMEOUT: generous, since only a failing start waits it out
    # (a busy 2-core machine can take minutes to detect and check the upstream).
    deadline = time.time() + 300
    while url is None and time.time() < deadline:
        line = proc.stderr.readline()
        if "api listening on http://" in line:
            url = line.split("listening on ", 1)[1].strip()
    assert url, "specd did not report its address"
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(url + "/readyz", timeout=2).status == 200:
                return proc, url
        except Exception:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("specd not ready")


@pytest.fixture(scope="session")
def specd(upstream):
    proc, url = start_specd(upstream, "--speculation", "on", "--max-draft-tokens", "4")
    yield url
    proc.terminate()
    proc.wait(10)
