//! Plots as hand-written SVG (no plotting dependency): throughput by mode and concurrency,
//! accepted-length histograms, and latency CDFs, each as small multiples per workload.

use std::fmt::Write;

use super::stats::{sorted, Cell, Summary};

const PALETTE: &[&str] = &[
    "#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c",
    "#ccb974", "#64b5cd",
];

pub fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" axis maximum and tick step covering `max`.
fn nice(max: f64) -> (f64, f64) {
    if !(max.is_finite() && max > 0.0) {
        return (1.0, 0.25);
    }
    let raw = max / 4.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| s * 4.0 >= max)
        .unwrap_or(10.0 * mag);
    ((max / step).ceil() * step, step)
}

fn fmt_tick(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

pub struct Svg {
    buf: String,
}

impl Svg {
    pub fn new(w: f64, h: f64, title: &str) -> Svg {
        let mut buf = String::new();
        let _ = write!(
            buf,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11"><rect width="{w}" height="{h}" fill="white"/><text x="{}" y="20" text-anchor="middle" font-size="15">{}</text>"#,
            w / 2.0,
            esc(title)
        );
        Svg { buf }
    }

    pub fn text(&mut self, x: f64, y: f64, anchor: &str, s: &str, extra: &str) {
        let _ = write!(
            self.buf,
            r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}" {extra}>{}</text>"#,
            esc(s)
        );
    }

    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str) {
        let _ = write!(
            self.buf,
            r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{fill}"/>"#,
            w.max(0.0),
            h.max(0.0)
        );
    }

    pub fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, stroke: &str) {
        let _ = write!(
            self.buf,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="{stroke}"/>"#
        );
    }

    pub fn polyline(&mut self, pts: &[(f64, f64)], stroke: &str) {
        let p: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = write!(
            self.buf,
            r#"<polyline points="{}" fill="none" stroke="{stroke}" stroke-width="1.5"/>"#,
            p.join(" ")
        );
    }

    /// Legend in one row under the title; `colors[i]` is the palette index of `labels[i]`.
    pub fn legend(&mut self, labels: &[String], colors: &[usize]) {
        let mut x = 20.0;
        for (l, c) in labels.iter().zip(colors) {
            self.rect(x, 30.0, 10.0, 10.0, color(*c));
            self.text(x + 14.0, 39.0, "start", l, "");
            x += 24.0 + 7.0 * l.len() as f64;
        }
    }

    pub fn finish(mut self) -> String {
        self.buf.push_str("</svg>\n");
        self.buf
    }
}

/// A panel's plotting area and its data ranges.
struct Panel {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
    xmax: f64,
    ymax: f64,
}

impl Panel {
    fn px(&self, v: f64) -> f64 {
        self.x + self.w * (v / self.xmax).clamp(0.0, 1.0)
    }
    fn py(&self, v: f64) -> f64 {
        self.y + self.h - self.h * (v / self.ymax).clamp(0.0, 1.0)
    }

    /// Frame, title, y ticks (and x ticks when `xticks`).
    fn draw(&self, svg: &mut Svg, title: &str, ylabel: &str, ystep: f64, xticks: Option<f64>) {
        svg.text(
            self.x + self.w / 2.0,
            self.y - 6.0,
            "middle",
            title,
            r#"font-weight="bold""#,
        );
        svg.line(
            self.x,
            self.y + self.h,
            self.x + self.w,
            self.y + self.h,
            "#333",
        );
        svg.line(self.x, self.y, self.x, self.y + self.h, "#333");
        let mut v = 0.0;
        while v <= self.ymax + 1e-9 {
            let y = self.py(v);
            svg.line(self.x - 3.0, y, self.x + self.w, y, "#eee");
            svg.text(self.x - 5.0, y + 4.0, "end", &fmt_tick(v), "");
            v += ystep;
        }
        svg.text(
            self.x - 38.0,
            self.y + self.h / 2.0,
            "middle",
            ylabel,
            &format!(
                r#"transform="rotate(-90 {:.1} {:.1})""#,
                self.x - 38.0,
                self.y + self.h / 2.0
            ),
        );
        if let Some(step) = xticks {
            let mut v = 0.0;
            while v <= self.xmax + 1e-9 {
                let x = self.px(v);
                svg.line(x, self.y + self.h, x, self.y + self.h + 3.0, "#333");
                svg.text(x, self.y + self.h + 14.0, "middle", &fmt_tick(v), "");
                v += step;
            }
        }
    }
}

