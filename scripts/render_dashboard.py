#!/usr/bin/env python3
"""Draw a Grafana dashboard's panels from a live Prometheus into one PNG.

    scripts/render_dashboard.py --prometheus http://127.0.0.1:9090 --out dashboard.png \
        [--dashboard dashboards/specd.json] [--start -30m|UNIX] [--end UNIX] [--width 1900]

Each panel's queries are evaluated like Grafana would (range queries for time series,
instant queries at the end of the range for stat, bar gauge and table panels, template
variables set to "All") and drawn at the panel's grid position, so the picture reads
like the dashboard. Needs matplotlib: when the running python lacks it, the script
installs it into a cached venv (the vLLM venv under ~/.cache/specd when that is complete,
else ~/.cache/specd/plot-venv) and re-runs itself there.
"""

import argparse
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dashboard_metrics as dm  # noqa: E402

CACHE = Path(os.environ.get("SPECD_CACHE_DIR", Path.home() / ".cache" / "specd"))


def ensure_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    if os.environ.get("SPECD_RENDER_REEXEC"):
        sys.exit("matplotlib is still missing after installing it")
    vllm = CACHE / "vllm-venv"
    venv = vllm if (vllm / ".specd-complete").exists() else CACHE / "plot-venv"
    py = venv / "bin" / "python"
    if not py.exists():
        print(f"render_dashboard: creating {venv}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if subprocess.run([str(py), "-c", "import matplotlib"], capture_output=True).returncode:
        print(f"render_dashboard: installing matplotlib into {venv}", file=sys.stderr)
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "matplotlib"], check=True, stdout=sys.stderr)
    os.environ["SPECD_RENDER_REEXEC"] = "1"
    os.execv(str(py), [str(py), str(Path(__file__).resolve()), *sys.argv[1:]])


BG, PANEL, TEXT, DIM, GRID = "#111217", "#181b1f", "#ccccdc", "#8e8e9e", "#2c3235"
PALETTE = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9",
           "#705da0", "#37872d", "#fade2a", "#447ebc", "#c15c17", "#890f02", "#0a437c"]


def fmt_value(v, unit, decimals=None):
    if v is None or not math.isfinite(v):
        return "no value"
    d = 2 if decimals is None else decimals
    if unit == "percentunit":
        return f"{v * 100:.{max(0, d - 1)}f}%"
    if unit == "s":
        a = abs(v)
        if a == 0:
            return "0 s"
        if a < 1e-3:
            return f"{v * 1e6:.0f} µs"
        if a < 1:
            return f"{v * 1e3:.{1 if a < 0.01 else 0}f} ms"
        return f"{v:.{d}f} s"
    if unit == "bytes":
        for u, f in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
            if abs(v) >= f:
                return f"{v / f:.1f} {u}"
        return f"{v:.0f} B"
    suffix = " req/s" if unit == "reqps" else ""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.1f}M{suffix}"
    if a >= 1e4:
        return f"{v / 1e3:.1f}k{suffix}"
    return f"{v:.{d}f}{suffix}"


def legend_of(fmt, labels, expr):
    if fmt:
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda mo: labels.get(mo.group(1), ""), fmt).strip()
    shown = {k: v for k, v in labels.items() if k not in ("__name__", "job")}
    return "{" + ", ".join(f'{k}="{v}"' for k, v in shown.items()) + "}" if shown else expr[:40]


def natural_key(s):
    return [(0, float(t), "") if re.fullmatch(r"[+-]?\d+(\.\d+)?|\+Inf", t) and t != "+Inf"
            else (1, math.inf, t) for t in re.split(r"\s+", s)]


class Source:
    def __init__(self, url, doc, start, end, rate_interval):
        self.url, self.doc, self.start, self.end = url.rstrip("/"), doc, start, end
        span = max(60, end - start)
        self.step = max(1, int(span / 240))
        self.range = f"{int(span)}s"
        self.rate_interval = rate_interval
        self.missing = []

    def expr(self, e):
        return dm.substitute(e, self.doc, self.rate_interval, self.range, f"{self.step}s")

    def range_query(self, expr):
        import json
        import urllib.parse
        import urllib.request
        q = urllib.parse.urlencode({"query": self.expr(expr), "start": self.start,
                                    "end": self.end, "step": self.step})
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query_range?{q}", timeout=60) as r:
                body = json.load(r)
        except Exception as e:  # noqa: BLE001 - drawn into the panel
            return None, str(e)
        if body.get("status") != "success":
            return None, body.get("error", "error")
        return body["data"]["result"], None

    def instant(self, expr):
        data, err = dm.prom_query(self.url, self.expr(expr), self.end)
        if err:
            return None, err
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}], None
        return data["result"], None


