#!/usr/bin/env python3
"""Read the PromQL of a Grafana dashboard: metric names, expressions, checks.

    dashboard_metrics.py [names]              metric base names used, one per line
    dashboard_metrics.py exprs                expressions with variables substituted
    dashboard_metrics.py rules FILE           write a Prometheus rules file (for promtool)
    dashboard_metrics.py check --prometheus URL
                                              evaluate every expression; exit 1 unless
                                              each returns at least one finite sample

Options common to all: --dashboard PATH (default dashboards/specd.json),
--rate-interval DUR ($__rate_interval, default 30s), --range DUR ($__range, default 5m).
Only the standard library is used, so any python3 runs it.
"""

import argparse
import json
import math
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DASHBOARD = ROOT / "dashboards" / "specd.json"

KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
}
HIST_SUFFIXES = ("_bucket", "_sum", "_count")


class Query:
    """One PromQL expression of the dashboard, with where it came from."""

    def __init__(self, where, expr, legend="", instant=False, panel=None):
        self.where = where
        self.expr = expr
        self.legend = legend
        self.instant = instant
        self.panel = panel


def walk_panels(panels):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def variable_query(var):
    """Turn a Grafana `label_values(...)` variable into an equivalent PromQL query."""
    q = var.get("query")
    if isinstance(q, dict):
        q = q.get("query", "")
    q = (q or var.get("definition") or "").strip()
    mo = re.fullmatch(r"label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)", q, re.S)
    if mo:
        return f"count by ({mo.group(2)}) ({mo.group(1).strip()})"
    mo = re.fullmatch(r"label_values\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)", q)
    if mo:
        return f'count by ({mo.group(1)}) ({{{mo.group(1)}!=""}})'
    mo = re.fullmatch(r"query_result\((.*)\)", q, re.S)
    if mo:
        return mo.group(1)
    return None


def load_queries(dashboard):
    """All queries of the dashboard: panel targets first, then query variables."""
    doc = json.loads(Path(dashboard).read_text())
    out = []
    for p in walk_panels(doc.get("panels", [])):
        for t in p.get("targets", []):
            expr = (t.get("expr") or "").strip()
            if not expr or t.get("hide"):
                continue
            where = f'panel "{p.get("title", "?")}" ({t.get("refId", "?")})'
            out.append(Query(where, expr, t.get("legendFormat", ""),
                             bool(t.get("instant")) or p.get("type") in ("stat", "bargauge", "table"),
                             p))
    for var in doc.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        expr = variable_query(var)
        if expr:
            out.append(Query(f'variable "{var.get("name")}"', expr, instant=True))
    return doc, out


def substitute(expr, doc, rate_interval="30s", range_="5m", interval="15s"):
    """Replace Grafana's built-in and template variables with concrete values.

    Query variables become their "All" value (or `.*`), so every series matches.
    """
    builtins = {
        "__rate_interval": rate_interval,
        "__range": range_,
        "__interval": interval,
        "__range_s": str(duration_seconds(range_)),
    }
    names = {}
    for var in doc.get("templating", {}).get("list", []):
        if var.get("type") in ("query", "custom", "textbox", "constant"):
            names[var["name"]] = var.get("allValue") or ".*"

    def repl(mo):
        name = mo.group(1) or mo.group(2)
        if name in builtins:
            return builtins[name]
        if name in names:
            return names[name]
        return mo.group(0)

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", repl, expr)


def duration_seconds(d):
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    total = 0.0
    for num, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", d):
        total += float(num) * units[unit]
    return int(total)


def metric_names(expr):
    """Metric names in a PromQL expression (histogram suffixes kept)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # ranges and subqueries
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for mo in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        word = mo.group(0)
        rest = s[mo.end():].lstrip()
        if rest.startswith("(") or word.lower() in KEYWORDS:
            continue
        # a number like 1e3 or a duration was already removed; skip exponent tails
        if s[max(0, mo.start() - 1):mo.start()].isdigit():
            continue
        names.add(word)
    return names


def base_name(name):
    for suffix in HIST_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def cmd_names(doc, queries, args):
    names = set()
    for q in queries:
        names |= {base_name(n) for n in metric_names(q.expr)}
    for n in sorted(names):
        print(n)
    return 0


def cmd_exprs(doc, queries, args):
    for q in queries:
        print(substitute(q.expr, doc, args.rate_interval, args.range))
    return 0


def cmd_rules(doc, queries, args):
    """A rules file with one recording rule per expression, for `promtool check rules`."""
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, q in enumerate(queries):
        expr = substitute(q.expr, doc, args.rate_interval, args.range)
        lines.append(f"      - record: dashboard:expr_{i:03d}")
        lines.append(f"        expr: {json.dumps(expr)}")
    Path(args.file).write_text("\n".join(lines) + "\n")
    return 0


def prom_query(base, expr, at=None, timeout=30):
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    url = base.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        try:
            body = json.load(e)
        except ValueError:
            return None, f"HTTP {e.code}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        return None, str(e)
    if body.get("status") != "success":
        return None, f'{body.get("errorType", "error")}: {body.get("error", "?")}'
    return body["data"], None


def finite_samples(data):
    """Count series and series with at least one finite value in a query result."""
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        return 1, int(math.isfinite(float(result[1])))
    series = finite = 0
    for s in result or []:
        series += 1
        values = [s["value"]] if "value" in s else s.get("values", [])
        if any(math.isfinite(float(v[1])) for v in values):
            finite += 1
    return series, finite


def cmd_check(doc, queries, args):
    failures = []
    for q in queries:
        expr = substitute(q.expr, doc, args.rate_interval, args.range)
        data, err = prom_query(args.prometheus, expr, args.time)
        if err:
            status = f"ERROR {err}"
        else:
            series, finite = finite_samples(data)
            if series == 0:
                status = "NO DATA"
            elif finite == 0:
                status = f"NO FINITE VALUE ({series} series, all NaN/Inf)"
            else:
                status = None
                if args.verbose:
                    print(f"ok    {q.where}: {finite}/{series} series")
        if status:
            failures.append((q, expr, status))
    for q, expr, status in failures:
        print(f"FAIL  {q.where}: {status}\n      {expr}")
    print(f"{len(queries) - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dashboard", default=str(DEFAULT_DASHBOARD))
    ap.add_argument("--rate-interval", default="30s", help="value of $__rate_interval")
    ap.add_argument("--range", default="5m", help="value of $__range")
    sub = ap.add_subparsers(dest="cmd")
    sub.add_parser("names", help="metric base names, one per line")
    sub.add_parser("exprs", help="expressions with variables substituted")
    r = sub.add_parser("rules", help="write a rules file for promtool check rules")
    r.add_argument("file")
    c = sub.add_parser("check", help="evaluate every expression against Prometheus")
    c.add_argument("--prometheus", required=True, help="Prometheus base URL")
    c.add_argument("--time", type=float, default=None, help="evaluation time (unix seconds)")
    c.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    doc, queries = load_queries(args.dashboard)
    if not queries:
        print(f"no PromQL found in {args.dashboard}", file=sys.stderr)
        return 1
    handler = {"names": cmd_names, None: cmd_names, "exprs": cmd_exprs,
               "rules": cmd_rules, "check": cmd_check}[args.cmd]
    return handler(doc, queries, args)


if __name__ == "__main__":
    sys.exit(main())
