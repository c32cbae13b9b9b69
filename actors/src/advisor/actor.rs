//! The advisor actor (one per Shepherd): answers every consultation with advice.
//!
//! Obvious cases (the heuristic is at least `obvious_confidence` sure) and a missing
//! model are answered at once by the heuristic; an answer for the same session in the
//! same state (its [`Situation::fingerprint`]) is reused for `cache_ttl`. Otherwise the
//! session's latest messages are read and the model is asked, at most
//! `max_concurrent` calls at a time, each within `timeout`. A timeout, an HTTP error or
//! an answer without `@ACTION:CONFIDENCE` falls back to the heuristic. Every
//! consultation is one `shepherd::advisor` log event with its source; the API key lives
//! only in the model adapter and is never logged.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::advisor::{heuristic, prompt, reply, Consulted, Situation, Source};
use crate::config::AdvisorConfig;
use crate::ports::{ModelPort, Reads};
use crate::redact::Redactor;

/// Ask for advice about one session.
#[derive(Message)]
#[rtype(result = "Consulted")]
pub struct Consult {
    pub server: String,
    pub session: String,
    pub situation: Situation,
    /// The session's server, to read its latest messages for the model (reads only:
    /// the advisor advises, the session acts).
    pub reads: Arc<dyn Reads>,
    /// The session's rules' redactor: the prompt passes it before it leaves for the model.
    pub redactor: Redactor,
}

/// The heuristic's answer, for when no model may be asked.
pub fn heuristic_answer(s: &Situation, cfg: &AdvisorConfig, source: Source) -> Consulted {
    let ruled = heuristic::advise(s, cfg);
    Consulted { advice: ruled.advice, source, why: ruled.rule.to_string() }
}

type CacheKey = (String, String, u64);

/// The advisor actor sessions consult, when a model is configured; empty otherwise (the
/// heuristics answer in place). Shared by every session's environment, so a reload can
/// start, retune or stop the model advisor for live sessions too.
#[derive(Clone, Default)]
pub struct AdvisorSlot(Arc<std::sync::RwLock<Option<Addr<AdvisorActor>>>>);

impl AdvisorSlot {
    pub fn get(&self) -> Option<Addr<AdvisorActor>> {
        self.0.read().ok().and_then(|a| a.clone())
    }

    pub fn set(&self, advisor: Option<Addr<AdvisorActor>>) {
        if let Ok(mut a) = self.0.write() {
            *a = advisor;
        }
    }
}

pub struct AdvisorActor {
    cfg: AdvisorConfig,
    model: Option<Arc<dyn ModelPort>>,
    permits: Arc<Semaphore>,
    cache: HashMap<CacheKey, (Instant, Consulted)>,
}

impl AdvisorActor {
    /// `model: None` — heuristics only.
    pub fn new(cfg: AdvisorConfig, model: Option<Arc<dyn ModelPort>>) -> Self {
        let permits = Arc::new(Semaphore::new(cfg.max_concurrent));
        Self { cfg, model, permits, cache: HashMap::new() }
    }

    fn cached(&mut self, key: &CacheKey) -> Option<Consulted> {
        let now = Instant::now();
        self.cache.retain(|_, (at, _)| now.duration_since(*at) < self.cfg.cache_ttl);
        self.cache.get(key).map(|(_, c)| Consulted { source: Source::Cached, ..c.clone() })
    }
}

impl Actor for AdvisorActor {
    type Context = Context<Self>;
}

/// New advisor settings and model (hot reload). Calls under way finish under the old
/// permits; cached answers are dropped, since they were given under the old settings.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Retune {
    pub cfg: AdvisorConfig,
    pub model: Option<Arc<dyn ModelPort>>,
}

impl Handler<Retune> for AdvisorActor {
    type Result = ();

    fn handle(&mut self, msg: Retune, _: &mut Context<Self>) {
        *self = AdvisorActor::new(msg.cfg, msg.model);
    }
}

fn log(server: &str, session: &str, s: &Situation, c: &Consulted) {
    tracing::info!(
        target: "shepherd::advisor",
        server = %server,
        session = %session,
        about = s.about.as_str(),
        advice = %c.advice,
        source = %c.source,
        fallback = matches!(c.source, Source::Fallback(_)),
        "advice before the {}: {} from {} ({})", s.about.as_str(), c.advice, c.source, c.why
    );
}

impl Handler<Consult> for AdvisorActor {
    type Result = ResponseActFuture<Self, Consulted>;

    fn handle(&mut self, msg: Consult, _: &mut Context<Self>) -> Self::Result {
        let Consult { server, session, situation, reads, redactor } = msg;
        let ruled = heuristic::advise(&situation, &self.cfg);
        let key = (server.clone(), session.clone(), situation.fingerprint());
        let model = match self.model.clone() {
            _ if heuristic::obvious(&ruled, &self.cfg) => Err(heuristic_answer(&situation, &self.cfg, Source::Obvious)),
            None => Err(heuristic_answer(&situation, &self.cfg, Source::NoModel)),
            Some(model) => self.cached(&key).map_or(Ok(model), Err),
        };
        let model = match model {
            Ok(model) => model,
            Err(answer) => {
                log(&server, &session, &situation, &answer);
                return Box::pin(actix::fut::ready(answer));
            }
        };
        let cfg = self.cfg.clone();
        let permits = Arc::clone(&self.permits);
        let (srv, ses, sit) = (server.clone(), session.clone(), situation.clone());
        let work = async move {
            // Bounded concurrency: wait for a slot before the call's clock starts — at most
            // `advisor.timeout` too, or a burst of stalls would queue for N × timeout while
            // each of them holds its abort back.
            let Ok(_permit) = tokio::time::timeout(cfg.timeout, permits.acquire_owned()).await else {
                let why = format!("no free slot within {:?} (advisor.max_concurrent calls under way)", cfg.timeout);
                return heuristic_answer(&sit, &cfg, Source::Fallback(why));
            };
            let call = async {
                let messages = match reads.history(&ses, cfg.history_messages).await {
                    Ok(history) => history
                        .iter()
                        .map(|m| {
                            format!(
                                "{}: {}",
                                if m.role == crate::event::Role::User { "user" } else { "assistant" },
                                m.text()
                            )
                        })
                        .collect(),
                    Err(e) => {
                        tracing::debug!(server = %srv, session = %ses, error = %e, "advisor: history not readable");
                        Vec::new()
                    }
                };
                model.complete(&prompt::build(&sit, &messages, &cfg, &redactor)).await
            };
            match tokio::time::timeout(cfg.timeout, call).await {
                Ok(Ok(text)) => match reply::parse(&text) {
                    Ok(advice) => {
                        let why: String = text.trim().chars().take(160).collect();
                        Consulted { advice, source: Source::Model, why: format!("model: {why:?}") }
                    }
                    Err(e) => heuristic_answer(&sit, &cfg, Source::Fallback(format!("unparsable answer, {e}"))),
                },
                Ok(Err(e)) => heuristic_answer(&sit, &cfg, Source::Fallback(e.to_string())),
                Err(_) => heuristic_answer(&sit, &cfg, Source::Fallback(format!("timeout after {:?}", cfg.timeout))),
            }
        };
        Box::pin(work.into_actor(self).map(move |answer, act, _| {
            log(&server, &session, &situation, &answer);
            if answer.source == Source::Model {
                act.cache.insert(key, (Instant::now(), answer.clone()));
            }
            answer
        }))
    }
}