def draw_timeseries(ax, panel, src, plt_dates):
    unit = panel["fieldConfig"]["defaults"].get("unit", "short")
    n = 0
    for t in panel.get("targets", []):
        result, err = src.range_query(t["expr"])
        if err:
            ax.text(0.5, 0.5, f"error: {err[:80]}", color="#f2495c", ha="center",
                    transform=ax.transAxes, fontsize=7)
            continue
        for s in sorted(result, key=lambda s: natural_key(legend_of(t.get("legendFormat"), s["metric"], t["expr"]))):
            xs = [plt_dates.date2num(_dt(float(ts))) for ts, _ in s["values"]]
            ys = [float(v) if math.isfinite(float(v)) else math.nan for _, v in s["values"]]
            if all(math.isnan(y) for y in ys):
                continue
            label = legend_of(t.get("legendFormat"), s["metric"], t["expr"])
            ax.plot(xs, ys, lw=1.2, color=PALETTE[n % len(PALETTE)], label=label)
            n += 1
    thr = panel["fieldConfig"]["defaults"].get("custom", {}).get("thresholdsStyle", {})
    if thr.get("mode") == "line":
        for step in panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1:]:
            ax.axhline(step["value"], color="#f2495c", lw=0.8, ls="--")
    if n == 0:
        src.missing.append(panel["title"])
        ax.text(0.5, 0.5, "No data", color=DIM, ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(loc="upper left", fontsize=6, ncol=3, frameon=False, labelcolor=TEXT,
                  handlelength=1.2, columnspacing=0.8)
    import matplotlib.dates as mdates
    from matplotlib.ticker import FuncFormatter
    ax.xaxis.set_major_formatter(
        mdates.DateFormatter("%H:%M:%S" if src.end - src.start < 900 else "%H:%M"))
    ax.xaxis.set_major_locator(mdates.AutoDateLocator(maxticks=6))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_value(v, unit, 1 if unit == "s" else None)))
    ax.set_xlim(mdates.date2num(_dt(src.start)), mdates.date2num(_dt(src.end)))
    ax.grid(color=GRID, lw=0.5)
    ax.tick_params(colors=DIM, labelsize=6)


def _dt(epoch):
    from datetime import datetime, timezone
    return datetime.fromtimestamp(epoch, tz=timezone.utc)


def instant_values(panel, src):
    rows = []
    for t in panel.get("targets", []):
        result, err = src.instant(t["expr"])
        if err:
            rows.append((f"error: {err[:60]}", math.nan, {}))
            continue
        for s in result:
            v = float(s["value"][1])
            rows.append((legend_of(t.get("legendFormat"), s["metric"], t["expr"]), v, s["metric"]))
    return rows


def threshold_color(defaults, v):
    color = PALETTE[2]
    for step in defaults.get("thresholds", {}).get("steps", []):
        if step["value"] is None or (math.isfinite(v) and v >= step["value"]):
            color = {"green": "#73bf69", "red": "#f2495c", "orange": "#ff9830",
                     "blue": "#5794f2"}.get(step["color"], step["color"])
    return color


def draw_stat(ax, panel, src):
    d = panel["fieldConfig"]["defaults"]
    rows = [r for r in instant_values(panel, src) if math.isfinite(r[1])]
    ax.axis("off")
    if not rows:
        src.missing.append(panel["title"])
        ax.text(0.5, 0.4, "No data", color=DIM, ha="center", va="center", fontsize=14,
                transform=ax.transAxes)
        return
    mapping = {}
    for m in d.get("mappings", []):
        if m.get("type") == "value":
            mapping.update(m["options"])
    rows = rows[:4]
    for i, (label, v, _) in enumerate(rows):
        key = f"{v:g}"
        text = mapping.get(key, {}).get("text") or fmt_value(v, d.get("unit", "short"), d.get("decimals"))
        color = mapping.get(key, {}).get("color") or threshold_color(d, v)
        color = {"green": "#73bf69", "red": "#f2495c"}.get(color, color)
        y = 0.45 if len(rows) == 1 else 0.85 - i * (0.8 / len(rows))
        size = 22 if len(rows) == 1 else 11
        txt = text if len(rows) == 1 or not label else f"{label}: {text}"
        ax.text(0.5, y, txt, color=color, ha="center", va="center", fontsize=size,
                fontweight="bold", transform=ax.transAxes)


def draw_bargauge(ax, panel, src):
    d = panel["fieldConfig"]["defaults"]
    rows = sorted((r for r in instant_values(panel, src) if math.isfinite(r[1])),
                  key=lambda r: natural_key(r[0]))
    if not rows:
        src.missing.append(panel["title"])
        ax.axis("off")
        ax.text(0.5, 0.5, "No data", color=DIM, ha="center", va="center", transform=ax.transAxes)
        return
    labels = [r[0] for r in rows]
    values = [r[1] for r in rows]
    vmax = d.get("max") or max(values) or 1
    ys = range(len(rows))
    ax.barh(ys, [vmax] * len(rows), color=GRID, height=0.7)
    ax.barh(ys, values, color=[PALETTE[2] if v < 0.5 * vmax else PALETTE[0] for v in values], height=0.7)
    ax.set_yticks(list(ys), labels, fontsize=6, color=TEXT)
    ax.invert_yaxis()
    ax.set_xlim(0, vmax * 1.18)
    for y, v in zip(ys, values):
        ax.text(vmax * 1.01, y, fmt_value(v, d.get("unit", "short"), 1), va="center",
                color=TEXT, fontsize=6)
    ax.set_xticks([])
    for sp in ax.spines.values():
        sp.set_visible(False)


