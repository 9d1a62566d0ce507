//! The guarantees' bookkeeping of a run: zero-accept streaks, switches after a phase
//! change, resumption after a load spike.

use super::{Mode, Request, Sim};

/// The guarantees' bookkeeping.
impl Sim<'_> {
    /// A round with nothing accepted while the controller's estimates said a decode step
    /// was cheaper than the verify lengthens the streak; anything else ends it.
    pub(super) fn note_streak(&mut self, r: &mut Request, k: usize, n: usize, spec: usize) {
        if k == 0 || n > 0 || !matches!(self.mode, Mode::Auto(_)) {
            r.streak = 0;
            return;
        }
        let dec = self.ctl.decode_cost_estimate(self.ctl.load());
        let ver = self.ctl.verify_cost_estimate(k, spec);
        let cheaper = matches!((dec, ver), (Some(d), Some(v)) if d < v);
        if cheaper {
            r.streak += 1;
            self.out.zero_streak = self.out.zero_streak.max(r.streak);
        } else {
            r.streak = 0;
        }
    }

    pub(super) fn note_switch(&mut self, tokens: u32) {
        self.out.switch_tokens = Some(self.out.switch_tokens.unwrap_or(0).max(tokens));
    }

    /// Into a phase where speculation pays: switched at the first round that accepted.
    pub(super) fn note_spec_switch(&mut self, r: &mut Request, k: usize, n: usize) {
        if !matches!(self.mode, Mode::Auto(_)) || k == 0 || n == 0 {
            return;
        }
        if let Some((_, to, _)) = self.sc.noise.spike {
            let at = self.now().saturating_duration_since(self.start);
            if at >= to && self.out.resume_after_spike.is_none() {
                self.out.resume_after_spike = Some((at - to).as_secs_f64());
            }
        }
        if let Some((at, _, then)) = self.sc.acceptance.change_at() {
            if then >= 0.7 && r.generated >= at && !r.switched {
                r.switched = true;
                self.note_switch(r.generated - at);
            }
        }
    }

    /// Into a phase where speculation loses: switched when the stream relays.
    pub(super) fn note_relay_switch(&mut self, r: &mut Request, relaying: bool) {
        let Some((at, _, then)) = self.sc.acceptance.change_at() else {
            return;
        };
        if !matches!(self.mode, Mode::Auto(_)) || then > 0.3 || r.generated < at || r.switched {
            return;
        }
        if relaying && r.watched {
            r.switched = true;
            self.note_switch(r.generated - at);
        }
    }
}
