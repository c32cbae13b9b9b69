//! The sessions' calls to OpenCode, made on a thread of their own.
//!
//! A recovery is a handful of HTTP exchanges (a status read, the abort, the reads a
//! continue renders from, the prompt), and each exchange is several trips through its
//! runtime's run queue: the request handed to the connection's task, the answer's head,
//! its body, the hand-back. Made on the sessions' thread, every trip waited behind
//! whatever sessions had events queued — during a burst, thousands — so a recovery's
//! REST time grew with the very load it ran under. [`IoThread`] runs each call whole on
//! an io thread (`shepherd-io-N`, one per server thread, so the calls' own work — an
//! answer's parse — spreads as the sessions do; the connections' tasks live there too)
//! and the session's thread is woken once, with the answer.
//!
//! A call whose caller stops waiting (an actor stopped, a recovery given up) is
//! cancelled where it runs, as it was when it ran on the caller's thread. A call the
//! thread could not finish — it stopped at shutdown — is an error of the kind the
//! cores already handle: never sent for a read, possibly delivered for a change
//! ([`EngineError::Unconfirmed`]).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use actix::ArbiterHandle;
use async_trait::async_trait;
use futures::future::{AbortHandle, Abortable};
use shepherd_actors::event::{Event, ModelRef, SessionInfo, ShepherdSessionMark, Status, Todo};
use shepherd_actors::ports::{
    Control, Discovery, Engine, EngineError, HistoryMessage, LastTurn, Lifecycle, Prompt, Reads, Recent,
    TurnSettings,
};
use tracing::Instrument as _;

/// An [`Engine`] whose calls run on an io thread (the one paired with its callers' thread).
pub struct IoThread {
    engine: Arc<dyn Engine>,
    io: ArbiterHandle,
}

/// Whether a call changes the session: one cut short may have been delivered.
#[derive(Clone, Copy)]
enum Kind {
    Read,
    Change,
}

/// Cancels the call on the io thread when its caller stops waiting.
struct CancelOnDrop(AbortHandle);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl IoThread {
    pub fn new(engine: Arc<dyn Engine>, io: ArbiterHandle) -> Self {
        Self { engine, io }
    }

    /// Runs `call` on the io thread and waits for its answer.
    async fn run<T, F, Fut>(&self, kind: Kind, what: &str, call: F) -> Result<T, EngineError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<dyn Engine>) -> Fut,
        Fut: Future<Output = Result<T, EngineError>> + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let (abort, registration) = AbortHandle::new_pair();
        // The caller's span (its session) goes along: the client's own log lines keep it.
        let task = Abortable::new(call(Arc::clone(&self.engine)), registration).instrument(tracing::Span::current());
        let _cancel = CancelOnDrop(abort);
        let sent = self.io.spawn(async move {
            if let Ok(result) = task.await {
                let _ = answer.send(result);
            }
        });
        if !sent {
            return Err(EngineError::Unreachable(format!("{what}: not sent: the io thread has stopped")));
        }
        answered.await.unwrap_or_else(|_| {
            let why = format!("{what}: the io thread stopped before the answer");
            Err(match kind {
                Kind::Read => EngineError::Unreachable(why),
                Kind::Change => EngineError::Unconfirmed(why),
            })
        })
    }
}

#[async_trait]
impl Reads for IoThread {
    async fn statuses(&self, directory: &str) -> Result<HashMap<String, Status>, EngineError> {
        let directory = directory.to_string();
        self.run(Kind::Read, "GET /session/status", |e| async move { e.statuses(&directory).await }).await
    }

    async fn status(&self, directory: &str, session_id: &str) -> Result<Option<Status>, EngineError> {
        let (directory, id) = (directory.to_string(), session_id.to_string());
        self.run(Kind::Read, "GET /session/status", |e| async move { e.status(&directory, &id).await }).await
    }

    async fn session(&self, session_id: &str) -> Result<SessionInfo, EngineError> {
        let id = session_id.to_string();
        self.run(Kind::Read, "GET /session/{id}", |e| async move { e.session(&id).await }).await
    }

    async fn todos(&self, session_id: &str) -> Result<Vec<Todo>, EngineError> {
        let id = session_id.to_string();
        self.run(Kind::Read, "GET /session/{id}/todo", |e| async move { e.todos(&id).await }).await
    }

