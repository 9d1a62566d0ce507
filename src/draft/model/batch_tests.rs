//! Worker tests with scripted engines (no model).

use super::*;
use std::time::Duration;

/// Proposes `last + 1` with certainty; each step takes a few milliseconds so that a
/// long proposal is still running when the test acts.
struct Counting;

impl Engine for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }
    fn step(&mut self, rows: &[RowStep<'_>]) -> Result<Vec<Sample>, DraftError> {
        std::thread::sleep(Duration::from_millis(5));
        Ok(rows
            .iter()
            .map(|r| Sample {
                token: r.tokens.last().map_or(0, |t| t + 1),
                prob: 1.0,
            })
            .collect())
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

/// Proposes `last + 1` with probability 0.5 and chains up to 4 decode steps (by the
/// trait's step-by-step default).
struct Chaining;

impl Engine for Chaining {
    fn name(&self) -> &'static str {
        "chaining"
    }
    fn step(&mut self, rows: &[RowStep<'_>]) -> Result<Vec<Sample>, DraftError> {
        Ok(rows
            .iter()
            .map(|r| Sample {
                token: r.tokens.last().map_or(0, |t| t + 1),
                prob: 0.5,
            })
            .collect())
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
async fn chained_steps_stop_where_single_steps_would_and_commit_what_was_kept() {
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
    // Prefill, then a chain of 4 whose last sample falls past the confidence stop.
    let p = propose(&tx, vec![1, 2, 3], 6)
        .await
        .expect("reply")
        .expect("proposal");
    assert_eq!(p.tokens, vec![4, 5, 6, 7]);
    assert_eq!(p.confidence, vec![0.5; 4]);
    assert_eq!(stats.steps.load(Ordering::Relaxed), 5);
    // The cache holds the context and the fed drafts 4..=6, not the discarded step.
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
