//! The loop against an in-memory upstream whose next token is `specd_sim::next_token`: switching
//! between relay and speculation keeps the output exact, overlap is used only when right,
//! and seeded sampled requests never relay.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::{ready, BoxFuture};
use futures_util::{FutureExt, StreamExt};
use serde_json::{Map, Value};

use super::*;
use std::sync::Arc;

use crate::draft::{DraftError, DrafterKind};
use crate::draft::{DraftRequest, DraftSet, Drafter};
use crate::metrics::Metrics;
use crate::speculation::controller::{Controller, VirtualClock};
use crate::tokens::ModelTokenizer;
use crate::upstream::verify::{Backend, Sample, Sampling, VerifyRequest};
use crate::upstream::verify::{RelayRequest, SampleStream, Tokenized};
use specd_sim::{continuation, next_token};

const VOCAB: u32 = 64;

struct Mock {
    verify_delay: Duration,
    token_delay: Duration,
    relays: AtomicUsize,
    /// Advanced instead of sleeping, when set: the run is then in virtual time.
    clock: Option<Arc<VirtualClock>>,
}

/// Sleep for `d`, or advance the virtual clock by it.
async fn wait(clock: Option<&VirtualClock>, d: Duration) {
    match clock {
        Some(c) => c.advance(d),
        None => tokio::time::sleep(d).await,
    }
}

impl Backend for Mock {
    fn verify<'a>(
        &'a self,
        req: VerifyRequest<'a>,
    ) -> BoxFuture<'a, Result<Vec<Sample>, ApiError>> {
        async move {
            wait(self.clock.as_deref(), self.verify_delay).await;
            let mut ctx = req.context.to_vec();
            let mut out = vec![Sample::id(next_token(&ctx, VOCAB))];
            for &d in req.drafts {
                ctx.push(d);
                out.push(Sample::id(next_token(&ctx, VOCAB)));
            }
            Ok(out)
        }
        .boxed()
    }
    fn tokenize_prompt<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Tokenized, ApiError>> {
        ready(Err(ApiError::Internal("not in tests".into()))).boxed()
    }
    fn tokenize_chat<'a>(
        &'a self,
        _: &'a str,
        _: &'a Map<String, Value>,
    ) -> BoxFuture<'a, Result<Tokenized, ApiError>> {
        ready(Err(ApiError::Internal("not in tests".into()))).boxed()
    }
    fn relay<'a>(&'a self, req: RelayRequest<'a>) -> BoxFuture<'a, Result<SampleStream, ApiError>> {
        self.relays.fetch_add(1, Ordering::Relaxed);
        let toks = continuation(req.context, req.max_tokens as usize, VOCAB);
        let delay = self.token_delay;
        let clock = self.clock.clone();
        let s = futures_util::stream::iter(toks).then(move |t| {
            let clock = clock.clone();
            async move {
                // A token is not there before it is decoded: the first poll (the session
                // asking whether one is already waiting) finds nothing, and its time
                // passes when the session waits for it.
                tokio::task::yield_now().await;
                wait(clock.as_deref(), delay).await;
                Ok(Sample::id(t))
            }
        });
        ready(Ok(s.boxed())).boxed()
    }
    fn kind(&self) -> &'static str {
        "vllm"
    }
}

/// Proposes the true continuation, each absolute position kept with probability `keep`.
struct Truthful {
    kind: DrafterKind,
    keep: f64,
    overlap: bool,
}

impl Drafter for Truthful {
    fn kind(&self) -> DrafterKind {
        self.kind
    }
    fn propose(&self, req: DraftRequest) -> BoxFuture<'_, Result<Proposal, DraftError>> {
        let truth = continuation(&req.context, req.max_k, VOCAB);
        let start = req.context.len();
        let tokens: Vec<u32> = truth
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                let kept = fastrand::Rng::with_seed((start + i) as u64).f64() < self.keep;
                if kept {
                    t
                } else {
                    (t + 1) % VOCAB
                }
            })
            .collect();
        let confidence = vec![0.9; tokens.len()];
        ready(Ok(Proposal { tokens, confidence })).boxed()
    }
    fn wants_overlap(&self) -> bool {
        self.overlap
    }
}