    async fn last_turn_settings(&self, session_id: &str) -> Result<TurnSettings, EngineError> {
        let id = session_id.to_string();
        self.run(Kind::Read, "GET /session/{id}/message", |e| async move { e.last_turn_settings(&id).await }).await
    }

    async fn recent(&self, session_id: &str, limit: u32) -> Result<Recent, EngineError> {
        let id = session_id.to_string();
        self.run(Kind::Read, "GET /session/{id}/message", move |e| async move { e.recent(&id, limit).await }).await
    }

    async fn last_turn(&self, session_id: &str) -> Result<Option<LastTurn>, EngineError> {
        let id = session_id.to_string();
        self.run(Kind::Read, "GET /session/{id}/message", |e| async move { e.last_turn(&id).await }).await
    }

    async fn latest_turn(&self, session_id: &str) -> Result<Option<LastTurn>, EngineError> {
        let id = session_id.to_string();
        self.run(Kind::Read, "GET /session/{id}/message", |e| async move { e.latest_turn(&id).await }).await
    }

    async fn history(&self, session_id: &str, limit: u32) -> Result<Vec<HistoryMessage>, EngineError> {
        let id = session_id.to_string();
        self.run(Kind::Read, "GET /session/{id}/message", move |e| async move { e.history(&id, limit).await }).await
    }
}

#[async_trait]
impl Control for IoThread {
    async fn abort(&self, session_id: &str) -> Result<(), EngineError> {
        let id = session_id.to_string();
        self.run(Kind::Change, "POST /session/{id}/abort", |e| async move { e.abort(&id).await }).await
    }

    async fn prompt(&self, session_id: &str, prompt: &Prompt) -> Result<(), EngineError> {
        let (id, prompt) = (session_id.to_string(), prompt.clone());
        self.run(Kind::Change, "POST /session/{id}/prompt_async", |e| async move { e.prompt(&id, &prompt).await })
            .await
    }

    async fn summarize(&self, session_id: &str, model: &ModelRef) -> Result<(), EngineError> {
        let (id, model) = (session_id.to_string(), model.clone());
        self.run(Kind::Change, "POST /session/{id}/summarize", |e| async move { e.summarize(&id, &model).await })
            .await
    }

    async fn ask(&self, session_id: &str, prompt: &Prompt) -> Result<String, EngineError> {
        let (id, prompt) = (session_id.to_string(), prompt.clone());
        self.run(Kind::Change, "POST /session/{id}/message", |e| async move { e.ask(&id, &prompt).await }).await
    }
}

#[async_trait]
impl Lifecycle for IoThread {
    async fn create_session(
        &self,
        directory: Option<&str>,
        title: &str,
        mark: &ShepherdSessionMark,
    ) -> Result<SessionInfo, EngineError> {
        let (directory, title, mark) = (directory.map(str::to_string), title.to_string(), mark.clone());
        self.run(Kind::Change, "POST /session", |e| async move {
            e.create_session(directory.as_deref(), &title, &mark).await
        })
        .await
    }

    async fn find_sessions(&self, directory: Option<&str>, title_part: &str) -> Result<Vec<SessionInfo>, EngineError> {
        let (directory, part) = (directory.map(str::to_string), title_part.to_string());
        self.run(Kind::Read, "GET /session", |e| async move { e.find_sessions(directory.as_deref(), &part).await }).await
    }

    async fn fork(&self, session_id: &str) -> Result<SessionInfo, EngineError> {
        let id = session_id.to_string();
        self.run(Kind::Change, "POST /session/{id}/fork", |e| async move { e.fork(&id).await }).await
    }

    async fn delete_session(&self, session_id: &str) -> Result<(), EngineError> {
        let id = session_id.to_string();
        self.run(Kind::Change, "DELETE /session/{id}", |e| async move { e.delete_session(&id).await }).await
    }
}

#[async_trait]
impl Discovery for IoThread {
    async fn list_sessions(&self, limit: u32) -> Result<Vec<SessionInfo>, EngineError> {
        self.run(Kind::Read, "GET /session", move |e| async move { e.list_sessions(limit).await }).await
    }

    async fn model_windows(&self) -> Result<HashMap<String, u64>, EngineError> {
        self.run(Kind::Read, "GET /config/providers", |e| async move { e.model_windows().await }).await
    }

