//! A producer future run inside its consumer: the consumer polls the producer whenever it
//! has nothing queued, and the producer hands items over through a queue they share.
//!
//! Why not a channel: with a channel inside one task, every send wakes the task that is
//! already running, and tokio's multi-threaded scheduler answers a self-wake by waking a
//! parked worker thread too — two futex calls per streamed token, which was most of what
//! relaying a token cost beyond passing it through. Here nothing is woken: after each
//! item the producer yields once, and the consumer, having handed the item on, polls it
//! again when asked for the next one. Only the producer's own waits (the upstream's
//! socket, a drafter) register the task's waker.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_util::Stream;

type Queue<T> = Arc<Mutex<VecDeque<T>>>;

/// The producer's end.
pub struct Outbox<T> {
    q: Queue<T>,
}

impl<T> Outbox<T> {
    /// Queue `item` for the consumer and yield, so that it goes out before the producer
    /// makes the next one.
    pub async fn send(&self, item: T) {
        if let Ok(mut q) = self.q.lock() {
            q.push_back(item);
        }
        YieldOnce(false).await;
    }
}

/// Pending once without waking anyone: only an `Inline` consumer, which polls its producer
/// again after taking the item, may drive a future that awaits this.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        Poll::Pending
    }
}

/// The consumer's end: yields what the producer sends until it ends. Dropping it drops
/// the producer.
pub struct Inline<T> {
    q: Queue<T>,
    producer: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl<T> Inline<T> {
    /// Run `producer`, which gets the outbox to send through.
    pub fn new<F, Fut>(producer: F) -> Self
    where
        F: FnOnce(Outbox<T>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let q: Queue<T> = Arc::default();
        let fut = producer(Outbox { q: q.clone() });
        Inline {
            q,
            producer: Some(Box::pin(fut)),
        }
    }

    fn pop(&self) -> Option<T> {
        self.q.lock().ok()?.pop_front()
    }

    /// The next item; `None` once the producer ended and everything was taken.
    pub fn poll_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        loop {
            if let Some(item) = self.pop() {
                return Poll::Ready(Some(item));
            }
            let Some(p) = self.producer.as_mut() else {
                return Poll::Ready(None);
            };
            match p.as_mut().poll(cx) {
                Poll::Ready(()) => self.producer = None,
                // Either it sent something (and yielded), or it waits on something that
                // will wake the task.
                Poll::Pending => return self.pop().map_or(Poll::Pending, |i| Poll::Ready(Some(i))),
            }
        }
    }

    /// `poll_item` as a future.
    pub async fn next_item(&mut self) -> Option<T> {
        std::future::poll_fn(|cx| self.poll_item(cx)).await
    }

    /// Drop the producer now (before whatever else the owner drops).
    pub fn stop(&mut self) {
        self.producer = None;
    }
}

impl<T> Stream for Inline<T> {
    type Item = T;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.get_mut().poll_item(cx)
    }
}

impl<T> Unpin for Inline<T> {}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    #[tokio::test]
    async fn items_arrive_in_order_and_the_end_is_seen() {
        let s = Inline::new(|out| async move {
            for i in 0..5u32 {
                out.send(i).await;
                tokio::task::yield_now().await;
            }
        });
        assert_eq!(s.collect::<Vec<_>>().await, vec![0, 1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn each_item_is_handed_on_before_the_next_is_made() {
        let made = Arc::new(Mutex::new(0u32));
        let m = made.clone();
        let mut s = Inline::new(move |out| async move {
            for i in 0..3u32 {
                *m.lock().unwrap() += 1;
                out.send(i).await;
            }
        });
        assert_eq!(s.next_item().await, Some(0));
        assert_eq!(*made.lock().unwrap(), 1);
        assert_eq!(s.next_item().await, Some(1));
        assert_eq!(*made.lock().unwrap(), 2);
    }

    #[tokio::test]
    async fn waits_of_the_producer_wake_the_consumer() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let s = Inline::new(move |out| async move {
            if let Ok(v) = rx.await {
                out.send(v).await;
            }
        });
        let reader = tokio::spawn(s.collect::<Vec<_>>());
        tokio::task::yield_now().await;
        let _ = tx.send(7);
        assert_eq!(reader.await.ok(), Some(vec![7]));
    }
}