/// A hopeless drafter (kind `model`) whose every proposal takes `cost` of virtual time.
struct Costly {
    clock: Arc<VirtualClock>,
    cost: Duration,
    calls: Arc<AtomicUsize>,
}

impl Drafter for Costly {
    fn kind(&self) -> DrafterKind {
        DrafterKind::Model
    }
    fn propose(&self, req: DraftRequest) -> BoxFuture<'_, Result<Proposal, DraftError>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.clock.advance(self.cost);
        let truth = continuation(&req.context, req.max_k, VOCAB);
        let tokens: Vec<u32> = truth.iter().map(|t| (t + 1) % VOCAB).collect();
        let confidence = vec![0.9; tokens.len()];
        ready(Ok(Proposal { tokens, confidence })).boxed()
    }
}

fn tokenizer() -> Arc<ModelTokenizer> {
    let vocab: Map<String, Value> = (0..VOCAB).map(|i| (format!("t{i}"), i.into())).collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    });
    let tokenizer: tokenizers::Tokenizer = json.to_string().parse().expect("tokenizer json");
    Arc::new(ModelTokenizer::from_tokenizer(tokenizer))
}

struct Run {
    tokens: Vec<u32>,
    stats: Stats,
    metrics: Arc<Metrics>,
    relays: usize,
}

struct Setup {
    mode: SpecMode,
    keep: f64,
    overlap: bool,
    switch_every: Option<usize>,
    sampling: Sampling,
    controller: Arc<Controller>,
    max_tokens: u32,
    /// A second drafter (kind `ngram`) keeping positions with this probability: the
    /// request drafts with both and each round verifies the one valued more.
    rival: Option<f64>,
    /// A costly hopeless drafter beside the oracle (the request drafts with both), and the
    /// virtual clock the whole run then keeps.
    costly: Option<Costly>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            mode: SpecMode::Auto,
            keep: 1.0,
            overlap: false,
            switch_every: None,
            sampling: Sampling {
                temperature: Some(0.0),
                ..Sampling::default()
            },
            controller: Arc::new(Controller::default()),
            max_tokens: 60,
            rival: None,
            costly: None,
        }
    }
}

const PROMPT: [u32; 5] = [10, 11, 12, 13, 14];

async fn run_session(s: Setup) -> Run {
    let metrics = Arc::new(Metrics::new());
    let backend = Arc::new(Mock {
        verify_delay: Duration::from_millis(4),
        token_delay: Duration::from_millis(2),
        relays: AtomicUsize::new(0),
        clock: s.costly.as_ref().map(|c| c.clock.clone()),
    });
    let params = SessionParams {
        stream: 1,
        model: "m".into(),
        prompt: PROMPT.to_vec(),
        sampling: s.sampling,
        max_tokens: s.max_tokens,
        max_model_len: 4096,
        stop: vec![],
        stop_token_ids: vec![],
        ignore_eos: true,
        skip_special_tokens: true,
        include_stop_str: false,
        mode: s.mode,
        k_max: 4,
        switch_every: s.switch_every,
        reasoning: None,
        tools: None,
    };
    let oracle: Arc<dyn Drafter> = Arc::new(Truthful {
        kind: DrafterKind::Oracle,
        keep: s.keep,
        overlap: s.overlap,
    });
    let drafters = match (s.rival, s.costly) {
        (_, Some(costly)) => DraftSet::choose_among(vec![oracle, Arc::new(costly)]),
        (None, None) => DraftSet::one(oracle),
        (Some(keep), None) => {
            let rival: Arc<dyn Drafter> = Arc::new(Truthful {
                kind: DrafterKind::Ngram,
                keep,
                overlap: false,
            });
            DraftSet::choose_among(vec![rival, oracle])
        }
    };
    let deps = SessionDeps {
        backend: backend.clone(),
        drafters,
        tokenizer: tokenizer(),
        metrics: metrics.clone(),
        controller: s.controller,
    };
    let mut rx = start(params, deps);
    let mut tokens = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Delta { tokens: t, .. } => tokens.extend(t.iter().map(|s| s.id)),
            Event::Done {
                tokens: t, stats, ..
            } => {
                tokens.extend(t.iter().map(|s| s.id));
                return Run {
                    tokens,
                    stats,
                    metrics,
                    relays: backend.relays.load(Ordering::Relaxed),
                };
            }
            Event::Error(e) => panic!("session failed: {e}"),
        }
    }
    panic!("session ended without Done")
}