const PW: f64 = 300.0;
const PH: f64 = 170.0;
const GAP_X: f64 = 80.0;
const GAP_Y: f64 = 70.0;
const TOP: f64 = 75.0;

fn grid(n: usize, cols: usize, title: &str) -> (Svg, Vec<(f64, f64)>) {
    let cols = cols.max(1);
    let rows = n.div_ceil(cols).max(1);
    let w = 20.0 + cols as f64 * (PW + GAP_X);
    let h = TOP + rows as f64 * (PH + GAP_Y);
    let origins = (0..n)
        .map(|i| {
            (
                GAP_X - 10.0 + (i % cols) as f64 * (PW + GAP_X),
                TOP + (i / cols) as f64 * (PH + GAP_Y),
            )
        })
        .collect();
    (Svg::new(w, h, title), origins)
}

/// Aggregate tokens/s by concurrency, one bar per mode, one panel per workload.
pub fn throughput(
    summaries: &[Summary],
    workloads: &[String],
    modes: &[String],
    conc: &[usize],
) -> String {
    let (mut svg, origins) = grid(
        workloads.len(),
        3,
        "Aggregate output tokens/s by mode and concurrency",
    );
    svg.legend(modes, &(0..modes.len()).collect::<Vec<_>>());
    for (wi, w) in workloads.iter().enumerate() {
        let cells: Vec<&Summary> = summaries.iter().filter(|s| &s.workload == w).collect();
        let ymax = cells
            .iter()
            .filter_map(|s| s.aggregate_tok_s)
            .fold(0.0, f64::max);
        let (ymax, step) = nice(ymax);
        let (x0, y0) = origins[wi];
        let p = Panel {
            x: x0,
            y: y0,
            w: PW,
            h: PH,
            xmax: 1.0,
            ymax,
        };
        p.draw(&mut svg, w, "tokens/s", step, None);
        let group = PW / conc.len().max(1) as f64;
        let bar = (group * 0.8) / modes.len().max(1) as f64;
        for (ci, c) in conc.iter().enumerate() {
            let gx = x0 + ci as f64 * group + group * 0.1;
            svg.text(
                gx + group * 0.4,
                y0 + PH + 14.0,
                "middle",
                &format!("c={c}"),
                "",
            );
            for (mi, m) in modes.iter().enumerate() {
                let v = cells
                    .iter()
                    .find(|s| &s.mode == m && s.concurrency == *c)
                    .and_then(|s| s.aggregate_tok_s)
                    .unwrap_or(0.0);
                let top = p.py(v);
                svg.rect(
                    gx + mi as f64 * bar,
                    top,
                    bar * 0.9,
                    y0 + PH - top,
                    color(mi),
                );
            }
        }
    }
    svg.finish()
}

/// Share of draft rounds by accepted length (from specd's histogram), per speculating mode.
pub fn accepted_length(summaries: &[Summary], workloads: &[String], modes: &[String]) -> String {
    // Keep each mode's colour from the other plots.
    let (spec_modes, colors): (Vec<String>, Vec<usize>) = modes
        .iter()
        .enumerate()
        .filter(|(_, m)| {
            summaries
                .iter()
                .any(|s| &s.mode == *m && s.counters.as_ref().is_some_and(|c| c.drafts > 0.0))
        })
        .map(|(i, m)| (m.clone(), i))
        .unzip();
    let (mut svg, origins) = grid(
        workloads.len(),
        3,
        "Accepted draft tokens per round (share of rounds with drafts)",
    );
    svg.legend(&spec_modes, &colors);
    for (wi, w) in workloads.iter().enumerate() {
        let hists: Vec<Vec<f64>> = spec_modes
            .iter()
            .map(|m| {
                let mut h: Vec<f64> = Vec::new();
                for s in summaries
                    .iter()
                    .filter(|s| &s.workload == w && &s.mode == m)
                {
                    if let Some(c) = &s.counters {
                        if h.len() < c.accepted_length.len() {
                            h.resize(c.accepted_length.len(), 0.0);
                        }
                        for (a, b) in h.iter_mut().zip(&c.accepted_length) {
                            *a += b;
                        }
                    }
                }
                let total: f64 = h.iter().sum();
                h.iter()
                    .map(|x| if total > 0.0 { x / total } else { 0.0 })
                    .collect()
            })
            .collect();
        let kmax = hists
            .iter()
            .filter_map(|h| h.iter().rposition(|x| *x > 0.0))
            .max()
            .unwrap_or(0)
            + 1;
        let ymax = hists.iter().flatten().fold(0.0, |a: f64, b| a.max(*b));
        let (ymax, step) = nice(ymax);
        let (x0, y0) = origins[wi];
        let p = Panel {
            x: x0,
            y: y0,
            w: PW,
            h: PH,
            xmax: 1.0,
            ymax,
        };
        p.draw(&mut svg, w, "share of rounds", step, None);
        let group = PW / kmax as f64;
        let bar = group * 0.8 / spec_modes.len().max(1) as f64;
        for k in 0..kmax {
            let gx = x0 + k as f64 * group + group * 0.1;
            svg.text(
                gx + group * 0.4,
                y0 + PH + 14.0,
                "middle",
                &k.to_string(),
                "",
            );
            for (mi, h) in hists.iter().enumerate() {
                let top = p.py(h.get(k).copied().unwrap_or(0.0));
                svg.rect(
                    gx + mi as f64 * bar,
                    top,
                    bar * 0.9,
                    y0 + PH - top,
                    color(colors[mi]),
                );
            }
        }
        svg.text(
            x0 + PW / 2.0,
            y0 + PH + 30.0,
            "middle",
            "accepted draft tokens",
            "",
        );
    }
    svg.finish()
}

