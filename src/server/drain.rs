//! The end of a drain. When `--drain-timeout` passes with requests still in flight, each
//! one is ended with a clear 503 (on a stream: an error event, then `[DONE]`) instead of a
//! connection cut mid-chunk, so that clients learn why their answer stopped.

use std::future::Future;
use std::pin::Pin;

use tokio::sync::watch;

/// Held by the server; `cut` ends the requests still in flight.
#[derive(Debug)]
pub struct DrainCut {
    tx: watch::Sender<bool>,
}

impl Default for DrainCut {
    fn default() -> Self {
        DrainCut {
            tx: watch::Sender::new(false),
        }
    }
}

impl DrainCut {
    pub fn cut(&self) {
        self.tx.send_replace(true);
    }

    /// A signal for one request to watch.
    pub fn signal(&self) -> Cut {
        Cut(self.tx.subscribe())
    }
}

/// One request's view of the cut.
#[derive(Debug)]
pub struct Cut(watch::Receiver<bool>);

impl Cut {
    /// Resolves once the drain timeout has passed (at once if it already has); never
    /// while specd serves.
    pub async fn passed(&mut self) {
        if self.0.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// [`Cut::passed`] as an owned future, for bodies polled by hand.
    pub fn into_future(mut self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move { self.passed().await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Context, Poll};

    #[tokio::test]
    async fn signals_resolve_only_after_the_cut() {
        let d = DrainCut::default();
        let mut before = d.signal().into_future();
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(before.as_mut().poll(&mut cx).is_pending());
        d.cut();
        assert_eq!(before.as_mut().poll(&mut cx), Poll::Ready(()));
        // A request that starts watching after the cut sees it at once.
        d.signal().passed().await;
    }
}
