//! One scenario under one mode, in virtual time: streams send requests, the controller and
//! the relay tracker make every decision exactly as the session loop calls them, and the
//! upstream's steps advance the clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::model::{Draw, Draws, Outcome, Scenario, Upstream, SLOT};

mod bookkeeping;
use crate::config::SpecMode;
use crate::draft::{DrafterKind, Proposal};
use crate::inflight::{InFlight, InFlightGuard};
use crate::metrics::labels::StreamMode;
use crate::speculation::controller::{
    expected_tokens, Active, Clock, Controller, ControllerConfig, Decision, RelayTracker,
    StreamCtl, Verifying, VirtualClock, Watched,
};

const DRAFTER: DrafterKind = DrafterKind::Oracle;
/// Confidence the simulated drafter gives every draft: uninformative, so the controller
/// must learn acceptance from outcomes alone.
const CONFIDENCE: f32 = 0.5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Plain,
    Static(usize),
    Auto(usize),
    /// Each round's K (up to the cap) chosen knowing what `auto` must learn: the script's
    /// acceptance at the round's position and the model's noiseless costs, every stream
    /// verifying in each step. The reference for how much of `auto`'s shortfall is
    /// learning (`sim_informed`).
    Informed(usize),
}

enum Work {
    /// About to start a round (a proposal may be pending; `true` if already chosen).
    Round(Option<Proposal>, bool),
    Verify {
        p: Proposal,
        sent: Instant,
        spec: usize,
        _g: Verifying,
    },
    Relay {
        t: Box<RelayTracker>,
        join_at: Instant,
        started: bool,
        held: u32,
    },
    /// Plain decoding outside the loop (plain mode, passthrough).
    Plain {
        started: bool,
        _g: Option<InFlightGuard>,
    },
    Finished,
}

struct Request {
    /// The stream's index and the request's number in it: where its draws are keyed.
    key: [u64; 2],
    ctl: StreamCtl,
    generated: u32,
    relayed: u32,
    started: Instant,
    watched: bool,
    streak: u32,
    /// Generated position when the stream reached the mode of the current phase.
    switched: bool,
    _active: Option<Active>,
}

struct Stream {
    work: Work,
    req: Request,
    done_requests: u32,
    tokens: u64,
    /// Where the stream's rate is measured from: the start, or the end of its warm-up.
    counted_from: Instant,
    finished_at: Option<Instant>,
}

pub struct Sim<'a> {
    sc: &'a Scenario,
    mode: Mode,
    up: Upstream,
    clock: Arc<VirtualClock>,
    ctl: Arc<Controller>,
    in_flight: Arc<InFlight>,
    draws: Draws,
    start: Instant,
    out: Outcome,
    next_id: u64,
    /// Print every decision (`SPECD_SIM_TRACE`), read once: the harness makes millions.
    trace: bool,
    /// Requests each stream runs before its rate is measured (`SPECD_SIM_WARM`, a
    /// diagnostic: how much of a shortfall is the cold start).
    warm: u32,
    /// Which draws of the drafts' rightness the run meets (`Sim::salted`).
    salt: u64,
}

/// The true token at position `g`, and a wrong one.
fn truth(g: u32) -> u32 {
    g * 2
}

impl<'a> Sim<'a> {
    pub fn new(sc: &'a Scenario, mode: Mode) -> Self {
        let clock = Arc::new(VirtualClock::default());
        let in_flight = Arc::new(InFlight::default());
        let ctl = Controller::new(ControllerConfig::default(), None)
            .with_clock(clock.clone())
            .with_in_flight(in_flight.clone());
        Sim {
            sc,
            mode,
            up: Upstream::default(),
            start: clock.now(),
            clock,
            ctl: Arc::new(ctl),
            in_flight,
            draws: Draws::new(sc.seed),
            out: Outcome::default(),
            next_id: 0,
            trace: std::env::var_os("SPECD_SIM_TRACE").is_some(),
            warm: super::env_number("SPECD_SIM_WARM").unwrap_or(0),
            salt: 0,
        }
    }

    /// The same scenario with other draws of whether each draft is right (`salt` 0: the
    /// harness's own): the same machine and noise, other luck with the drafts.
    pub fn salted(mut self, salt: u64) -> Self {
        self.salt = salt;
        self
    }

