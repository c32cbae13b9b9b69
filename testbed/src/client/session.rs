//! The session routes (`/session`, `/session/{id}/…`): create, read, delete, prompt,
//! abort, compact, status, messages, todos; and [`PromptOptions`], a prompt's body.

use std::collections::BTreeMap;

use reqwest::Method;
use serde_json::{json, Value};

use super::{ClientError, Message, OpenCodeClient, SessionStatus, Todo};

/// Options of a prompt beyond its text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptOptions {
    /// `agent` (e.g. `build`, `plan`).
    pub agent: Option<String>,
    /// `model`: `(providerID, modelID)`.
    pub model: Option<(String, String)>,
    /// Mark the text part `synthetic: true`.
    pub synthetic: bool,
    /// `metadata` of the text part.
    pub metadata: Option<Value>,
    /// `noReply: true`.
    pub no_reply: bool,
    /// `system`.
    pub system: Option<String>,
}

impl PromptOptions {
    /// The JSON body of `prompt_async` / `message` for `text`.
    pub fn body(&self, text: &str) -> Value {
        let mut part = json!({"type": "text", "text": text});
        if self.synthetic {
            part["synthetic"] = json!(true);
        }
        if let Some(m) = &self.metadata {
            part["metadata"] = m.clone();
        }
        let mut body = json!({ "parts": [part] });
        if let Some(a) = &self.agent {
            body["agent"] = json!(a);
        }
        if let Some((provider, model)) = &self.model {
            body["model"] = json!({"providerID": provider, "modelID": model});
        }
        if self.no_reply {
            body["noReply"] = json!(true);
        }
        if let Some(s) = &self.system {
            body["system"] = json!(s);
        }
        body
    }
}

impl OpenCodeClient {
    /// `POST /session` with an optional title; returns the session id. Without a title,
    /// OpenCode makes an extra title-generation model call on the first prompt.
    pub async fn create_session(&self, title: Option<&str>) -> Result<String, ClientError> {
        let body = match title {
            Some(t) => json!({ "title": t }),
            None => json!({}),
        };
        let session = self.create_session_with(&body).await?;
        Ok(session.get("id").and_then(Value::as_str).unwrap_or_default().to_string())
    }

    /// `POST /session` with any body (`title`, `parentID`, `permission`, …); returns the
    /// session JSON.
    pub async fn create_session_with(&self, body: &Value) -> Result<Value, ClientError> {
        self.call(Method::POST, "/session", None, Some(body)).await
    }

    /// `GET /session/{id}`.
    pub async fn session(&self, id: &str) -> Result<Value, ClientError> {
        self.call(Method::GET, &format!("/session/{id}"), None, None).await
    }

    /// `GET /session/{id}/children`.
    pub async fn children(&self, id: &str) -> Result<Vec<Value>, ClientError> {
        self.call(Method::GET, &format!("/session/{id}/children"), None, None).await
    }

    /// `DELETE /session/{id}`.
    pub async fn delete_session(&self, id: &str) -> Result<bool, ClientError> {
        self.call(Method::DELETE, &format!("/session/{id}"), None, None).await
    }

    /// `POST /session/{id}/prompt_async` with one text part. Returns once OpenCode has
    /// accepted it (204); the turn runs in the background.
    pub async fn prompt_async(
        &self,
        id: &str,
        text: &str,
        agent: Option<&str>,
        model: Option<(&str, &str)>,
        synthetic: bool,
    ) -> Result<(), ClientError> {
        let opts = PromptOptions {
            agent: agent.map(str::to_string),
            model: model.map(|(p, m)| (p.to_string(), m.to_string())),
            synthetic,
            ..PromptOptions::default()
        };
        self.prompt_async_body(id, &opts.body(text)).await
    }

    /// `POST /session/{id}/prompt_async` with a full body (see [`PromptOptions::body`]).
    pub async fn prompt_async_body(&self, id: &str, body: &Value) -> Result<(), ClientError> {
        self.send(Method::POST, &format!("/session/{id}/prompt_async"), None, Some(body)).await.map(drop)
    }

    /// `POST /session/{id}/abort`.
    pub async fn abort(&self, id: &str) -> Result<bool, ClientError> {
        self.call(Method::POST, &format!("/session/{id}/abort"), None, None).await
    }

    /// `POST /session/{id}/summarize` (blocks until the compaction is done).
    pub async fn summarize(&self, id: &str, provider: &str, model: &str) -> Result<bool, ClientError> {
        let body = json!({"providerID": provider, "modelID": model});
        self.call(Method::POST, &format!("/session/{id}/summarize"), None, Some(&body)).await
    }

    /// `GET /session/status`: the non-idle sessions of `directory` (default: the client's
    /// directory, else the server's).
    pub async fn status(&self, directory: Option<&str>) -> Result<BTreeMap<String, SessionStatus>, ClientError> {
        self.call(Method::GET, "/session/status", directory, None).await
    }

    /// The status of one session (`Idle` when absent from `/session/status`).
    pub async fn session_status(&self, id: &str) -> Result<SessionStatus, ClientError> {
        Ok(self.status(None).await?.remove(id).unwrap_or(SessionStatus::Idle))
    }

    /// Whether `/session/status` lists the session as busy (or retrying).
    pub async fn is_busy(&self, id: &str) -> Result<bool, ClientError> {
        Ok(!matches!(self.session_status(id).await?, SessionStatus::Idle))
    }

    /// `GET /session/{id}/message`: every message, oldest first.
    pub async fn messages(&self, id: &str) -> Result<Vec<Message>, ClientError> {
        self.call(Method::GET, &format!("/session/{id}/message"), None, None).await
    }

    /// The last assistant message, if any.
    pub async fn last_assistant(&self, id: &str) -> Result<Option<Message>, ClientError> {
        Ok(self.messages(id).await?.into_iter().rev().find(|m| m.role() == "assistant"))
    }

    /// `GET /session/{id}/todo`.
    pub async fn todos(&self, id: &str) -> Result<Vec<Todo>, ClientError> {
        self.call(Method::GET, &format!("/session/{id}/todo"), None, None).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_body_carries_the_options() {
        let opts = PromptOptions {
            agent: Some("plan".into()),
            model: Some(("fake".into(), "fake-model-2".into())),
            synthetic: true,
            metadata: Some(json!({"shepherd": {"kind": "continue"}})),
            ..PromptOptions::default()
        };
        let body = opts.body("go [[fake:ok]]");
        assert_eq!(body.pointer("/parts/0/synthetic"), Some(&json!(true)));
        assert_eq!(body.pointer("/parts/0/metadata/shepherd/kind"), Some(&json!("continue")));
        assert_eq!(body.pointer("/model/modelID"), Some(&json!("fake-model-2")));
        assert_eq!(body.pointer("/agent"), Some(&json!("plan")));
        assert_eq!(body.get("noReply"), None);
    }
}