def draw_table(ax, panel, src):
    ax.axis("off")
    hidden = set(panel.get("transformations", [{}])[-1].get("options", {}).get("excludeByName", {}))
    rows = [r[2] for r in instant_values(panel, src) if r[2]]
    if not rows:
        src.missing.append(panel["title"])
        ax.text(0.5, 0.5, "No data", color=DIM, ha="center", va="center", transform=ax.transAxes)
        return
    cols = []
    for r in rows:
        cols += [k for k in r if k not in hidden and k not in cols]
    cells = [[r.get(c, "") for c in cols] for r in rows]
    tb = ax.table(cellText=cells, colLabels=cols, loc="upper center", cellLoc="left")
    tb.auto_set_font_size(False)
    tb.set_fontsize(7)
    for (i, _), cell in tb.get_celld().items():
        cell.set_facecolor(PANEL if i else GRID)
        cell.set_edgecolor(GRID)
        cell.get_text().set_color(TEXT)


def render(args):
    ensure_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    import json

    doc = json.loads(Path(args.dashboard).read_text())
    end = float(args.end) if args.end else time.time()
    if args.start.startswith("-"):
        start = end - dm.duration_seconds(args.start[1:])
    else:
        start = float(args.start)
    src = Source(args.prometheus, doc, start, end, args.rate_interval)

    panels = list(dm.walk_panels(doc["panels"]))
    rows_total = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit_px, header_px, width_px = 30, 60, args.width
    height_px = header_px + rows_total * unit_px + 10
    dpi = 100
    fig = plt.figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi, facecolor=BG)
    fig.text(0.01, 1 - 22 / height_px, doc.get("title", "dashboard"), color=TEXT, fontsize=15,
             fontweight="bold", va="center")
    fig.text(0.01, 1 - 46 / height_px,
             f"{_dt(start):%Y-%m-%d %H:%M:%S} to {_dt(end):%H:%M:%S} UTC · job=All · instance=All · "
             f"rate interval {args.rate_interval} · drawn from Prometheus by scripts/render_dashboard.py",
             color=DIM, fontsize=8, va="center")
    col_px = width_px / 24
    pad = 4
    for p in panels:
        g = p["gridPos"]
        x0, y0 = g["x"] * col_px + pad, header_px + g["y"] * unit_px + pad
        w, h = g["w"] * col_px - 2 * pad, g["h"] * unit_px - 2 * pad
        if p["type"] == "row":
            fig.text(x0 / width_px, 1 - (y0 + h / 2) / height_px, p["title"], color=TEXT,
                     fontsize=11, fontweight="bold", va="center")
            continue
        frame = fig.add_axes([x0 / width_px, 1 - (y0 + h) / height_px, w / width_px, h / height_px])
        frame.set_facecolor(PANEL)
        frame.set_xticks([])
        frame.set_yticks([])
        for sp in frame.spines.values():
            sp.set_color(GRID)
        frame.text(0.01, 1 - 12 / h, p["title"], color=TEXT, fontsize=8, fontweight="bold",
                   va="center", transform=frame.transAxes)
        title_px, left_px = 22, (48 if p["type"] in ("timeseries", "bargauge") else 8)
        ax = fig.add_axes([(x0 + left_px) / width_px, 1 - (y0 + h - 14) / height_px,
                           (w - left_px - 8) / width_px, (h - title_px - 18) / height_px])
        ax.set_facecolor(PANEL)
        for sp in ax.spines.values():
            sp.set_color(GRID)
        kind = p["type"]
        if kind == "timeseries":
            draw_timeseries(ax, p, src, mdates)
        elif kind == "stat":
            draw_stat(ax, p, src)
        elif kind == "bargauge":
            draw_bargauge(ax, p, src)
        elif kind == "table":
            draw_table(ax, p, src)
        else:
            ax.axis("off")
            ax.text(0.5, 0.5, f"({kind} panel not drawn)", color=DIM, ha="center",
                    transform=ax.transAxes)
    fig.savefig(args.out, dpi=dpi, facecolor=BG)
    print(f"wrote {args.out} ({len(panels)} panels)", file=sys.stderr)
    if src.missing:
        print("panels without data: " + ", ".join(src.missing), file=sys.stderr)
    drawn = [p for p in panels if p["type"] != "row"]
    return 1 if len(src.missing) >= len(drawn) else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prometheus", required=True, help="Prometheus base URL")
    ap.add_argument("--dashboard", default=str(dm.DEFAULT_DASHBOARD))
    ap.add_argument("--out", default="dashboard.png")
    ap.add_argument("--start", default="-30m", help="unix seconds, or -DURATION before --end")
    ap.add_argument("--end", default=None, help="unix seconds (default now)")
    ap.add_argument("--rate-interval", default="30s", help="value of $__rate_interval")
    ap.add_argument("--width", type=int, default=1900, help="image width in pixels")
    return render(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
