//! The Prometheus text exposition format, read: specd reads its upstream's load from the
//! upstream's `/metrics`, and the benchmarks read specd's own counters from specd's.
//!
//! A sample line is `name{label="value",…} value [timestamp]` or `name value [timestamp]`;
//! label values escape `\\`, `\"` and `\n`, and may hold spaces, commas and braces. Values
//! include `+Inf`, `-Inf` and `NaN`. Comments (`# HELP`, `# TYPE`) and blank lines are
//! skipped, as is any line that does not parse.

use std::collections::HashMap;

/// One sample of a scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the sample is `name` and carries every label of `want`.
    pub fn is(&self, name: &str, want: &[(&str, &str)]) -> bool {
        self.name == name && want.iter().all(|(k, v)| self.label(k) == Some(v))
    }
}

/// Label pairs of `s`, which starts just past `{`; returns them and the rest after `}`.
fn labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut out = Vec::new();
    loop {
        s = s.trim_start().trim_start_matches(',').trim_start();
        if let Some(rest) = s.strip_prefix('}') {
            return Some((out, rest));
        }
        let (key, rest) = s.split_once('=')?;
        let mut chars = rest.trim_start().strip_prefix('"')?.chars();
        let mut val = String::new();
        loop {
            match chars.next()? {
                '\\' => match chars.next()? {
                    'n' => val.push('\n'),
                    c => val.push(c),
                },
                '"' => break,
                c => val.push(c),
            }
        }
        out.push((key.trim().to_string(), val));
        s = chars.as_str();
    }
}

/// One sample line; `None` for comments, blank lines and lines that do not parse.
pub fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let (labels, rest) = match line[name_end..].strip_prefix('{') {
        Some(inner) => labels(inner)?,
        None => (Vec::new(), &line[name_end..]),
    };
    // A timestamp may follow the value.
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Every sample of a page, in order.
pub fn samples(text: &str) -> impl Iterator<Item = Sample> + '_ {
    text.lines().filter_map(parse_line)
}

/// The samples of one scrape, with the queries readers of `/metrics` make.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    pub samples: Vec<Sample>,
}

impl Scrape {
    pub fn parse(text: &str) -> Scrape {
        Scrape {
            samples: samples(text).collect(),
        }
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        want: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = f64> + 'a {
        self.samples
            .iter()
            .filter(move |s| s.is(name, want))
            .map(|s| s.value)
    }

    /// Sum of every sample of `name` whose labels include all of `want`.
    pub fn sum(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.matching(name, want).sum()
    }

    /// The first sample of `name` whose labels include all of `want`.
    pub fn first(&self, name: &str, want: &[(&str, &str)]) -> Option<f64> {
        self.matching(name, want).next()
    }

    /// Labels of the first sample of `name` (info metrics such as `specd_upstream_info`).
    pub fn labels_of(&self, name: &str) -> Option<&[(String, String)]> {
        self.samples
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.labels.as_slice())
    }

    /// Cumulative histogram buckets of `name` (`<name>_bucket`), summed over other labels,
    /// sorted by their `le` bound (`+Inf` last).
    pub fn buckets(&self, name: &str) -> Vec<(f64, f64)> {
        let bucket = format!("{name}_bucket");
        let mut by_le: HashMap<u64, (f64, f64)> = HashMap::new();
        for s in self.samples.iter().filter(|s| s.name == bucket) {
            if let Some(le) = s.label("le").and_then(|l| l.parse::<f64>().ok()) {
                by_le.entry(le.to_bits()).or_insert((le, 0.0)).1 += s.value;
            }
        }
        let mut out: Vec<(f64, f64)> = by_le.into_values().collect();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP specd_verify_duration_seconds Verify call time
# TYPE specd_verify_duration_seconds histogram
specd_verify_duration_seconds_bucket{kind="vllm",le="0.1"} 3
specd_verify_duration_seconds_bucket{kind="vllm",le="1"} 5
specd_verify_duration_seconds_bucket{kind="vllm",le="+Inf"} 6
specd_verify_duration_seconds_bucket{kind="sglang",le="0.1"} 1
specd_verify_duration_seconds_bucket{kind="sglang",le="1.0"} 1
specd_verify_duration_seconds_bucket{kind="sglang",le="+Inf"} 1
specd_verify_duration_seconds_sum{kind="vllm"} 2.5
specd_verify_duration_seconds_count{kind="vllm"} 6

weird{a="x\"y,z=1} b",b="2\\",c="line\nnext"} 7 1700000000
process_open_fds 12
gauge_nan NaN
gauge_inf{x="1"} +Inf
gauge_neg -Inf
not a sample line
broken{a="unterminated} 3
"#;

    #[test]
    fn parses_labels_values_and_skips_the_rest() {
        let s = Scrape::parse(TEXT);
        let w = s.samples.iter().find(|x| x.name == "weird").expect("weird");
        assert_eq!(w.label("a"), Some("x\"y,z=1} b"));
        assert_eq!(w.label("b"), Some("2\\"));
        assert_eq!(w.label("c"), Some("line\nnext"));
        assert_eq!(w.value, 7.0);
        assert_eq!(s.first("process_open_fds", &[]), Some(12.0));
        assert!(s.first("gauge_nan", &[]).expect("nan").is_nan());
        assert_eq!(s.first("gauge_inf", &[("x", "1")]), Some(f64::INFINITY));
        assert_eq!(s.first("gauge_neg", &[]), Some(f64::NEG_INFINITY));
        assert_eq!(s.first("broken", &[]), None);
        assert_eq!(s.first("not", &[]), None);
        assert_eq!(s.samples.len(), 13);
        assert_eq!(s.labels_of("weird").map(|l| l.len()), Some(3));
    }

    #[test]
    fn reads_histograms() {
        let s = Scrape::parse(TEXT);
        assert_eq!(
            s.buckets("specd_verify_duration_seconds"),
            vec![(0.1, 4.0), (1.0, 6.0), (f64::INFINITY, 7.0)]
        );
        assert_eq!(s.sum("specd_verify_duration_seconds_sum", &[]), 2.5);
        assert_eq!(
            s.sum("specd_verify_duration_seconds_count", &[("kind", "vllm")]),
            6.0
        );
        assert_eq!(
            s.sum("specd_verify_duration_seconds_bucket", &[("le", "+Inf")]),
            7.0
        );
        assert_eq!(s.sum("specd_verify_duration_seconds", &[]), 0.0);
    }
}