fn truth(n: usize) -> Vec<u32> {
    continuation(&PROMPT, n, VOCAB)
}

#[tokio::test]
async fn forced_switching_loses_and_repeats_no_token() {
    for n in [1, 2, 3, 5, 7] {
        for keep in [1.0, 0.5, 0.0] {
            let r = run_session(Setup {
                switch_every: Some(n),
                keep,
                ..Setup::default()
            })
            .await;
            assert_eq!(r.tokens, truth(60), "switch every {n}, keep {keep}");
            assert!(r.stats.relay_tokens > 0 && r.stats.rounds > 0, "n={n}");
            assert!(
                r.stats.switches >= (60 / n as u32) - 1,
                "n={n}: {:?}",
                r.stats
            );
            assert_eq!(
                r.relays as u32,
                60 / (2 * n as u32),
                "one relay per relay phase"
            );
        }
    }
}

#[tokio::test]
async fn auto_output_is_exact_whatever_it_decides() {
    // One controller across requests, so later ones decide from learned estimates.
    let controller = Arc::new(Controller::default());
    for keep in [0.0, 0.3, 0.8, 1.0, 0.0] {
        let r = run_session(Setup {
            keep,
            controller: controller.clone(),
            ..Setup::default()
        })
        .await;
        assert_eq!(r.tokens, truth(60), "keep {keep}");
        assert_eq!(
            r.stats.completion_tokens,
            r.stats.relay_tokens + r.stats.rounds + r.stats.accepted_tokens,
            "every token came from a round or the relay: {:?}",
            r.stats
        );
    }
}

#[tokio::test]
async fn overlap_is_kept_only_when_the_guess_was_right() {
    let hits = |m: &Metrics, o: &str| m.draft_overlap.with_label_values(&[o]).get();
    let r = run_session(Setup {
        mode: SpecMode::On,
        overlap: true,
        keep: 1.0,
        ..Setup::default()
    })
    .await;
    assert_eq!(r.tokens, truth(60));
    assert!(hits(&r.metrics, "hit") > 0);
    assert_eq!(hits(&r.metrics, "miss"), 0);
    let r = run_session(Setup {
        mode: SpecMode::On,
        overlap: true,
        keep: 0.0,
        ..Setup::default()
    })
    .await;
    assert_eq!(r.tokens, truth(60));
    assert_eq!(hits(&r.metrics, "hit"), 0);
    assert!(hits(&r.metrics, "miss") > 0);
    let r = run_session(Setup {
        mode: SpecMode::On,
        keep: 1.0,
        ..Setup::default()
    })
    .await;
    assert_eq!(hits(&r.metrics, "hit") + hits(&r.metrics, "miss"), 0);
}

#[tokio::test]
async fn seeded_sampling_never_relays_on_the_controllers_say() {
    let sampling = Sampling {
        temperature: Some(0.8),
        seed: Some(7),
        ..Sampling::default()
    };
    let r = run_session(Setup {
        keep: 0.0,
        sampling: sampling.clone(),
        ..Setup::default()
    })
    .await;
    assert_eq!(r.stats.relay_tokens, 0, "{:?}", r.stats);
    assert_eq!(r.relays, 0);
    // Unseeded, the same hopeless drafts end up relayed.
    let r = run_session(Setup {
        keep: 0.0,
        max_tokens: 120,
        ..Setup::default()
    })
    .await;
    assert!(r.stats.relay_tokens > 0, "{:?}", r.stats);
}

