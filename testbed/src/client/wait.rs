//! Waiting for a condition: [`wait_until`] polls a check until it holds or a timeout
//! passes, and the waits tests use most (idle, busy, a turn's end) are built on it.

use std::future::Future;
use std::time::Duration;

use super::{ClientError, Message, OpenCodeClient};

/// Poll interval of [`wait_until`].
const POLL_EVERY: Duration = Duration::from_millis(100);

/// Polls `check` every 100 ms until it returns `Ok(Some(value))`, and returns the value.
/// `Ok(None)` and errors mean "not yet" (a server that is restarting answers with
/// errors); after `timeout` the result is an error naming `what` and the last error seen.
pub async fn wait_until<T, E, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, E>>,
    E: std::fmt::Display,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_error: Option<String>;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => last_error = None,
            Err(e) => last_error = Some(e.to_string()),
        }
        if tokio::time::Instant::now() >= deadline {
            match last_error {
                Some(e) => {
                    anyhow::bail!("timed out after {timeout:?} waiting for {what}; last error: {e}")
                }
                None => anyhow::bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// [`wait_until`] for a yes/no condition.
pub async fn wait_for<E, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, E>>,
    E: std::fmt::Display,
{
    wait_until(what, timeout, || {
        let fut = check();
        async move { fut.await.map(|ok| ok.then_some(())) }
    })
    .await
}

impl OpenCodeClient {
    /// Waits until the session is absent from `/session/status` (idle).
    pub async fn wait_idle(&self, id: &str, timeout: Duration) -> anyhow::Result<()> {
        wait_for(&format!("session {id} to be idle"), timeout, || async { self.is_busy(id).await.map(|busy| !busy) })
            .await
    }

    /// Prompts `text` and waits until that turn is over: the user message is stored, the
    /// session is idle and the last message is a completed assistant message. Returns that
    /// message. `prompt_async`'s 204 alone means little: the user message is stored and the
    /// session turns busy a moment later (seconds, on a freshly started server).
    ///
    /// A turn that ends without an assistant message (unknown model) times out.
    pub async fn prompt_and_wait(&self, id: &str, text: &str, timeout: Duration) -> anyhow::Result<Message> {
        let users_before = self.user_message_count(id).await?;
        self.prompt_async(id, text, None, None, false).await?;
        self.wait_turn_after(id, users_before, timeout).await
    }

    /// Number of user messages in the session.
    pub async fn user_message_count(&self, id: &str) -> Result<usize, ClientError> {
        Ok(self.messages(id).await?.iter().filter(|m| m.role() == "user").count())
    }

    /// Waits until the session has more than `users_before` user messages, is idle, and
    /// ends with a completed assistant message; returns that message.
    pub async fn wait_turn_after(&self, id: &str, users_before: usize, timeout: Duration) -> anyhow::Result<Message> {
        wait_until(&format!("the turn of session {id} to finish"), timeout, || async {
            if self.is_busy(id).await? {
                return Ok::<_, ClientError>(None);
            }
            let msgs = self.messages(id).await?;
            let users = msgs.iter().filter(|m| m.role() == "user").count();
            Ok(msgs.last().filter(|m| users > users_before && m.role() == "assistant" && m.is_completed()).cloned())
        })
        .await
    }

    /// Waits until `/session/status` lists the session as busy (or retrying).
    pub async fn wait_busy(&self, id: &str, timeout: Duration) -> anyhow::Result<()> {
        wait_for(&format!("session {id} to be busy"), timeout, || self.is_busy(id)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wait_until_times_out_with_the_last_error() {
        let r: anyhow::Result<()> =
            wait_until("nothing", Duration::from_millis(250), || async { Err::<Option<()>, _>("boom") }).await;
        let msg = format!("{:#}", r.unwrap_err());
        assert!(msg.contains("nothing") && msg.contains("boom"), "{msg}");
    }
}