    async fn pending_asks(&self, directory: &str) -> Result<Vec<Event>, EngineError> {
        let directory = directory.to_string();
        self.run(Kind::Read, "GET /question", |e| async move { e.pending_asks(&directory).await }).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    /// Answers `abort` with the name of the thread it ran on, after `delay`; notes
    /// whether a call was dropped before it finished.
    #[derive(Default)]
    struct Where {
        ran_on: Mutex<Option<String>>,
        delay: Duration,
        cut_short: Arc<AtomicBool>,
    }

    /// Set when dropped unfinished.
    struct Unfinished(Arc<AtomicBool>);

    impl Drop for Unfinished {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn unused() -> EngineError {
        EngineError::Unreachable("not used here".into())
    }

    #[async_trait]
    impl Reads for Where {
        async fn statuses(&self, _: &str) -> Result<HashMap<String, Status>, EngineError> {
            Err(unused())
        }
        async fn session(&self, _: &str) -> Result<SessionInfo, EngineError> {
            Err(unused())
        }
        async fn todos(&self, _: &str) -> Result<Vec<Todo>, EngineError> {
            Err(unused())
        }
        async fn last_turn_settings(&self, _: &str) -> Result<TurnSettings, EngineError> {
            Err(unused())
        }
        async fn last_turn(&self, _: &str) -> Result<Option<LastTurn>, EngineError> {
            Err(unused())
        }
    }

    #[async_trait]
    impl Control for Where {
        async fn abort(&self, _: &str) -> Result<(), EngineError> {
            let unfinished = Unfinished(Arc::clone(&self.cut_short));
            *self.ran_on.lock().unwrap() = std::thread::current().name().map(str::to_string);
            tokio::time::sleep(self.delay).await;
            std::mem::forget(unfinished);
            Ok(())
        }
        async fn prompt(&self, _: &str, _: &Prompt) -> Result<(), EngineError> {
            Err(unused())
        }
        async fn summarize(&self, _: &str, _: &ModelRef) -> Result<(), EngineError> {
            Err(unused())
        }
    }

    impl Lifecycle for Where {}

    #[async_trait]
    impl Discovery for Where {
        async fn list_sessions(&self, _: u32) -> Result<Vec<SessionInfo>, EngineError> {
            Err(unused())
        }
        async fn model_windows(&self) -> Result<HashMap<String, u64>, EngineError> {
            Err(unused())
        }
        async fn pending_asks(&self, _: &str) -> Result<Vec<Event>, EngineError> {
            Err(unused())
        }
    }

    #[actix::test]
    async fn a_call_is_made_on_the_io_thread_and_its_answer_comes_back() {
        let io = actix::Arbiter::new();
        let engine = Arc::new(Where::default());
        let on_io = IoThread::new(Arc::clone(&engine) as Arc<dyn Engine>, io.handle());
        on_io.abort("ses_a").await.expect("answered");
        let ran_on = engine.ran_on.lock().unwrap().clone();
        let here = std::thread::current().name().map(str::to_string);
        assert!(ran_on.is_some() && ran_on != here, "ran on {ran_on:?}, the caller is {here:?}");
        io.stop();
    }

    /// As on the caller's own thread: a caller that stops waiting (its actor stopped)
    /// cuts the call short, rather than leaving it to land later.
    #[actix::test]
    async fn a_caller_that_stops_waiting_cancels_the_call() {
        let io = actix::Arbiter::new();
        let engine = Arc::new(Where { delay: Duration::from_secs(30), ..Where::default() });
        let on_io = IoThread::new(Arc::clone(&engine) as Arc<dyn Engine>, io.handle());
        let gave_up = tokio::time::timeout(Duration::from_millis(100), on_io.abort("ses_a")).await;
        assert!(gave_up.is_err(), "the call takes 30 s");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !engine.cut_short.load(Ordering::SeqCst) {
            assert!(std::time::Instant::now() < deadline, "the call still runs on the io thread");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        io.stop();
    }

    /// A change the stopped thread could not make was never sent: the cores retry it
    /// as undelivered.
    #[actix::test]
    async fn a_stopped_io_thread_sends_nothing_and_says_so() {
        let io = actix::Arbiter::new();
        let handle = io.handle();
        io.stop();
        io.join().unwrap();
        let on_io = IoThread::new(Arc::new(Where::default()), handle);
        match on_io.abort("ses_a").await {
            Err(EngineError::Unreachable(why)) => assert!(why.contains("not sent"), "{why}"),
            other => panic!("expected never sent, got {other:?}"),
        }
    }
}
