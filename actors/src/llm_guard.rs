//! An LLM request as the engine consumes it: bounded in time and unable to take the
//! activity down.
//!
//! [`open`] starts a request and wraps its stream: the first chunk must come within
//! `first_chunk`, each next one within `between_chunks`, or the stream yields
//! [`LlmError::Timeout`] and ends; a panic in the adapter (in `chat` or while polling)
//! becomes [`LlmError::Panicked`] and ends it. After its first error the stream yields
//! nothing more, and the adapter's stream is dropped at once — which is what closes an
//! HTTP request promptly.
//!
//! It also yields: after [`CHUNK_BUDGET`] chunks in a row that were ready at once, it
//! wakes itself and answers `Pending` once, so the task that drives it goes to the back
//! of its thread's queue. A model whose chunks are always ready (an in-process model, a
//! cache, `stream::iter`) would otherwise be drained in one poll, holding its arbiter —
//! every other session on it, and its own activity's mailbox, where an interruption
//! waits — until the whole stream was read.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::{Stream, StreamExt};
use tokio::time::{Instant, Sleep};

use crate::llm::{Llm, LlmChunk, LlmError, LlmRequest, LlmStream, LlmTimeouts, TimeoutStage};
use crate::outcome::panic_message;

pin_project_lite::pin_project! {
    /// A guarded LLM stream (see the module docs).
    pub(crate) struct GuardedStream {
        inner: Option<LlmStream>,
        // The request's span, entered while the adapter's stream is polled (its own logs
        // and spans nest under it).
        span: tracing::Span,
        timeouts: LlmTimeouts,
        // The timer lives inline, armed at the first-chunk deadline. It is moved only
        // when the stream waits: earlier, to the gap deadline, the first time the stream
        // waits after a chunk; later, when it fires while chunks keep coming. A chunk
        // costs a clock read, never a timer registration: moving a registered timer
        // earlier wakes the runtime's I/O driver (a syscall), and a model that answers
        // without waiting (a cache, a scripted model) should not pay for that.
        #[pin]
        timer: Sleep,
        last_chunk: Option<Instant>,
        // Chunks given since the stream last waited or yielded.
        ready_in_a_row: u32,
    }
}

/// How many chunks in a row a stream gives before it yields to other work. tokio gives
/// each task a budget of 128 operations on its own resources before it forces a yield;
/// an always-ready model stream touches none of them, so it gets the same budget here.
/// A yield costs one trip through the run queue (well under a microsecond), so 128
/// chunks make it a fraction of a percent of streaming, and another task waits at most
/// 128 chunks' handling (tens of microseconds) for its turn.
pub(crate) const CHUNK_BUDGET: u32 = 128;

/// Starts `request` on `llm`, guarded.
pub(crate) fn open(
    llm: &dyn Llm,
    request: LlmRequest,
    timeouts: LlmTimeouts,
    span: tracing::Span,
) -> GuardedStream {
    let opened = span.in_scope(|| std::panic::catch_unwind(AssertUnwindSafe(|| llm.chat(request))));
    let inner = match opened {
        Ok(stream) => stream,
        Err(panic) => {
            let error = LlmError::Panicked {
                message: panic_message(&*panic),
            };
            futures_util::stream::iter([Err(error)]).boxed()
        }
    };
    GuardedStream {
        inner: Some(inner),
        span,
        timeouts,
        timer: tokio::time::sleep(timeouts.first_chunk),
        last_chunk: None,
        ready_in_a_row: 0,
    }
}

