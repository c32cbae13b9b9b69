//! The advisor's model adapter: an OpenAI-compatible `POST {base_url}/chat/completions`
//! (non-streaming), implementing [`ModelPort`].
//!
//! The API key is read once from the variable named by `advisor.api_key_env` and kept
//! here only: it is sent as a bearer token and never formatted (`Debug` hides it, errors
//! carry the status code, not the response body or the request).

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value};
use shepherd_actors::config::AdvisorConfig;
use shepherd_actors::ports::{ChatRequest, ModelError, ModelPort};

/// The model behind `advisor.base_url`.
pub struct ChatCompletions {
    http: reqwest::Client,
    url: String,
    key: Option<String>,
    /// `advisor.max_response_bytes`.
    max_response_bytes: usize,
}

impl std::fmt::Debug for ChatCompletions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatCompletions")
            .field("url", &self.url)
            .field("key", &self.key.as_ref().map(|_| "***"))
            .finish()
    }
}

impl ChatCompletions {
    /// `None` when no model is configured (`base_url` empty): heuristics only. Fails
    /// when `api_key_env` names a variable that is not set.
    pub fn from_config(cfg: &AdvisorConfig) -> anyhow::Result<Option<Arc<dyn ModelPort>>> {
        Self::from_config_with(cfg, |name| std::env::var(name).ok())
    }

    fn from_config_with(
        cfg: &AdvisorConfig,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Option<Arc<dyn ModelPort>>> {
        if cfg.base_url.is_empty() {
            return Ok(None);
        }
        let key = match cfg.api_key_env.trim() {
            "" => None,
            var => match lookup(var).filter(|k| !k.trim().is_empty()) {
                Some(key) => Some(key),
                None => anyhow::bail!("advisor.api_key_env names {var}, which is not set (or empty)"),
            },
        };
        // The actor bounds every call by `advisor.timeout`; this is a backstop.
        let http = reqwest::Client::builder().timeout(cfg.timeout * 2).build()?;
        let url = format!("{}/chat/completions", cfg.base_url.trim_end_matches('/'));
        Ok(Some(Arc::new(ChatCompletions { http, url, key, max_response_bytes: cfg.max_response_bytes })))
    }
}

#[async_trait]
impl ModelPort for ChatCompletions {
    async fn complete(&self, r: &ChatRequest) -> Result<String, ModelError> {
        let body = json!({
            "model": r.model,
            "stream": false,
            "max_tokens": r.max_tokens,
            "temperature": r.temperature,
            "messages": [
                {"role": "system", "content": r.system},
                {"role": "user", "content": r.user},
            ],
        });
        let mut req = self.http.post(&self.url).json(&body);
        if let Some(key) = &self.key {
            req = req.bearer_auth(key);
        }
        // `without_url`: the error text names neither the URL's credentials nor headers.
        let resp = req.send().await.map_err(|e| ModelError::Unreachable(e.without_url().to_string()))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(ModelError::Http { status: status.as_u16() });
        }
        let body = read_capped(resp, self.max_response_bytes).await?;
        let v: Value = serde_json::from_slice(&body).map_err(|e| ModelError::Decode(e.to_string()))?;
        v.pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| ModelError::Decode("no choices[0].message.content".into()))
    }
}

/// The answer's body, refused (never read whole) past `max` bytes.
async fn read_capped(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, ModelError> {
    let too_large =
        || ModelError::Decode(format!("the answer is larger than {max} bytes (advisor.max_response_bytes)"));
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| ModelError::Decode(e.without_url().to_string()))? {
        if body.len() + chunk.len() > max {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unset_key_variable_fails_start_up_and_the_key_is_never_printed() {
        let cfg = AdvisorConfig {
            enabled: true,
            base_url: "http://127.0.0.1:1/v1".into(),
            model: "m".into(),
            api_key_env: "ADVISOR_KEY".into(),
            ..AdvisorConfig::default()
        };
        let err = ChatCompletions::from_config_with(&cfg, |_| None).err().expect("unset variable");
        assert!(err.to_string().contains("ADVISOR_KEY"), "{err}");
        let port = ChatCompletions {
            http: reqwest::Client::new(),
            url: "u".into(),
            key: Some("sk-secret-1".into()),
            max_response_bytes: 4096,
        };
        assert!(!format!("{port:?}").contains("sk-secret-1"));
        assert!(ChatCompletions::from_config_with(&AdvisorConfig::default(), |_| None).unwrap().is_none());
    }

    #[tokio::test]
    async fn an_answer_past_max_response_bytes_is_refused_with_a_clear_error() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 16 * 1024];
            let _ = sock.read(&mut buf).await;
            let content = "x".repeat(8 * 1024);
            let body = format!(r#"{{"choices":[{{"message":{{"content":"{content}"}}}}]}}"#);
            let head =
                format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
            let _ = sock.write_all(format!("{head}{body}").as_bytes()).await;
        });
        let cfg =
            AdvisorConfig { base_url: url, model: "m".into(), max_response_bytes: 4096, ..AdvisorConfig::default() };
        let port = ChatCompletions::from_config_with(&cfg, |_| None).unwrap().unwrap();
        let request =
            ChatRequest { model: "m".into(), system: String::new(), user: "?".into(), max_tokens: 5, temperature: 0.0 };
        let err = port.complete(&request).await.unwrap_err();
        assert!(err.to_string().contains("larger than 4096 bytes (advisor.max_response_bytes)"), "{err}");
    }
}