/// CDF of a per-request latency (in ms), one line per mode, one panel per workload and
/// concurrency.
pub fn latency_cdf(
    cells: &[Cell],
    workloads: &[String],
    modes: &[String],
    conc: &[usize],
    what: &str,
    pick: fn(&super::client::Outcome) -> Option<f64>,
) -> String {
    let panels: Vec<(&String, usize)> = workloads
        .iter()
        .flat_map(|w| conc.iter().map(move |c| (w, *c)))
        .collect();
    let (mut svg, origins) = grid(
        panels.len(),
        conc.len().clamp(1, 4),
        &format!("{what}: cumulative share of requests"),
    );
    svg.legend(modes, &(0..modes.len()).collect::<Vec<_>>());
    for (pi, (w, c)) in panels.iter().enumerate() {
        let series: Vec<Vec<f64>> = modes
            .iter()
            .map(|m| {
                let v = cells
                    .iter()
                    .filter(|x| &x.workload == *w && &x.mode == m && x.concurrency == *c)
                    .flat_map(|x| x.outcomes.iter().filter(|o| o.ok).filter_map(pick))
                    .map(|s| s * 1000.0)
                    .collect();
                sorted(v)
            })
            .collect();
        let xmax = series
            .iter()
            .filter_map(|s| s.last().copied())
            .fold(0.0, f64::max);
        let (xmax, xstep) = nice(xmax);
        let (x0, y0) = origins[pi];
        let p = Panel {
            x: x0,
            y: y0,
            w: PW,
            h: PH,
            xmax,
            ymax: 1.0,
        };
        p.draw(&mut svg, &format!("{w} c={c}"), "share", 0.25, Some(xstep));
        svg.text(
            x0 + PW / 2.0,
            y0 + PH + 30.0,
            "middle",
            &format!("{what} (ms)"),
            "",
        );
        for (mi, s) in series.iter().enumerate() {
            if s.is_empty() {
                continue;
            }
            let n = s.len() as f64;
            let mut pts = vec![(p.px(s[0]), p.py(0.0))];
            for (i, v) in s.iter().enumerate() {
                pts.push((p.px(*v), p.py(i as f64 / n)));
                pts.push((p.px(*v), p.py((i + 1) as f64 / n)));
            }
            svg.polyline(&pts, color(mi));
        }
    }
    svg.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_axes() {
        assert_eq!(nice(0.0), (1.0, 0.25));
        let (m, s) = nice(87.0);
        assert!(
            (87.0..=100.0).contains(&m) && (m / s - (m / s).round()).abs() < 1e-9,
            "{m} {s}"
        );
        let (m, _) = nice(0.013);
        assert!((0.013..0.03).contains(&m), "{m}");
    }

    #[test]
    fn svg_is_well_formed_enough() {
        let s = Summary {
            workload: "w<1>".into(),
            mode: "on".into(),
            concurrency: 1,
            aggregate_tok_s: Some(12.0),
            ..Summary::default()
        };
        let out = throughput(&[s], &["w<1>".into()], &["on".into()], &[1]);
        assert!(out.starts_with("<svg") && out.trim_end().ends_with("</svg>"));
        assert!(out.contains("w&lt;1&gt;"));
        assert_eq!(out.matches("<text").count(), out.matches("</text>").count());
    }
}
