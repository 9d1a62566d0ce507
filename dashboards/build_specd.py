#!/usr/bin/env python3
"""Write dashboards/specd.json, the Grafana dashboard for specd.

The dashboard is generated so that every query uses the same selectors and the same
histogram-quantile shape. Edit this file, then run it:

    python3 dashboards/build_specd.py            # rewrite dashboards/specd.json
    python3 dashboards/build_specd.py --check    # exit 1 if specd.json is stale

Metric names follow the list registered by specd (src/metrics.rs).
"""

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).with_name("specd.json")
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'job=~"$job", instance=~"$instance"'
RI = "$__rate_interval"
RANGE = "$__range"


def m(name, extra=""):
    """A metric selector restricted to the chosen job and instance."""
    return f"{name}{{{SEL}{', ' + extra if extra else ''}}}"


def rate(name, by=None, extra="", window=RI, fn="rate"):
    inner = f"{fn}({m(name, extra)}[{window}])"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def ratio(num, den, by=None, window=RI, fn="rate"):
    return f"{rate(num, by, window=window, fn=fn)} / {rate(den, by, window=window, fn=fn)}"


def quantile(q, hist, by):
    return (
        f"histogram_quantile({q}, sum by ({by}, le) "
        f"(rate({m(hist + '_bucket')}[{RI}])))"
    )


def mean(hist, by):
    return ratio(hist + "_sum", hist + "_count", by)


def quantiles(hist, by, qs=(0.5, 0.95, 0.99)):
    legend = " ".join("{{%s}}" % b.strip() for b in by.split(","))
    return [(quantile(q, hist, by), f"p{round(q * 100)} {legend}") for q in qs]


class Builder:
    def __init__(self):
        self.panels = []
        self.y = 0
        self.next_id = 1

    def _id(self):
        self.next_id += 1
        return self.next_id - 1

    def row(self, title):
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "id": self._id(),
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "panels": [],
            }
        )
        self.y += 1

    def line(self, height, *panels):
        """Place panels side by side; their widths must add up to 24."""
        x = 0
        for width, panel in panels:
            panel["id"] = self._id()
            panel["gridPos"] = {"h": height, "w": width, "x": x, "y": self.y}
            x += width
            self.panels.append(panel)
        assert x == 24, f"line at y={self.y} is {x} wide"
        self.y += height


def targets(queries, instant=False, table=False):
    out = []
    for i, (expr, legend) in enumerate(queries):
        t = {"datasource": DS, "refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
        if instant:
            t.update({"instant": True, "range": False})
        else:
            t.update({"instant": False, "range": True})
        if table:
            t["format"] = "table"
        out.append(t)
    return out


def timeseries(title, desc, queries, unit="short", threshold=None, stack=False, decimals=None):
    defaults = {
        "unit": unit,
        "color": {"mode": "palette-classic"},
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
            "thresholdsStyle": {"mode": "line" if threshold is not None else "off"},
        },
        "thresholds": {
            "mode": "absolute",
            "steps": [{"color": "green", "value": None}]
            + ([{"color": "red", "value": threshold}] if threshold is not None else []),
        },
    }
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets(queries),
    }


def stat(title, desc, queries, unit="short", decimals=2, steps=None, mappings=None):
    return {
        "type": "stat",
        "title": title,
        "description": desc,
        "datasource": DS,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "decimals": decimals,
                "color": {"mode": "thresholds"},
                "thresholds": {
                    "mode": "absolute",
                    "steps": steps or [{"color": "blue", "value": None}],
                },
                "mappings": mappings or [],
            },
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none",
            "textMode": "auto",
            "orientation": "auto",
            "justifyMode": "auto",
        },
        "targets": targets(queries, instant=True),
    }


def bargauge(title, desc, queries, unit="percentunit", vmax=1):
    return {
        "type": "bargauge",
        "title": title,
        "description": desc,
        "datasource": DS,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "min": 0,
                "max": vmax,
                "decimals": 2,
                "color": {"mode": "continuous-BlYlRd"},
                "thresholds": {"mode": "absolute", "steps": [{"color": "green", "value": None}]},
            },
            "overrides": [],
        },
        "options": {
            "orientation": "horizontal",
            "displayMode": "gradient",
            "showUnfilled": True,
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        },
        "targets": targets(queries, instant=True),
    }