    fn now(&self) -> Instant {
        self.clock.now()
    }

    fn trace(&self, generated: u32, what: &dyn std::fmt::Debug) {
        if self.trace {
            let ms = self
                .now()
                .saturating_duration_since(self.start)
                .as_secs_f64()
                * 1e3;
            println!("{ms:8.1} ms g={generated} {what:?}");
        }
    }

    fn new_request(&mut self, key: [u64; 2]) -> (Work, Request) {
        self.next_id += 1;
        let watched = match self.mode {
            Mode::Plain => false,
            Mode::Static(_) | Mode::Informed(_) => true,
            Mode::Auto(_) => self.ctl.watch_auto(),
        };
        let req = Request {
            key,
            ctl: StreamCtl::new(true, self.sc.seed ^ self.next_id),
            generated: 0,
            relayed: 0,
            started: self.now(),
            watched,
            streak: 0,
            switched: false,
            _active: watched.then(|| self.ctl.enter()),
        };
        if !watched && self.mode != Mode::Plain {
            self.out.passed += 1;
        }
        let work = if watched {
            Work::Round(None, false)
        } else {
            let g =
                (self.mode != Mode::Plain).then(|| self.in_flight.enter(StreamMode::Passthrough));
            Work::Plain {
                started: false,
                _g: g,
            }
        };
        (work, req)
    }

    fn k_max(&self) -> usize {
        match self.mode {
            Mode::Plain => 0,
            Mode::Static(k) | Mode::Auto(k) | Mode::Informed(k) => k,
        }
    }

    /// What the drafter proposes at position `g` of request `r`: each draft right with the
    /// script's probability given the previous ones were (the same drafts in every mode, as
    /// a real drafter proposes the same for the same context). A costly drafter stops the
    /// clock for its cost (the upstream's CPU drafts meanwhile).
    fn propose(&mut self, r: &mut Request, k: usize) -> Proposal {
        let (key, g) = (r.key, r.generated);
        let key = [key[0], key[1] ^ (self.salt << 32)];
        let mut tokens = Vec::with_capacity(k);
        let mut right = true;
        for i in 0..k {
            let u = self
                .draws
                .unit(Draw::Draft, &[key[0], key[1], u64::from(g), i as u64]);
            right = right && u < self.sc.acceptance.p(g, i);
            let pos = g + i as u32;
            tokens.push(if right { truth(pos) } else { truth(pos) + 1 });
        }
        let p = Proposal {
            tokens,
            confidence: vec![CONFIDENCE; k],
        };
        if self.sc.draft_cost > 0.0 {
            let dt = Duration::from_secs_f64(self.sc.draft_cost);
            self.clock.advance(dt);
            self.ctl.record_draft(DRAFTER, dt);
            self.out.draft_seconds += self.sc.draft_cost;
        }
        self.ctl.drafted(&mut r.ctl, DRAFTER, &p);
        p
    }

    /// `Mode::Informed`'s K: the best expected rate of a round started at position `g`.
    fn informed_k(&self, g: u32, cap: usize) -> usize {
        let streams = self.sc.streams;
        let p: Vec<f64> = (0..cap).map(|i| self.sc.acceptance.p(g, i)).collect();
        let rate = |k: usize| {
            let verify = self.up.step_cost(streams, true, streams * k);
            expected_tokens(&p, k) / verify
        };
        (1..=cap)
            .max_by(|&a, &b| rate(a).total_cmp(&rate(b)))
            .unwrap_or(0)
    }

    fn remaining(&self, r: &Request) -> u32 {
        self.sc.tokens - r.generated
    }

