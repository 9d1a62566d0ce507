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
