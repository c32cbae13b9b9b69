//! `/question` and `/permission`: what an agent waits on a person for, and the person's
//! answer.

use reqwest::Method;
use serde_json::{json, Value};

use super::{ClientError, OpenCodeClient};

impl OpenCodeClient {
    /// `GET /question`: pending questions of `directory`.
    pub async fn questions(&self, directory: Option<&str>) -> Result<Vec<Value>, ClientError> {
        self.call(Method::GET, "/question", directory, None).await
    }

    /// `POST /question/{id}/reply` with `answers` (one list of labels per question).
    pub async fn reply_question(&self, id: &str, answers: &[Vec<String>]) -> Result<(), ClientError> {
        let body = json!({ "answers": answers });
        self.send(Method::POST, &format!("/question/{id}/reply"), None, Some(&body)).await.map(drop)
    }

    /// `GET /permission`: pending permission requests of `directory`.
    pub async fn permissions(&self, directory: Option<&str>) -> Result<Vec<Value>, ClientError> {
        self.call(Method::GET, "/permission", directory, None).await
    }

    /// `POST /permission/{id}/reply` (`once | always | reject`, optional message).
    pub async fn reply_permission(&self, id: &str, reply: &str, message: Option<&str>) -> Result<(), ClientError> {
        let mut body = json!({ "reply": reply });
        if let Some(m) = message {
            body["message"] = json!(m);
        }
        self.send(Method::POST, &format!("/permission/{id}/reply"), None, Some(&body)).await.map(drop)
    }
}