    /// A stream at a round boundary: the controller decides what it does next.
    fn start_round(&mut self, r: &mut Request, pending: Option<Proposal>, decided: bool) -> Work {
        let remaining = self.remaining(r);
        let cap = self.k_max().min(remaining.saturating_sub(1) as usize);
        let mut p = pending.unwrap_or_else(|| self.propose(r, cap));
        p.tokens.truncate(cap);
        p.confidence.truncate(cap);
        let mode = if matches!(self.mode, Mode::Auto(_)) {
            SpecMode::Auto
        } else {
            SpecMode::On
        };
        let decision = if let Mode::Informed(_) = self.mode {
            Decision::Speculate(self.informed_k(r.generated, p.tokens.len()))
        } else if decided {
            Decision::Speculate(p.tokens.len())
        } else {
            self.ctl
                .plan_round(&mut r.ctl, mode, DRAFTER, &p, remaining as usize)
        };
        self.trace(r.generated, &decision);
        match decision {
            Decision::Speculate(k) => {
                p.tokens.truncate(k);
                p.confidence.truncate(k);
                let spec = self.ctl.speculating();
                let g = self.ctl.verifying(k + 1);
                Work::Verify {
                    p,
                    sent: self.now(),
                    spec,
                    _g: g,
                }
            }
            Decision::Relay { probe } => {
                r.streak = 0;
                let now = self.now();
                let t = RelayTracker::new(&self.ctl, DRAFTER, probe, Some(p), now);
                Work::Relay {
                    t: Box::new(t),
                    join_at: now + self.sc.noise.slow_relay,
                    started: false,
                    held: 0,
                }
            }
        }
    }
}

