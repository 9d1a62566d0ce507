"""Tests of the dashboard tooling: the dashboard JSON, its metric list, and
scripts/prometheus-check.sh against a real Prometheus scraping a stand-in exporter.

The stand-in serves every metric specd registers (names and labels as in src/metrics.rs)
with values that grow on each scrape, so the check can be proven to pass when all metrics
are there and to fail, naming the panel, when one is missing. The end-to-end check against
the real specd binary is run by the integration suite.

Run: python3 -m pytest tests/python/test_dashboard_check.py
(needs Debian's prometheus package, which prometheus-check.sh installs when missing).
"""

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import dashboard_metrics  # noqa: E402

DASHBOARD = ROOT / "dashboards" / "specd.json"

DRAFTERS = ["ngram", "suffix"]
MODES = ["passthrough", "speculate", "relay"]
LATENCY = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60]
COUNTS = list(range(17))

# name, type, {label: values}, buckets
METRICS = [
    ("specd_build_info", "gauge", {"version": ["0.1.0"], "git_sha": ["abc"]}, None),
    ("specd_upstream_info", "gauge",
     {"kind": ["vllm"], "model": ["m"], "version": ["0.32.0"], "max_model_len": ["2048"]}, None),
    ("specd_upstream_ready", "gauge", {}, None),
    ("specd_requests_total", "counter",
     {"route": ["completions", "chat_completions"], "mode": MODES, "status": ["200", "400"]}, None),
    ("specd_request_duration_seconds", "histogram", {"route": ["completions"], "mode": MODES}, LATENCY),
    ("specd_time_to_first_token_seconds", "histogram", {"mode": MODES}, LATENCY),
    ("specd_time_per_output_token_seconds", "histogram", {"mode": MODES}, LATENCY),
    ("specd_output_tokens_total", "counter", {"mode": MODES}, None),
    ("specd_active_streams", "gauge", {"mode": MODES}, None),
    ("specd_upstream_errors_total", "counter",
     {"kind": ["connect", "timeout", "status", "protocol"]}, None),
    ("specd_passthrough_total", "counter", {"reason": ["client_off", "n_gt_1", "not_paying"]}, None),
    ("specd_rejected_requests_total", "counter",
     {"reason": ["bad_request", "too_large", "overloaded", "unauthorized"]}, None),
    ("specd_spec_decode_num_drafts_total", "counter", {"drafter": DRAFTERS}, None),
    ("specd_spec_decode_num_draft_tokens_total", "counter", {"drafter": DRAFTERS}, None),
    ("specd_spec_decode_num_accepted_tokens_total", "counter", {"drafter": DRAFTERS}, None),
    ("specd_spec_decode_num_accepted_tokens_per_pos_total", "counter",
     {"drafter": DRAFTERS, "position": ["0", "1", "2", "3"]}, None),
    ("specd_spec_decode_accepted_length", "histogram", {"drafter": DRAFTERS}, COUNTS),
    ("specd_spec_rounds_per_request", "histogram", {"drafter": DRAFTERS}, [1, 2, 5, 10, 50, 100]),
    ("specd_verify_duration_seconds", "histogram", {"kind": ["vllm"]}, LATENCY),
    ("specd_draft_duration_seconds", "histogram", {"drafter": DRAFTERS}, LATENCY),
    ("specd_proxy_overhead_seconds", "histogram", {"scope": ["round", "request"]}, LATENCY),
    ("specd_controller_chosen_k", "histogram", {"drafter": DRAFTERS}, COUNTS),
    ("specd_controller_decode_cost_seconds", "gauge", {}, None),
    ("specd_controller_verify_cost_seconds", "gauge", {"k": [str(k) for k in range(9)]}, None),
    ("specd_controller_estimated_speedup", "gauge", {"drafter": DRAFTERS}, None),
    ("specd_controller_realized_speedup", "gauge", {}, None),
    ("specd_controller_auto_speculated_share", "gauge", {}, None),
    ("specd_mode_seconds_total", "counter", {"mode": MODES}, None),
    ("specd_mode_switches_total", "counter",
     {"from": ["relay", "speculate"], "to": ["speculate", "relay"]}, None),
    ("specd_draft_overlap_total", "counter", {"outcome": ["hit", "miss"]}, None),
    ("process_resident_memory_bytes", "gauge", {}, None),
    ("process_cpu_seconds_total", "counter", {}, None),
    ("process_open_fds", "gauge", {}, None),
]


def label_sets(labels):
    sets = [{}]
    for key, values in labels.items():
        sets = [dict(s, **{key: v}) for s in sets for v in values]
    return sets


