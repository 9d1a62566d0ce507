//! The benchmark's tables.

use super::{mean, Mode, Sample};

/// The results as markdown tables: tokens/s per stream, acceptance per mode, specd's CPU.
pub(super) fn print(modes: &[Mode], rows: &[(&str, usize, Vec<Sample>)]) {
    speed(modes, rows);
    acceptance(modes, rows);
    cpu(modes, rows);
}

fn speed(modes: &[Mode], rows: &[(&str, usize, Vec<Sample>)]) {
    let mut head = format!("| {:<11} | {:>7} |", "scenario", "streams");
    for m in modes {
        head.push_str(&format!(" {:>7} |", m.label));
    }
    head.push_str(" auto/best | auto/plain | tok/round K=4 | auto relay % | auto passed % |");
    println!("\ntokens/s per stream (mean over streams and repeats)\n");
    println!("{head}");
    println!("|{}", "---|".repeat(modes.len() + 7));
    for (name, conc, s) in rows {
        let tps: Vec<f64> = s.iter().map(|x| mean(&x.tps)).collect();
        let auto = tps.last().copied().unwrap_or(0.0);
        // The best of plain decoding and the static K.
        let best = modes
            .iter()
            .zip(&tps)
            .filter(|(m, _)| m.label == "plain" || m.label.starts_with("K="))
            .map(|(_, t)| *t)
            .fold(0.0, f64::max);
        let plain = tps.first().copied().unwrap_or(0.0);
        let mut line = format!("| {name:<11} | {conc:>7} |");
        for t in &tps {
            line.push_str(&format!(" {t:>7.1} |"));
        }
        let k4 = modes.iter().position(|m| m.label == "K=4").map(|i| &s[i]);
        let per_round = k4.filter(|x| x.rounds > 0).map_or(f64::NAN, |x| {
            (x.accepted + x.rounds) as f64 / x.rounds as f64
        });
        let a = s.last().cloned().unwrap_or_default();
        let relay = 100.0 * a.relay_tokens as f64 / a.tokens.max(1) as f64;
        let passed = 100.0 * a.passed_tokens as f64 / a.tokens.max(1) as f64;
        line.push_str(&format!(
            " {:>9.2} | {:>10.2} | {per_round:>13.2} | {relay:>12.0} | {passed:>13.0} |",
            auto / best.max(1e-9),
            auto / plain.max(1e-9)
        ));
        println!("{line}");
    }
}

/// Per speculating mode: tokens per verify round (accepted + the round's own token),
/// accepted/drafted, and requests that ran no round (a static K that ran none was
/// passed through or relayed throughout: its numbers prove nothing).
fn acceptance(modes: &[Mode], rows: &[(&str, usize, Vec<Sample>)]) {
    let mut head = format!("| {:<11} | {:>7} |", "scenario", "streams");
    let spec: Vec<usize> = (0..modes.len())
        .filter(|&i| modes[i].label != "plain")
        .collect();
    for &i in &spec {
        head.push_str(&format!(
            " {} tok/round | {} acc/drafted | {} no rounds |",
            modes[i].label, modes[i].label, modes[i].label
        ));
    }
    println!("\nacceptance from usage.speculation (no rounds: requests without a verify round, of all)\n");
    println!("{head}");
    println!("|{}", "---|".repeat(3 * spec.len() + 2));
    for (name, conc, s) in rows {
        let mut line = format!("| {name:<11} | {conc:>7} |");
        for &i in &spec {
            let x = &s[i];
            let per_round =
                (x.rounds > 0).then(|| (x.accepted + x.rounds) as f64 / x.rounds as f64);
            let acc = (x.drafted > 0).then(|| x.accepted as f64 / x.drafted as f64);
            let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
            line.push_str(&format!(
                " {} | {} | {}/{} |",
                f(per_round),
                f(acc),
                x.unspeculated,
                x.requests
            ));
            if modes[i].label.starts_with("K=") && x.unspeculated > 0 {
                eprintln!(
                    "warning: {name}, {conc} streams, {}: {} of {} requests ran no verify round (not speculated)",
                    modes[i].label, x.unspeculated, x.requests
                );
            }
        }
        println!("{line}");
    }
}

fn cpu(modes: &[Mode], rows: &[(&str, usize, Vec<Sample>)]) {
    let mut head = format!("| {:<11} | {:>7} |", "scenario", "streams");
    for m in modes {
        head.push_str(&format!(" {:>7} |", m.label));
    }
    println!("\nspecd CPU time per token, µs (all threads of each mode's specd)\n");
    println!("{head}");
    println!("|{}", "---|".repeat(modes.len() + 2));
    for (name, conc, s) in rows {
        let mut line = format!("| {name:<11} | {conc:>7} |");
        for x in s {
            line.push_str(&format!(
                " {:>7.1} |",
                1e6 * x.cpu_s / x.tokens.max(1) as f64
            ));
        }
        println!("{line}");
    }
}