def table(title, desc, queries):
    return {
        "type": "table",
        "title": title,
        "description": desc,
        "datasource": DS,
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {"showHeader": True, "cellHeight": "sm"},
        "transformations": [
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True}
                },
            },
        ],
        "targets": targets(queries, instant=True, table=True),
    }


ACC = "specd_spec_decode_num_accepted_tokens_total"
DRAFT = "specd_spec_decode_num_draft_tokens_total"
ROUNDS = "specd_spec_decode_num_drafts_total"
PER_POS = "specd_spec_decode_num_accepted_tokens_per_pos_total"
CHOSEN_K = "specd_controller_chosen_k"


def build():
    b = Builder()

    b.row("Overview")
    b.line(
        4,
        (4, stat(
            "Upstream ready",
            "1 while specd's health check of the upstream server passes.",
            [(f"min({m('specd_upstream_ready')})", "")],
            decimals=0,
            steps=[{"color": "red", "value": None}, {"color": "green", "value": 1}],
            mappings=[{"type": "value", "options": {
                "0": {"text": "not ready", "color": "red"},
                "1": {"text": "ready", "color": "green"}}}],
        )),
        (4, stat(
            "Estimated speedup",
            "The controller's estimate of speculative over plain decoding, per drafter "
            "(below 1: specd relays instead of speculating).",
            [(f"max by (drafter) ({m('specd_controller_estimated_speedup')})", "{{drafter}}")],
            unit="none",
            steps=[{"color": "orange", "value": None}, {"color": "green", "value": 1}],
        )),
        (4, stat(
            "Acceptance rate",
            "Accepted over proposed draft tokens in the time range.",
            [(ratio(ACC, DRAFT, window=RANGE, fn="increase"), "")],
            unit="percentunit",
        )),
        (4, stat(
            "Tokens per round",
            "Mean tokens emitted per speculative round in the time range "
            "(accepted drafts + the target's own token).",
            [("1 + " + ratio(ACC, ROUNDS, window=RANGE, fn="increase"), "")],
        )),
        (4, stat(
            "Output tokens/s",
            "Tokens sent to clients per second, all modes.",
            [(rate("specd_output_tokens_total"), "")],
            decimals=1,
        )),
        (4, stat(
            "Non-2xx share",
            "Share of finished requests whose status was not 2xx.",
            [("1 - " + rate("specd_requests_total", extra='status=~"2.."') + " / "
              + rate("specd_requests_total"), "")],
            unit="percentunit",
            steps=[{"color": "green", "value": None}, {"color": "red", "value": 0.01}],
        )),
    )
    b.line(
        5,
        (16, table(
            "Upstream and build",
            "The upstream server specd detected at start, and specd's own build.",
            [(m("specd_upstream_info"), ""), (m("specd_build_info"), "")],
        )),
        (4, stat(
            "In-flight streams",
            "Client streams open now, all modes.",
            [(f"sum({m('specd_active_streams')})", "")],
            decimals=0,
        )),
        (4, stat(
            "Resident memory",
            "specd's resident set size.",
            [(f"max({m('process_resident_memory_bytes')})", "")],
            unit="bytes",
            decimals=1,
        )),
    )

    b.row("Speculation: acceptance")
    b.line(
        8,
        (8, timeseries(
            "Acceptance rate",
            "Accepted draft tokens over proposed draft tokens.",
            [(ratio(ACC, DRAFT), "all"), (ratio(ACC, DRAFT, "drafter"), "{{drafter}}")],
            unit="percentunit",
        )),
        (8, timeseries(
            "Mean accepted length (tokens per round)",
            "Tokens emitted per speculative round: accepted drafts plus the token the "
            "target sampled itself. Above the verify/decode cost ratio, speculation pays.",
            [("1 + " + ratio(ACC, ROUNDS), "all"),
             ("1 + " + ratio(ACC, ROUNDS, "drafter"), "{{drafter}}")],
            decimals=2,
        )),
        (8, bargauge(
            "Acceptance by position",
            "Share of rounds in the time range whose draft token at this position was "
            "accepted.",
            [(f"sum by (position) (increase({m(PER_POS)}[{RANGE}])) / "
              f"scalar({rate(ROUNDS, window=RANGE, fn='increase')})", "pos {{position}}")],
        )),
    )
    b.line(
        8,
        (12, timeseries(
            "Acceptance by position and drafter",
            "Share of a drafter's rounds whose draft token at this position was accepted.",
            [(f"{rate(PER_POS, 'drafter, position')} / on (drafter) group_left "
              f"{rate(ROUNDS, 'drafter')}", "{{drafter}} #{{position}}")],
            unit="percentunit",
        )),
        (12, timeseries(
            "Accepted draft tokens per round",
            "Distribution of accepted draft tokens per round, by drafter.",
            [(mean("specd_spec_decode_accepted_length", "drafter"), "mean {{drafter}}")]
            + quantiles("specd_spec_decode_accepted_length", "drafter", (0.5, 0.9)),
            decimals=1,
        )),
    )

    b.row("Controller: why is specd (not) speculating")
    b.line(
        8,
        (8, timeseries(
            "Speedup vs plain decoding: estimated and realized",
            "The controller's estimate, per drafter, of tokens/s when speculating over "
            "tokens/s of plain decoding (below the line at 1 it picks K = 0, relay); and "
            "the outcome: how much faster recent watched auto requests that speculated were "
            "than plain decoding of them would have been. While the realized speedup is below 1, or under 2 % of "
            "their tokens came from speculation, most auto requests pass through untouched "
            "(reason not_paying).",
            [
                (f"max by (drafter) ({m('specd_controller_estimated_speedup')})", "{{drafter}}"),
                (f"max({m('specd_controller_realized_speedup')})", "realized"),
                (f"max({m('specd_controller_auto_speculated_share')})", "speculated share"),
            ],
            unit="none",
            threshold=1,
            decimals=2,
        )),
        (8, timeseries(
            "Decode cost vs verify cost by K",
            "Measured plain decode cost per token and verify round cost for each draft "
            "length K. A round of K drafts pays when it emits more than "
            "verify(K) / decode tokens.",
            [(f"max({m('specd_controller_decode_cost_seconds')})", "decode / token"),
             (f"max by (k) ({m('specd_controller_verify_cost_seconds')})", "verify K={{k}}")],
            unit="s",
        )),
        (8, timeseries(
            "Chosen K",
            "Draft length the controller picks per round (0 = relay), by drafter.",
            [(mean(CHOSEN_K, "drafter"), "mean {{drafter}}")]
            + quantiles(CHOSEN_K, "drafter", (0.5, 0.9)),
            decimals=1,
        )),
    )
    b.line(
        8,
        (8, bargauge(
            "Chosen K distribution",
            "Share of rounds in the time range whose chosen K was at most the bucket bound.",
            [(f"sum by (le) (increase({m(CHOSEN_K + '_bucket')}[{RANGE}])) / "
              f"scalar({rate(CHOSEN_K + '_count', window=RANGE, fn='increase')})",
              "K ≤ {{le}}")],
        )),
        (8, timeseries(
            "Stream time by mode",
            "Average number of streams in each mode (seconds spent per second).",
            [(rate("specd_mode_seconds_total", "mode"), "{{mode}}")],
            stack=True,
        )),
        (8, timeseries(
            "Passthrough reasons",
            "Requests forwarded unchanged, per second, by the reason speculation was "
            "not used.",
            [(rate("specd_passthrough_total", "reason"), "{{reason}}")],
            unit="reqps",
        )),
    )

    b.row("Throughput")
    b.line(
        8,
        (8, timeseries(
            "Output tokens/s by mode",
            "Tokens sent to clients per second.",
            [(rate("specd_output_tokens_total", "mode"), "{{mode}}")],
            stack=True,
        )),
        (8, timeseries(
            "Mode switches",
            "Switches per second between relaying and speculating within streams.",
            [(rate("specd_mode_switches_total", "from, to"), "{{from}} → {{to}}")],
        )),
        (8, timeseries(
            "Pre-drafted rounds",
            "Drafts prepared during the previous verify call: used (hit) or discarded "
            "(miss), per second.",
            [(rate("specd_draft_overlap_total", "outcome"), "{{outcome}}")],
        )),
    )

    b.row("Latency")
    b.line(
        8,
        (12, timeseries(
            "Time to first token",
            "p50/p95/p99 of the time to the first streamed token, by mode.",
            quantiles("specd_time_to_first_token_seconds", "mode"),
            unit="s",
        )),
        (12, timeseries(
            "Time per output token",
            "p50/p95/p99 of (last token - first token) / (tokens - 1) per stream, by mode.",
            quantiles("specd_time_per_output_token_seconds", "mode"),
            unit="s",
        )),
    )
    b.line(
        8,
        (8, timeseries(
            "Verify latency",
            "p50/p95/p99 of one verify call to the upstream.",
            quantiles("specd_verify_duration_seconds", "kind"),
            unit="s",
        )),
        (8, timeseries(
            "Draft latency",
            "p50/p95/p99 of one proposal, by drafter.",
            quantiles("specd_draft_duration_seconds", "drafter"),
            unit="s",
        )),
        (8, timeseries(
            "Proxy overhead",
            "p50/p99 of the time specd itself spends, excluding the upstream and drafting, "
            "per round and per request.",
            quantiles("specd_proxy_overhead_seconds", "scope", (0.5, 0.99)),
            unit="s",
        )),
    )
    b.line(
        8,
        (12, timeseries(
            "Request duration",
            "p50/p95 of whole requests, by route and mode.",
            quantiles("specd_request_duration_seconds", "route, mode", (0.5, 0.95)),
            unit="s",
        )),
        (12, timeseries(
            "Rounds per speculated request",
            "p50/p95 of verify rounds per finished speculated request, by drafter.",
            quantiles("specd_spec_rounds_per_request", "drafter", (0.5, 0.95)),
        )),
    )

    b.row("Traffic and errors")
    b.line(
        8,
        (8, timeseries(
            "Requests by status",
            "Finished client requests per second, by HTTP status.",
            [(rate("specd_requests_total", "status"), "{{status}}")],
            unit="reqps",
        )),
        (8, timeseries(
            "Requests by route and mode",
            "Finished client requests per second.",
            [(rate("specd_requests_total", "route, mode"), "{{route}} {{mode}}")],
            unit="reqps",
        )),
        (8, timeseries(
            "In-flight streams",
            "Client streams open, by mode.",
            [(f"sum by (mode) ({m('specd_active_streams')})", "{{mode}}")],
            stack=True,
        )),
    )
    b.line(
        8,
        (8, timeseries(
            "Upstream errors",
            "Failed upstream calls per second, by kind.",
            [(rate("specd_upstream_errors_total", "kind"), "{{kind}}")],
            unit="reqps",
        )),
        (8, timeseries(
            "Rejected requests",
            "Requests specd refused itself, per second, by reason.",
            [(rate("specd_rejected_requests_total", "reason"), "{{reason}}")],
            unit="reqps",
        )),
        (8, timeseries(
            "Upstream ready",
            "1 while the upstream health check passes.",
            [(f"min by (instance) ({m('specd_upstream_ready')})", "{{instance}}")],
            decimals=0,
        )),
    )

    b.row("Process")
    b.line(
        7,
        (8, timeseries(
            "Resident memory",
            "specd's resident set size (draft model weights and KV caches included).",
            [(m("process_resident_memory_bytes"), "{{instance}}")],
            unit="bytes",
        )),
        (8, timeseries(
            "CPU",
            "CPU seconds used per second.",
            [(f"rate({m('process_cpu_seconds_total')}[{RI}])", "{{instance}}")],
            unit="percentunit",
        )),
        (8, timeseries(
            "Open file descriptors",
            "Sockets and files held by specd.",
            [(m("process_open_fds"), "{{instance}}")],
        )),
    )

    var_ds = {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "options": [],
    }

    def var_query(name, definition):
        return {
            "name": name,
            "label": name,
            "type": "query",
            "datasource": DS,
            "definition": definition,
            "query": {"query": definition, "refId": f"{name}-values"},
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "current": {},
            "hide": 0,
            "refresh": 2,
            "regex": "",
            "sort": 1,
            "options": [],
        }

    return {
        "title": "specd",
        "uid": "specd",
        "description": "specd: speculative decoding in front of vLLM / SGLang",
        "tags": ["specd", "llm", "speculative-decoding"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "links": [],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {
            "list": [
                var_ds,
                var_query("job", "label_values(specd_build_info, job)"),
                var_query("instance", 'label_values(specd_build_info{job=~"$job"}, instance)'),
            ]
        },
        "panels": b.panels,
    }


def render():
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if specd.json is stale")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    text = render()
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is stale: run python3 {sys.argv[0]}", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
