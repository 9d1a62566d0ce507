//! Worker tests with scripted engines (no model).

use super::*;
use std::time::Duration;

/// Each row's last token + 1, with probability `prob`.
fn plus_one(rows: &[RowStep<'_>], prob: f32) -> Vec<Sample> {
    rows.iter()
        .map(|r| Sample {
            token: r.tokens.last().map_or(0, |t| t + 1),
            prob,
        })
        .collect()
}

/// Proposes `last + 1` with certainty; each step takes a few milliseconds so that a
/// long proposal is still running when the test acts.
struct Counting;

impl Engine for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }
    fn step(&mut self, rows: &[RowStep<'_>]) -> Result<Vec<Sample>, DraftError> {
        std::thread::sleep(Duration::from_millis(5));
        Ok(plus_one(rows, 1.0))
    }
    fn last_logits(&mut self) -> Result<Vec<Vec<f32>>, DraftError> {
        Ok(Vec::new())
    }
    fn max_slots(&self) -> usize {
        2
    }
    fn max_len(&self) -> usize {
        4096
    }
    fn max_step_tokens(&self) -> usize {
        64
    }
}

fn propose(
    tx: &mpsc::Sender<Msg>,
    ctx: Vec<u32>,
    k: usize,
) -> oneshot::Receiver<Result<Proposal, DraftError>> {
    let (reply, rx) = oneshot::channel();
    let req = DraftRequest {
        stream: 7,
        context: Arc::new(ctx),
        prompt_len: 1,
        max_k: k,
    };
    tx.send(Msg::Propose(req, reply)).expect("worker runs");
    rx
}

#[tokio::test]
async fn a_cancelled_job_does_not_block_its_streams_next_request() {
    let (tx, rx) = mpsc::channel();
    let stats = Arc::new(Stats::default());
    let opts = WorkerOptions {
        stop_below: 0.0,
        vocab_limit: u32::MAX,
    };
    let worker = std::thread::spawn({
        let stats = stats.clone();
        move || run_worker(Box::new(Counting), rx, stats, opts)
    });
    // A long pre-draft runs; the session abandons it and asks for the next round of
    // the same stream right away.
    let first = propose(&tx, vec![1, 2, 3], 1000);
    while stats.steps.load(Ordering::Relaxed) < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(first);
    let next = propose(&tx, vec![1, 2, 9], 3);
    let p = tokio::time::timeout(Duration::from_secs(20), next)
        .await
        .expect("the next request is answered")
        .expect("reply")
        .expect("proposal");
    assert_eq!(p.tokens, vec![10, 11, 12]);
    assert_eq!(stats.cancelled.load(Ordering::Relaxed), 1);
    drop(tx);
    worker.join().expect("worker ends");
}

/// Proposes `last + 1` with probability 0.5 and runs up to 4 decode steps a call (by the
/// trait's step-by-step default).
struct Chaining;

impl Engine for Chaining {
    fn name(&self) -> &'static str {
        "chaining"
    }
    fn step(&mut self, rows: &[RowStep<'_>]) -> Result<Vec<Sample>, DraftError> {
        Ok(plus_one(rows, 0.5))
    }
    fn last_logits(&mut self) -> Result<Vec<Vec<f32>>, DraftError> {
        Ok(Vec::new())
    }
    fn max_slots(&self) -> usize {
        2
    }
    fn max_len(&self) -> usize {
        64
    }
    fn max_step_tokens(&self) -> usize {
        64
    }
    fn max_chain(&self) -> usize {
        4
    }
}

#[tokio::test]
async fn a_run_stops_where_single_steps_would_and_keeps_what_it_fed() {
    let (tx, rx) = mpsc::channel();
    let stats = Arc::new(Stats::default());
    let opts = WorkerOptions {
        stop_below: 0.1,
        vocab_limit: u32::MAX,
    };
    let worker = std::thread::spawn({
        let stats = stats.clone();
        move || run_worker(Box::new(Chaining), rx, stats, opts)
    });
    // Prefill, then a run of up to 4 that ends where the joint confidence falls past the
    // stop, after 3 of them.
    let p = propose(&tx, vec![1, 2, 3], 6)
        .await
        .expect("reply")
        .expect("proposal");
    assert_eq!(p.tokens, vec![4, 5, 6, 7]);
    assert_eq!(p.confidence, vec![0.5; 4]);
    assert_eq!(stats.steps.load(Ordering::Relaxed), 4);
    // The cache holds the context and the fed drafts 4..=6.
    let p = propose(&tx, vec![1, 2, 3, 4, 5, 6, 7], 2)
        .await
        .expect("reply")
        .expect("proposal");
    assert_eq!(p.tokens, vec![8, 9]);
    assert_eq!(stats.reused_tokens.load(Ordering::Relaxed), 6);
    assert_eq!(stats.draft_tokens.load(Ordering::Relaxed), 6);
    drop(tx);
    worker.join().expect("worker ends");
}

/// Proposes `last + 1` with certainty and runs decode steps the way the CUDA engine
/// does: the step after the current one is computed before `more` sees the current
/// one's samples, so one step past a stop is passed on too. Each step sleeps `pause`.
struct RunsAhead {
    pause: Duration,
    runs: Arc<AtomicU64>,
}