#[tokio::test]
async fn drafting_with_several_verifies_the_better_proposal() {
    let accepted =
        |m: &Metrics, d: DrafterKind| m.num_accepted_tokens.with_label_values(&[d.as_str()]).get();
    let drafts =
        |m: &Metrics, d: DrafterKind| m.num_draft_tokens.with_label_values(&[d.as_str()]).get();
    // Either order of quality: the bad drafter's proposals are soon no longer verified.
    for (oracle, rival) in [(1.0, 0.0), (0.0, 1.0)] {
        let r = run_session(Setup {
            mode: SpecMode::On,
            keep: oracle,
            rival: Some(rival),
            max_tokens: 120,
            ..Setup::default()
        })
        .await;
        assert_eq!(r.tokens, truth(120), "oracle {oracle}, rival {rival}");
        assert_eq!(r.stats.drafter.as_str(), "auto");
        let (good, bad) = if oracle > rival {
            (DrafterKind::Oracle, DrafterKind::Ngram)
        } else {
            (DrafterKind::Ngram, DrafterKind::Oracle)
        };
        let m = &r.metrics;
        assert!(
            drafts(m, good) > 4 * drafts(m, bad),
            "good {good} verified {} drafts, bad {bad} {}",
            drafts(m, good),
            drafts(m, bad)
        );
        assert!(accepted(m, good) >= 80, "{:?}", r.stats);
        assert_eq!(accepted(m, bad), 0);
    }
}

#[tokio::test]
async fn auto_with_several_drafters_is_exact() {
    let controller = Arc::new(Controller::default());
    for (keep, rival) in [(0.0, 0.0), (0.3, 0.8), (1.0, 0.2), (0.0, 1.0)] {
        let r = run_session(Setup {
            keep,
            rival: Some(rival),
            controller: controller.clone(),
            ..Setup::default()
        })
        .await;
        assert_eq!(r.tokens, truth(60), "keep {keep}, rival {rival}");
        assert_eq!(
            r.stats.completion_tokens,
            r.stats.relay_tokens + r.stats.rounds + r.stats.accepted_tokens,
            "{:?}",
            r.stats
        );
    }
}

#[tokio::test]
async fn a_costly_drafter_beside_a_cheap_one_drafts_within_its_share() {
    // Virtual time: a relayed token takes 2 ms, a verify 4 ms, a proposal of the costly
    // drafter 5 ms; the oracle costs nothing.
    for keep in [0.0, 1.0] {
        let clock = Arc::new(VirtualClock::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let r = run_session(Setup {
            keep,
            max_tokens: 600,
            controller: Arc::new(Controller::default().with_clock(clock.clone())),
            costly: Some(Costly {
                clock: clock.clone(),
                cost: Duration::from_millis(5),
                calls: calls.clone(),
            }),
            ..Setup::default()
        })
        .await;
        assert_eq!(r.tokens, truth(600), "keep {keep}");
        let costly = calls.load(Ordering::Relaxed) as f64;
        // Its share of the time: 3 % of 600 decode steps of 2 ms is 36 ms, 7 proposals;
        // a few more while its cost and the decode cost are first measured.
        assert!(
            costly <= 12.0,
            "keep {keep}: {costly} costly proposals, {:?}",
            r.stats
        );
        let spent = clock.elapsed().as_secs_f64();
        assert!(
            costly * 0.005 <= 0.05 * spent,
            "keep {keep}: {costly} costly proposals in {spent:.3} s"
        );
        if keep == 1.0 {
            assert!(r.stats.accepted_tokens > 400, "{:?}", r.stats);
        } else {
            assert!(r.stats.relay_tokens > 500, "{:?}", r.stats);
        }
    }
}