impl Stream for GuardedStream {
    type Item = Result<LlmChunk, LlmError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        if *this.ready_in_a_row >= CHUNK_BUDGET {
            // Let the thread's other tasks (and this actor's mailbox) in first.
            *this.ready_in_a_row = 0;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let _entered = this.span.enter();
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll_next_unpin(cx)));
        match polled {
            Ok(Poll::Ready(Some(Ok(chunk)))) => {
                *this.last_chunk = Some(Instant::now());
                *this.ready_in_a_row += 1;
                Poll::Ready(Some(Ok(chunk)))
            }
            Ok(Poll::Ready(Some(Err(error)))) => {
                *this.inner = None;
                Poll::Ready(Some(Err(error)))
            }
            Ok(Poll::Ready(None)) => {
                *this.inner = None;
                Poll::Ready(None)
            }
            Ok(Poll::Pending) => loop {
                // The stream waited: its next chunks start a new budget.
                *this.ready_in_a_row = 0;
                if let Some(last) = *this.last_chunk {
                    // After a chunk the (maybe shorter) gap limit applies.
                    let due = last + this.timeouts.between_chunks;
                    if this.timer.deadline() > due {
                        this.timer.as_mut().reset(due);
                    }
                }
                if this.timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let Some(last) = *this.last_chunk else {
                    *this.inner = None;
                    return Poll::Ready(Some(Err(LlmError::Timeout {
                        stage: TimeoutStage::FirstChunk,
                        after: this.timeouts.first_chunk,
                    })));
                };
                let due = last + this.timeouts.between_chunks;
                if Instant::now() >= due {
                    *this.inner = None;
                    return Poll::Ready(Some(Err(LlmError::Timeout {
                        stage: TimeoutStage::BetweenChunks,
                        after: this.timeouts.between_chunks,
                    })));
                }
                // Chunks came since the timer was set: wait for the real deadline.
                this.timer.as_mut().reset(due);
            },
            Err(panic) => {
                *this.inner = None;
                Poll::Ready(Some(Err(LlmError::Panicked {
                    message: panic_message(&*panic),
                })))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use futures_util::stream;

    use super::*;
    use crate::chat::ChatContext;
    use crate::llm::ToolChoice;

    fn request() -> LlmRequest {
        LlmRequest {
            agent: "a".into(),
            instructions: "".into(),
            extra_instructions: None,
            chat: ChatContext::new(),
            tools: Vec::new().into(),
            tool_choice: ToolChoice::Auto,
            deferred_call_ids: Vec::new(),
        }
    }

    struct Stalls;
    impl Llm for Stalls {
        fn chat(&self, _request: LlmRequest) -> LlmStream {
            stream::once(async { Ok(LlmChunk::Text("hi".into())) })
                .chain(stream::pending())
                .boxed()
        }
    }

    struct Panics;
    impl Llm for Panics {
        fn chat(&self, _request: LlmRequest) -> LlmStream {
            stream::once(async { Ok(LlmChunk::Text("hi".into())) })
                .chain(stream::poll_fn(
                    |_| -> Poll<Option<Result<LlmChunk, LlmError>>> { panic!("adapter bug") },
                ))
                .boxed()
        }
    }

    struct PanicsAtOnce;
    impl Llm for PanicsAtOnce {
        fn chat(&self, _request: LlmRequest) -> LlmStream {
            panic!("no stream for you")
        }
    }

    const T: LlmTimeouts = LlmTimeouts {
        first_chunk: Duration::from_secs(3),
        between_chunks: Duration::from_secs(1),
    };

    #[tokio::test(start_paused = true)]
    async fn a_stalled_stream_times_out_between_chunks_then_ends() {
        let mut s = Box::pin(open(&Stalls, request(), T, tracing::Span::none()));
        assert!(matches!(s.next().await, Some(Ok(LlmChunk::Text(_)))));
        let started = Instant::now();
        match s.next().await {
            Some(Err(LlmError::Timeout { stage, after })) => {
                assert_eq!(stage, TimeoutStage::BetweenChunks);
                assert_eq!(after, Duration::from_secs(1));
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert_eq!(started.elapsed(), Duration::from_secs(1));
        assert!(s.next().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn no_first_chunk_times_out_with_the_first_chunk_limit() {
        struct Silent;
        impl Llm for Silent {
            fn chat(&self, _request: LlmRequest) -> LlmStream {
                stream::pending().boxed()
            }
        }
        let mut s = Box::pin(open(&Silent, request(), T, tracing::Span::none()));
        match s.next().await {
            Some(Err(LlmError::Timeout { stage, .. })) => {
                assert_eq!(stage, TimeoutStage::FirstChunk)
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
    }

    struct Endless;
    impl Llm for Endless {
        fn chat(&self, _request: LlmRequest) -> LlmStream {
            stream::repeat_with(|| Ok(LlmChunk::Text("x".into()))).boxed()
        }
    }

    #[test]
    fn an_always_ready_stream_yields_once_per_budget_and_wakes_itself() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _guard = runtime.enter();
        let mut s = Box::pin(open(&Endless, request(), T, tracing::Span::none()));
        let wakes = Arc::new(Wakes::default());
        let waker = std::task::Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        for round in 0..3 {
            for _ in 0..CHUNK_BUDGET {
                assert!(matches!(
                    s.as_mut().poll_next(&mut cx),
                    Poll::Ready(Some(Ok(_)))
                ));
            }
            assert!(s.as_mut().poll_next(&mut cx).is_pending(), "round {round}");
            assert_eq!(
                wakes.0.load(Ordering::Relaxed),
                round + 1,
                "it asks to go on"
            );
        }
    }

    #[derive(Default)]
    struct Wakes(AtomicUsize);
    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[tokio::test]
    async fn panics_in_the_adapter_become_errors() {
        let mut s = Box::pin(open(&Panics, request(), T, tracing::Span::none()));
        assert!(matches!(s.next().await, Some(Ok(_))));
        assert!(matches!(
            s.next().await,
            Some(Err(LlmError::Panicked { message })) if message == "adapter bug"
        ));
        assert!(s.next().await.is_none());
        let mut s = Box::pin(open(&PanicsAtOnce, request(), T, tracing::Span::none()));
        assert!(matches!(
            s.next().await,
            Some(Err(LlmError::Panicked { .. }))
        ));
    }
}