impl Engine for RunsAhead {
    fn name(&self) -> &'static str {
        "runs-ahead"
    }
    fn step(&mut self, rows: &[RowStep<'_>]) -> Result<Vec<Sample>, DraftError> {
        std::thread::sleep(self.pause);
        Ok(plus_one(rows, 1.0))
    }
    fn last_logits(&mut self) -> Result<Vec<Vec<f32>>, DraftError> {
        Ok(Vec::new())
    }
    fn max_slots(&self) -> usize {
        4
    }
    fn max_len(&self) -> usize {
        4096
    }
    fn max_step_tokens(&self) -> usize {
        64
    }
    fn max_chain(&self) -> usize {
        4096
    }
    fn decode_while(
        &mut self,
        rows: &[RowStep<'_>],
        max_steps: usize,
        more: &mut dyn FnMut(&[Sample]) -> bool,
    ) -> Result<(), DraftError> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        let next = |prev: &[Sample]| -> Vec<Sample> {
            prev.iter()
                .map(|s| Sample {
                    token: s.token + 1,
                    prob: 1.0,
                })
                .collect()
        };
        let mut current = self.step(rows)?;
        for j in 0..max_steps {
            let ahead = (j + 1 < max_steps).then(|| {
                std::thread::sleep(self.pause);
                next(&current)
            });
            if !more(&current) {
                if let Some(a) = ahead {
                    more(&a);
                }
                break;
            }
            match ahead {
                Some(a) => current = a,
                None => break,
            }
        }
        Ok(())
    }
}

fn propose_for(
    tx: &mpsc::Sender<Msg>,
    stream: StreamId,
    ctx: Vec<u32>,
    k: usize,
) -> oneshot::Receiver<Result<Proposal, DraftError>> {
    let (reply, rx) = oneshot::channel();
    let req = DraftRequest {
        stream,
        context: Arc::new(ctx),
        prompt_len: 1,
        max_k: k,
    };
    tx.send(Msg::Propose(req, reply)).expect("worker runs");
    rx
}

fn spawn(engine: RunsAhead, rx: mpsc::Receiver<Msg>) -> (Arc<Stats>, std::thread::JoinHandle<()>) {
    let stats = Arc::new(Stats::default());
    let opts = WorkerOptions {
        stop_below: 0.0,
        vocab_limit: u32::MAX,
    };
    let worker = std::thread::spawn({
        let stats = stats.clone();
        move || run_worker(Box::new(engine), rx, stats, opts)
    });
    (stats, worker)
}

async fn answer(rx: oneshot::Receiver<Result<Proposal, DraftError>>) -> Proposal {
    tokio::time::timeout(Duration::from_secs(60), rx)
        .await
        .expect("answered")
        .expect("reply")
        .expect("proposal")
}

#[tokio::test]
async fn a_run_of_steps_answers_each_proposal_as_it_completes_and_keeps_what_it_fed() {
    let runs = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel();
    // Queued before the worker starts: both streams prefill in one step, then their next
    // proposals decode together.
    let pre: Vec<_> = [1, 2]
        .into_iter()
        .map(|s| propose_for(&tx, s, vec![10 * s as u32, 10 * s as u32 + 1], 1))
        .collect();
    let a = propose_for(&tx, 1, vec![10, 11, 12], 3);
    let b = propose_for(&tx, 2, vec![20, 21, 22], 9);
    let (stats, worker) = spawn(
        RunsAhead {
            pause: Duration::ZERO,
            runs: runs.clone(),
        },
        rx,
    );
    for p in pre {
        answer(p).await;
    }
    let (a, b) = (answer(a).await, answer(b).await);
    assert_eq!(a.tokens, vec![13, 14, 15]);
    assert_eq!(b.tokens, (23..32).collect::<Vec<u32>>());
    assert_eq!(
        runs.load(Ordering::Relaxed),
        2,
        "together, then the longer proposal alone"
    );
    // Each slot holds its context and the drafts it fed, not the step run past `a`'s
    // end: the next rounds reuse exactly those.
    let reused = stats.reused_tokens.load(Ordering::Relaxed);
    let a = answer(propose_for(&tx, 1, vec![10, 11, 12, 13, 14, 15], 2)).await;
    let b = answer(propose_for(&tx, 2, (20..32).collect(), 2)).await;
    assert_eq!((a.tokens, b.tokens), (vec![16, 17], vec![32, 33]));
    assert_eq!(stats.reused_tokens.load(Ordering::Relaxed) - reused, 5 + 11);
    drop(tx);
    worker.join().expect("worker ends");
}

#[tokio::test]
async fn a_request_arriving_during_a_run_joins_without_waiting_for_it_to_end() {
    let (tx, rx) = mpsc::channel();
    // Two long proposals run together (1000 steps, seconds)...
    let long: Vec<_> = [1, 2]
        .into_iter()
        .map(|s| propose_for(&tx, s, vec![s as u32], 1000))
        .collect();
    let (stats, worker) = spawn(
        RunsAhead {
            pause: Duration::from_millis(2),
            runs: Arc::new(AtomicU64::new(0)),
        },
        rx,
    );
    while stats.steps.load(Ordering::Relaxed) < 4 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // ...and a third stream's short one is answered while they still run.
    let short = answer(propose_for(&tx, 3, vec![100], 2)).await;
    assert_eq!(short.tokens, vec![101, 102]);
    let mut long = long;
    for rx in &mut long {
        assert!(
            matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Empty)),
            "the long proposals are still running"
        );
    }
    drop(long);
    drop(tx);
    worker.join().expect("worker ends");
    assert_eq!(stats.cancelled.load(Ordering::Relaxed), 2);
}