impl Sim<'_> {
    pub fn run(mut self) -> Outcome {
        let start = self.start;
        let mut streams: Vec<Stream> = (0..self.sc.streams as u64)
            .map(|i| {
                let (work, req) = self.new_request([i, 0]);
                Stream {
                    work,
                    req,
                    done_requests: 0,
                    tokens: 0,
                    counted_from: start,
                    finished_at: None,
                }
            })
            .collect();
        let mut spike_over = None;
        while streams.iter().any(|s| s.finished_at.is_none()) {
            for s in &mut streams {
                if !matches!(s.work, Work::Round(..)) {
                    continue;
                }
                if let Work::Round(p, d) = std::mem::replace(&mut s.work, Work::Finished) {
                    s.work = self.start_round(&mut s.req, p, d);
                    let relaying = matches!(s.work, Work::Relay { .. });
                    self.note_relay_switch(&mut s.req, relaying);
                }
            }
            let now = self.now();
            let taking: Vec<bool> = streams.iter().map(|s| takes_part(&s.work, now)).collect();
            if !taking.iter().any(|&t| t) {
                let next = streams.iter().filter_map(|s| match &s.work {
                    Work::Relay { join_at, .. } => Some(*join_at),
                    _ => None,
                });
                match next.min() {
                    Some(t) => self.clock.advance_to(t),
                    None => break,
                }
                continue;
            }
            let (cost, seqs) = self.step_cost(&streams, &taking);
            self.trace_step(&streams, &taking, cost);
            self.clock.advance(Duration::from_secs_f64(cost));
            for (s, _) in streams.iter_mut().zip(&taking).filter(|(_, t)| **t) {
                self.complete(s);
            }
            self.watch_spike(&mut spike_over, seqs);
        }
        let end = self.now();
        let n = streams.len().max(1) as f64;
        self.out.rate = streams
            .iter()
            .map(|s| {
                let t = s
                    .finished_at
                    .unwrap_or(end)
                    .saturating_duration_since(s.counted_from);
                s.tokens as f64 / t.as_secs_f64().max(1e-9)
            })
            .sum::<f64>()
            / n;
        if let (Some(None), Some((_, to, _))) = (spike_over, self.sc.noise.spike) {
            // Never recovered: the whole time after the spike.
            let left = end.saturating_duration_since(self.start + to).as_secs_f64();
            self.out.decode_recovery = Some(left);
        }
        self.out
    }

    /// One line per step (`SPECD_SIM_TRACE`): what each stream does in it.
    fn trace_step(&self, streams: &[Stream], taking: &[bool], cost: f64) {
        if !self.trace || !matches!(self.mode, Mode::Auto(_)) {
            return;
        }
        let row: String = streams
            .iter()
            .zip(taking)
            .map(|(s, &t)| match &s.work {
                Work::Verify { p, .. } => {
                    char::from_digit(p.tokens.len().min(35) as u32, 36).unwrap_or('V')
                }
                Work::Relay { .. } if t => 'r',
                Work::Relay { .. } => 'w',
                Work::Plain { .. } => 'p',
                _ => '.',
            })
            .collect();
        self.trace(0, &format_args!("step {:5.1} ms [{row}]", cost * 1e3));
    }

    /// Seconds the next step takes, with noise, and the sequences in it.
    fn step_cost(&mut self, streams: &[Stream], taking: &[bool]) -> (f64, usize) {
        let (mut seqs, mut prefill, mut drafts) = (0usize, false, 0usize);
        for (s, _) in streams.iter().zip(taking).filter(|(_, t)| **t) {
            match &s.work {
                Work::Verify { p, .. } => {
                    seqs += p.tokens.len() + 1;
                    drafts += p.tokens.len();
                    prefill = true;
                }
                Work::Relay { started, .. } | Work::Plain { started, .. } => {
                    seqs += 1;
                    prefill |= !started;
                }
                _ => {}
            }
        }
        let nz = self.sc.noise;
        seqs += nz.others as usize;
        // The machine's noise is drawn per time slot (`Draws`): its speed at the slot the
        // step starts in, and the stalls and other clients' arrivals of the slots the step
        // spans.
        let at = self.now().saturating_duration_since(self.start);
        let d = self.draws;
        let mut factor = 1.0 + nz.jitter * (2.0 * d.unit(Draw::Jitter, &[slot_of(at)]) - 1.0);
        if let Some((from, to, f)) = nz.spike {
            if at >= from && at < to {
                factor *= f;
            }
        }
        let span = slots(at, self.up.step_cost(seqs, prefill, drafts) * factor);
        prefill |= nz.others > 0
            && span
                .clone()
                .any(|s| d.unit(Draw::OtherPrefill, &[s]) < nz.others_prefill);
        let mut cost = self.up.step_cost(seqs, prefill, drafts) * factor;
        for s in span.filter(|&s| nz.stall > 0.0 && d.unit(Draw::Stall, &[s]) < nz.stall) {
            cost += 0.1 + 0.2 * d.unit(Draw::StallLength, &[s]);
        }
        (cost, seqs)
    }

    /// After a load spike: when did the decode estimate come back near the truth?
    fn watch_spike(&mut self, over: &mut Option<Option<f64>>, seqs: usize) {
        let Some((_, to, _)) = self.sc.noise.spike else {
            return;
        };
        let at = self.now().saturating_duration_since(self.start);
        if at < to || matches!(over, Some(Some(_))) {
            return;
        }
        let truth = self.up.step_cost(seqs, false, 0);
        let ok = self
            .ctl
            .decode_cost_estimate(self.ctl.load())
            .is_some_and(|e| (e / truth - 1.0).abs() < 0.25);
        *over = Some(ok.then(|| (at - to).as_secs_f64()));
        if let Some(Some(t)) = over {
            self.out.decode_recovery = Some(*t);
        }
    }

    /// The step ended: the stream's verify returned, or its relay produced a token.
    fn complete(&mut self, s: &mut Stream) {
        let work = std::mem::replace(&mut s.work, Work::Finished);
        s.work = match work {
            Work::Verify { p, sent, spec, _g } => {
                drop(_g);
                self.verified(s, p, sent, spec)
            }
            Work::Relay {
                t, join_at, held, ..
            } => self.relayed(s, t, join_at, held),
            Work::Plain { _g, .. } => {
                let left = self.emit(s, 1, false);
                if left {
                    Work::Plain { started: true, _g }
                } else {
                    drop(_g);
                    self.finish_request(s)
                }
            }
            w => w,
        };
    }

    fn verified(&mut self, s: &mut Stream, p: Proposal, sent: Instant, spec: usize) -> Work {
        let k = p.tokens.len();
        let took = self.now().saturating_duration_since(sent);
        let expected = self.ctl.record_verify(k, spec, took);
        s.req.ctl.note_verify(took, expected);
        let g = s.req.generated;
        let n = p
            .tokens
            .iter()
            .enumerate()
            .take_while(|(i, &t)| t == truth(g + *i as u32))
            .count();
        if k > 0 {
            self.ctl
                .observe_acceptance(&mut s.req.ctl, DRAFTER, &p.confidence, n);
        }
        self.note_streak(&mut s.req, k, n, spec);
        self.note_spec_switch(&mut s.req, k, n);
        self.out.rounds += 1;
        if self.emit(s, n as u32 + 1, true) {
            Work::Round(None, false)
        } else {
            self.finish_request(s)
        }
    }

    fn relayed(
        &mut self,
        s: &mut Stream,
        mut t: Box<RelayTracker>,
        join_at: Instant,
        held: u32,
    ) -> Work {
        let held = held + 1;
        let b = self.sc.noise.burst;
        let key = [
            s.req.key[0],
            s.req.key[1],
            u64::from(s.req.generated),
            held.into(),
        ];
        if b > 0.0 && held < 4 && self.draws.unit(Draw::Burst, &key) < b {
            return Work::Relay {
                t,
                join_at,
                started: true,
                held,
            };
        }
        for i in 0..held {
            self.trace(s.req.generated, &"relayed");
            t.arrived(&self.ctl, self.now(), i + 1 < held);
            let id = truth(s.req.generated);
            if !self.emit(s, 1, false) {
                return self.finish_request(s);
            }
            s.req.relayed += 1;
            self.out.relayed += 1;
            if !t.check(&self.ctl, &mut s.req.ctl, id) {
                continue;
            }
            let remaining = self.remaining(&s.req);
            let cap = self.k_max().min(remaining.saturating_sub(1) as usize);
            let p = self.propose(&mut s.req, cap);
            t.drafted_by(&self.ctl, &mut s.req.ctl, DRAFTER, Vec::new());
            if let Some(p) = t.proposed(&self.ctl, &mut s.req.ctl, p, remaining as usize) {
                // Tokens the relay had buffered beyond this one are dropped with it.
                return Work::Round(Some(p), true);
            }
        }
        Work::Relay {
            t,
            join_at,
            started: true,
            held: 0,
        }
    }

    /// Emit up to `n` tokens; false when the request is complete.
    fn emit(&mut self, s: &mut Stream, n: u32, _speculated: bool) -> bool {
        let n = n.min(self.remaining(&s.req));
        s.req.generated += n;
        s.tokens += u64::from(n);
        self.out.tokens += u64::from(n);
        self.remaining(&s.req) > 0
    }

    fn finish_request(&mut self, s: &mut Stream) -> Work {
        let r = &s.req;
        if r.watched && matches!(self.mode, Mode::Auto(_)) {
            let w = Watched {
                tokens: r.generated,
                speculated: r.generated - r.relayed,
                seconds: self
                    .now()
                    .saturating_duration_since(r.started)
                    .as_secs_f64(),
                plain_seconds: self.ctl.plain_seconds(&r.ctl, r.generated),
            };
            self.trace(r.generated, &w);
            self.ctl.record_auto(w);
        }
        if let Some((at, _, _)) = self.sc.acceptance.change_at() {
            if r.watched && !r.switched && matches!(self.mode, Mode::Auto(_)) {
                self.note_switch(self.sc.tokens.saturating_sub(at));
            }
        }
        s.done_requests += 1;
        if s.done_requests == self.warm {
            s.counted_from = self.now();
            s.tokens = 0;
        }
        if s.done_requests >= self.sc.requests + self.warm {
            s.finished_at = Some(self.now());
            return Work::Finished;
        }
        let (work, req) = self.new_request([s.req.key[0], s.done_requests.into()]);
        s.req = req;
        work
    }
}

/// The time slot `at` lies in.
fn slot_of(at: Duration) -> u64 {
    (at.as_nanos() / SLOT.as_nanos()) as u64
}

/// The time slots that start within `secs` from `at`.
fn slots(at: Duration, secs: f64) -> std::ops::Range<u64> {
    let (from, w) = (at.as_nanos(), SLOT.as_nanos());
    let to = from + Duration::from_secs_f64(secs.max(0.0)).as_nanos();
    (from.div_ceil(w) as u64)..(to.div_ceil(w) as u64)
}

fn takes_part(w: &Work, now: Instant) -> bool {
    match w {
        Work::Verify { .. } | Work::Plain { .. } => true,
        Work::Relay { join_at, .. } => *join_at <= now,
        Work::Round(..) | Work::Finished => false,
    }
}
