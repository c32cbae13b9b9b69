//! A message's `info` (`message.updated`, and each message of `GET /session/{id}/message`):
//! role, agent and model, finish, error, times, token usage. User and assistant messages
//! name their model differently; both become one [`ModelRef`].

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{ErrorInfo, Times};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
}

/// The agent and model a turn ran with; copied into every prompt Shepherd sends so
/// OpenCode does not switch the session to its default agent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct ModelRef {
    #[serde(rename = "providerID")]
    pub provider_id: String,
    #[serde(rename = "modelID")]
    pub model_id: String,
}

/// `message.updated` → `info`. User and assistant messages share this shape; the
/// model is `model{providerID,modelID}` on user messages and top-level fields on
/// assistant ones — both end up in [`MessageInfo::model`].
#[derive(Debug, Clone, PartialEq)]
pub struct MessageInfo {
    pub id: String,
    pub session_id: String,
    pub role: Role,
    pub agent: Option<String>,
    pub model: Option<ModelRef>,
    pub finish: Option<String>,
    pub error: Option<ErrorInfo>,
    pub time: Times,
    /// A compaction summary (`summary: true`).
    pub summary: bool,
    /// Token usage of this one model call (assistant messages).
    pub tokens: Option<Tokens>,
}

/// Token usage of one model call. The prompt size — what fills the context window — is
/// `input + cache.read + cache.write`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Tokens {
    #[serde(default)]
    pub input: u64,
    #[serde(default)]
    pub output: u64,
    #[serde(default)]
    pub cache: CacheTokens,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct CacheTokens {
    #[serde(default)]
    pub read: u64,
    #[serde(default)]
    pub write: u64,
}

impl Tokens {
    pub fn prompt_size(&self) -> u64 {
        self.input + self.cache.read + self.cache.write
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawMessageInfo<'a> {
    pub(super) id: String,
    #[serde(rename = "sessionID")]
    pub(super) session_id: String,
    pub(super) role: Role,
    #[serde(default)]
    pub(super) agent: Option<String>,
    /// The older name of `agent` on assistant messages.
    #[serde(default)]
    pub(super) mode: Option<String>,
    #[serde(default)]
    pub(super) model: Option<ModelRef>,
    #[serde(default, rename = "providerID")]
    pub(super) provider_id: Option<String>,
    #[serde(default, rename = "modelID")]
    pub(super) model_id: Option<String>,
    #[serde(default)]
    pub(super) finish: Option<String>,
    #[serde(default)]
    pub(super) error: Option<ErrorInfo>,
    #[serde(default)]
    pub(super) time: Times,
    /// `true` on a compaction summary; an object (the diff summary) on user messages.
    #[serde(default, borrow)]
    pub(super) summary: Option<&'a RawValue>,
    #[serde(default)]
    pub(super) tokens: Option<Tokens>,
}

impl From<RawMessageInfo<'_>> for MessageInfo {
    fn from(r: RawMessageInfo<'_>) -> Self {
        let model = r.model.or(match (r.provider_id, r.model_id) {
            (Some(provider_id), Some(model_id)) => Some(ModelRef { provider_id, model_id }),
            _ => None,
        });
        MessageInfo {
            id: r.id,
            session_id: r.session_id,
            role: r.role,
            agent: r.agent.or(r.mode),
            model,
            finish: r.finish,
            error: r.error,
            time: r.time,
            summary: r.summary.is_some_and(|v| v.get().trim() == "true"),
            tokens: r.tokens,
        }
    }
}
