//! How much of `auto`'s shortfall where speculation wins is learning: the same scenarios
//! under a controller told the script's acceptance and the model's costs
//! (`Mode::Informed`), both against the best static K in hindsight.

use std::collections::BTreeMap;

use super::model::{Acceptance, Scenario};
use super::run::{Mode, Sim};
use super::{describe, evaluate, par_map, scenarios, Result, AUTO_CAP};

/// `auto` and the informed controller over one scenario: (auto, informed) / best static.
fn ratios(sc: Scenario) -> (Result, f64, f64) {
    let r = evaluate(sc);
    let informed = Sim::new(&sc, Mode::Informed(AUTO_CAP)).run().rate;
    let best = r.best_static.1;
    let auto = r.auto.rate / best;
    (r, auto, informed / best)
}

/// Counts of one group: scenarios, `auto` at ≥ 0.95, informed at ≥ 0.95.
type Counts = (usize, usize, usize);

/// The scenarios where speculation wins and the acceptance does not change with the
/// position (constant and per-position decay: a controller told the script picks one K),
/// `auto` against the informed controller (`SPECD_SIM_LIST=1` lists each scenario):
/// `cargo nextest run -p specd --lib --run-ignored only sim_informed --no-capture`.
#[test]
#[ignore = "a diagnostic, not a check"]
fn sim_informed() {
    let set: Vec<Scenario> = scenarios()
        .into_iter()
        .filter(|s| {
            matches!(
                s.acceptance,
                Acceptance::Constant(_) | Acceptance::Decay { .. }
            )
        })
        .collect();
    let rows = par_map(&set, ratios);
    let list = std::env::var_os("SPECD_SIM_LIST").is_some();
    let wins: Vec<_> = rows
        .iter()
        .filter(|(r, ..)| r.best_static.1 > r.plain)
        .collect();
    let mut groups: BTreeMap<(&str, usize), Counts> = BTreeMap::new();
    let (mut log_auto, mut log_informed, mut worst) = (0.0, 0.0, f64::INFINITY);
    for (r, auto, informed) in &wins {
        let g = groups.entry((r.sc.name, r.sc.streams)).or_default();
        g.0 += 1;
        g.1 += usize::from(*auto >= 0.95);
        g.2 += usize::from(*informed >= 0.95);
        log_auto += auto.ln();
        log_informed += informed.ln();
        worst = worst.min(*informed);
        if list {
            println!("{auto:.3} {informed:.3} {}", describe(r));
        }
    }
    let n = wins.len().max(1) as f64;
    let (a, i) = groups.values().fold((0, 0), |t, g| (t.0 + g.1, t.1 + g.2));
    println!(
        "speculation wins in {} of {} scenarios: at ≥ 0.95 of the best static K, auto {a} \
         (geometric mean {:.4}), informed {i} (mean {:.4}, worst {worst:.3})",
        wins.len(),
        rows.len(),
        (log_auto / n).exp(),
        (log_informed / n).exp(),
    );
    for ((name, streams), (n, a, i)) in groups {
        println!("  {name} / {streams} streams: {n}, auto {a}, informed {i}");
    }
}

/// How far luck alone moves a run where speculation wins: the best static K under other
/// draws of its drafts' rightness (`Sim::salted`, three more) against its run in the
/// harness, the ratio (b) takes. A controller as good as the best static K in expectation
/// would meet (b) no more often than this does.
/// `cargo nextest run -p specd --lib --run-ignored only sim_luck --no-capture`.
#[test]
#[ignore = "a diagnostic, not a check"]
fn sim_luck() {
    let rows = par_map(&scenarios(), |sc| {
        let r = evaluate(sc);
        let k = Mode::Static(r.best_static.0);
        let other: Vec<f64> = (1..=3)
            .map(|salt| Sim::new(&sc, k).salted(salt).run().rate / r.best_static.1)
            .collect();
        (r.best_static.1 > r.plain, other)
    });
    let ratios: Vec<f64> = rows
        .iter()
        .filter(|(wins, _)| *wins)
        .flat_map(|(_, o)| o.iter().copied())
        .collect();
    let n = ratios.len();
    let mut sorted = ratios.clone();
    sorted.sort_by(f64::total_cmp);
    let share =
        |f: &dyn Fn(f64) -> bool| ratios.iter().filter(|&&x| f(x)).count() as f64 / n.max(1) as f64;
    let mean = (ratios.iter().map(|x| x.ln()).sum::<f64>() / n.max(1) as f64).exp();
    println!(
        "the best static K under other draws, against its own run, {n} runs of the \
         scenarios where speculation wins: at ≥ 0.95 {:.1} %, ≥ 0.97 {:.1} %, over 1.05 \
         {:.1} %; geometric mean {mean:.4}; 5th, 50th, 95th percentile {:.3}, {:.3}, {:.3}; \
         worst {:.3}",
        100.0 * share(&|x| x >= 0.95),
        100.0 * share(&|x| x >= 0.97),
        100.0 * share(&|x| x > 1.05),
        sorted[n / 20],
        sorted[n / 2],
        sorted[n * 19 / 20],
        sorted[0],
    );
}