def fmt(labels):
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def exposition(tick, omit=()):
    """Exposition text; counters and histograms grow with `tick`."""
    out = []
    for name, kind, labels, buckets in METRICS:
        if name in omit:
            continue
        unit_help = name.replace("_", " ")
        out.append(f"# HELP {name} {unit_help}")
        out.append(f"# TYPE {name} {kind}")
        for i, ls in enumerate(label_sets(labels)):
            if kind == "gauge":
                out.append(f"{name}{fmt(ls)} {1 + (i % 3)}")
            elif kind == "counter":
                out.append(f"{name}{fmt(ls)} {tick * (i + 1)}")
            else:
                n = tick * (i + 1)
                for j, le in enumerate(buckets):
                    cum = n * (j + 1) // len(buckets)
                    out.append(f"{name}_bucket{fmt(dict(ls, le=str(le)))} {cum}")
                out.append(f"{name}_bucket{fmt(dict(ls, le='+Inf'))} {n}")
                out.append(f"{name}_sum{fmt(ls)} {n * buckets[len(buckets) // 2]}")
                out.append(f"{name}_count{fmt(ls)} {n}")
    return "\n".join(out) + "\n"


class Exporter:
    def __init__(self, omit=()):
        self.tick = 0
        self.omit = set(omit)
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                exporter.tick += 1
                body = exposition(exporter.tick, exporter.omit).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def run_check(url, *extra):
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "prometheus-check.sh"), "--specd", url, *extra],
        capture_output=True, text=True, timeout=300,
    )


def test_dashboard_json_is_generated_from_builder():
    r = subprocess.run([sys.executable, str(ROOT / "dashboards" / "build_specd.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_metric_list_file_matches_dashboard():
    names = subprocess.run([sys.executable, str(ROOT / "scripts" / "dashboard_metrics.py"), "names"],
                           capture_output=True, text=True, check=True).stdout
    assert names == (ROOT / "dashboards" / "metrics.txt").read_text()


def test_dashboard_uses_only_known_metrics():
    known = {name for name, *_ in METRICS}
    _, queries = dashboard_metrics.load_queries(DASHBOARD)
    used = set()
    for q in queries:
        used |= {dashboard_metrics.base_name(n) for n in dashboard_metrics.metric_names(q.expr)}
    assert used <= known, used - known
    assert {n for n in known if n.startswith("specd_")} <= used, "a specd metric has no panel"


def test_datasource_is_a_variable_everywhere():
    doc = json.loads(DASHBOARD.read_text())
    for p in dashboard_metrics.walk_panels(doc["panels"]):
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
    ids = [p["id"] for p in dashboard_metrics.walk_panels(doc["panels"])]
    assert len(ids) == len(set(ids))


def test_metric_names_parser():
    names = dashboard_metrics.metric_names(
        'histogram_quantile(0.5, sum by (mode, le) (rate(a_seconds_bucket{job=~"x", m="b_c"}[5m])))'
        " / on (drafter) group_left sum by (drafter) (rate(b_total[1m])) or vector(0)"
    )
    assert names == {"a_seconds_bucket", "b_total"}
    assert dashboard_metrics.base_name("a_seconds_bucket") == "a_seconds"


def test_substitution_covers_every_variable():
    doc, queries = dashboard_metrics.load_queries(DASHBOARD)
    for q in queries:
        expr = dashboard_metrics.substitute(q.expr, doc, "30s", "5m")
        assert "$" not in expr, expr


needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None and os.geteuid() != 0,
    reason="prometheus not installed and cannot be installed without root",
)


@needs_prometheus
def test_check_passes_when_every_metric_is_exported():
    with Exporter() as ex:
        r = run_check(ex.url, "--load", 'curl -sf "$SPECD_URL/metrics" >/dev/null')
    assert r.returncode == 0, r.stdout + r.stderr
    assert " 0 failed" in r.stdout


@needs_prometheus
def test_check_fails_and_names_the_panel_when_a_metric_is_missing():
    with Exporter(omit={"specd_draft_overlap_total", "specd_verify_duration_seconds"}) as ex:
        r = run_check(ex.url, "--no-metrics-lint")
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'panel "Pre-drafted rounds" (A): NO DATA' in r.stdout
    assert 'panel "Verify latency" (A): NO DATA' in r.stdout
    assert " 4 failed" in r.stdout  # 1 overlap + 3 verify quantiles


@needs_prometheus
def test_check_fails_when_the_metrics_lint_fails():
    with Exporter() as ex:
        METRICS.append(("specd_bad_counter", "counter", {}, None))
        try:
            r = run_check(ex.url)
        finally:
            METRICS.pop()
    assert r.returncode == 1
    assert "specd_bad_counter" in r.stderr


def test_check_reports_unreachable_specd():
    r = run_check("http://127.0.0.1:9")
    assert r.returncode != 0
    assert "cannot read" in r.stderr

