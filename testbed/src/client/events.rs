//! Following `GET /event` (one directory) and `GET /global/event` (every directory):
//! each server-sent event's JSON, on a client of its own with a read timeout only.

use std::time::Duration;

use futures::{Stream, StreamExt};
use reqwest::Method;
use serde_json::Value;

use super::{ClientError, OpenCodeClient};

impl OpenCodeClient {
    /// Follows `GET /event` (one directory) and yields each event's JSON
    /// (`{"id","type","properties"}`), starting with `server.connected`. The stream ends
    /// when the server closes it.
    pub async fn events(
        &self,
        directory: Option<&str>,
    ) -> Result<impl Stream<Item = Result<Value, ClientError>>, ClientError> {
        self.sse("/event", directory).await
    }

    /// Follows `GET /global/event` (every directory; frames wrap the event in `payload`).
    pub async fn global_events(&self) -> Result<impl Stream<Item = Result<Value, ClientError>>, ClientError> {
        self.sse("/global/event", None).await
    }

    async fn sse(
        &self,
        path: &str,
        directory: Option<&str>,
    ) -> Result<impl Stream<Item = Result<Value, ClientError>>, ClientError> {
        // The API client's total timeout would cut a long-lived stream: use a client with
        // a read timeout only (OpenCode sends a heartbeat every 10 s).
        let http = reqwest::Client::builder()
            .read_timeout(Duration::from_secs(60))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        let url = format!("{}{}", self.base, path);
        let mut rb = http.get(&url);
        if let Some((u, p)) = &self.auth {
            rb = rb.basic_auth(u, Some(p));
        }
        if let Some(dir) = directory.or(self.directory.as_deref()) {
            rb = rb.query(&[("directory", dir)]);
        }
        let transport = |source| ClientError::transport(Method::GET, &url, source);
        let resp = rb.send().await.map_err(transport)?;
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            return Err(ClientError::Status {
                method: Method::GET,
                url: url.clone(),
                status,
                body: resp.text().await.unwrap_or_default(),
            });
        }
        let bytes = resp.bytes_stream();
        let state = (bytes, String::new(), url);
        Ok(futures::stream::unfold(state, |(mut bytes, mut buf, url)| async move {
            loop {
                if let Some(end) = buf.find("\n\n") {
                    let frame: String = buf.drain(..end + 2).collect();
                    let data: Vec<&str> =
                        frame.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim_start).collect();
                    if data.is_empty() {
                        continue;
                    }
                    let joined = data.join("\n");
                    let item = serde_json::from_str(&joined).map_err(|source| ClientError::Decode {
                        method: Method::GET,
                        url: url.clone(),
                        source,
                        body: joined.chars().take(500).collect(),
                    });
                    return Some((item, (bytes, buf, url)));
                }
                match bytes.next().await {
                    Some(Ok(chunk)) => buf.push_str(&String::from_utf8_lossy(&chunk).replace("\r\n", "\n")),
                    Some(Err(source)) => {
                        let err = ClientError::transport(Method::GET, &url, source);
                        return Some((Err(err), (bytes, String::new(), url)));
                    }
                    None => return None,
                }
            }
        }))
    }
}
