//! The body of a streamed upstream answer with a bound on the wait for each chunk. One
//! timer serves the whole stream: it is moved only when it fires early (a chunk came in the
//! meantime), not re-armed per chunk, since arming and clearing a timer per chunk was a
//! measurable part of a relayed token's CPU.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use tokio::time::{Instant, Sleep};

use super::Upstream;
use crate::error::ApiError;

type Body = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

pub struct IdleBounded {
    body: Body,
    up: Arc<Upstream>,
    idle: Duration,
    /// When the wait for the next chunk began (`None` between a chunk and the next poll).
    waiting_since: Option<Instant>,
    timer: Pin<Box<Sleep>>,
    done: bool,
}

impl IdleBounded {
    pub fn new(up: Arc<Upstream>, resp: reqwest::Response, idle: Duration) -> Self {
        IdleBounded {
            body: Box::pin(resp.bytes_stream()),
            up,
            idle,
            waiting_since: None,
            timer: Box::pin(tokio::time::sleep(idle)),
            done: false,
        }
    }

    /// Waiting on: has the wait outlasted `idle`? Moves the timer to the wait's deadline
    /// when it fired before it (and registers it again).
    fn poll_idle(&mut self, cx: &mut Context<'_>, since: Instant) -> Poll<()> {
        // A bound past the clock's range never ends the wait (the body wakes the task).
        let Some(deadline) = since.checked_add(self.idle) else {
            return Poll::Pending;
        };
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if Instant::now() >= deadline {
                return Poll::Ready(());
            }
            self.timer.as_mut().reset(deadline);
        }
    }
}

impl Stream for IdleBounded {
    type Item = Result<Bytes, ApiError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let s = self.get_mut();
        if s.done {
            return Poll::Ready(None);
        }
        let since = *s.waiting_since.get_or_insert_with(Instant::now);
        match s.body.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(b))) => {
                s.waiting_since = None;
                Poll::Ready(Some(Ok(b)))
            }
            Poll::Ready(Some(Err(e))) => {
                s.done = true;
                Poll::Ready(Some(Err(s.up.map_send_error(e))))
            }
            Poll::Ready(None) => {
                s.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if s.poll_idle(cx, since).is_pending() {
                    return Poll::Pending;
                }
                s.done = true;
                s.up.count_error("timeout");
                Poll::Ready(Some(Err(ApiError::UpstreamTimeout(format!(
                    "no data from the upstream for {}s",
                    s.idle.as_secs_f64()
                )))))
            }
        }
    }
}
