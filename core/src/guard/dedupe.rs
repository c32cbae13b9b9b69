//! What reached each session lately, and whether a new prompt repeats it. Pure: the
//! caller passes `now`; memory is pruned to the window, so it stays small.
//!
//! A duplicate is what another instance, another tool or the person already sent for
//! the same situation, or the same decision of Shepherd's sent twice. Shepherd's own
//! new decision (a new idle edge, a new review round) is never a duplicate of its own
//! previous, different decision however alike the words are: the core decided it.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::guard::similarity::Shingles;
use crate::guard::GuardRequest;
use crate::session::core::Now;
use crate::session::effect::PromptKind;

/// One prompt this instance let through.
#[derive(Debug, Clone)]
struct Sent {
    at: Instant,
    at_ms: i64,
    kind: PromptKind,
    decision: String,
    shingles: Shingles,
}

/// The verdict of the similarity check.
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    /// Not seen lately; these are its shingles (remember them once it is admitted).
    Fresh(Shingles),
    Duplicate {
        similarity: f64,
        of: String,
    },
}

/// Dedupe memory of this instance: `(server, session)` → prompts within the window.
#[derive(Debug)]
pub struct Dedupe {
    window: Duration,
    threshold: f64,
    shingle_words: usize,
    sent: HashMap<(String, String), VecDeque<Sent>>,
}

impl Dedupe {
    pub fn new(window: Duration, threshold: f64, shingle_words: usize) -> Dedupe {
        Dedupe { window, threshold, shingle_words, sent: HashMap::new() }
    }

    /// New settings (hot reload). What was sent is kept, so a reload does not let a
    /// duplicate through, unless the shingle size changed: shingles of another size
    /// cannot be compared, and are forgotten.
    pub fn retune(&mut self, window: Duration, threshold: f64, shingle_words: usize) {
        if shingle_words != self.shingle_words {
            self.sent.clear();
        }
        (self.window, self.threshold, self.shingle_words) = (window, threshold, shingle_words);
    }

    /// Compares the prompt with what this instance sent to the session within the
    /// window, and with the session's own recent user messages (other instances, other
    /// tools, the person).
    pub fn check(&mut self, req: &GuardRequest, now: Now) -> Check {
        self.prune_session(&req.server, &req.session, now);
        let mine = Shingles::of(&req.text, self.shingle_words);
        let not_before = req.not_before_ms.unwrap_or(i64::MIN);
        let mut best: Option<(f64, String)> = None;
        let mut consider = |similarity: f64, of: String| {
            if similarity >= self.threshold && best.as_ref().is_none_or(|(s, _)| similarity > *s) {
                best = Some((similarity, of));
            }
        };
        if let Some(sent) = self.sent.get(&(req.server.clone(), req.session.clone())) {
            let own_new_decision =
                |s: &Sent| req.kind.is_automatic() && s.kind.is_automatic() && s.decision != req.decision;
            for s in sent.iter().filter(|s| s.at_ms >= not_before && !own_new_decision(s)) {
                let ago = now.mono.duration_since(s.at).as_secs();
                consider(mine.similarity(&s.shingles), format!("Shepherd's {} {ago}s ago", s.kind.as_str()));
            }
        }
        let window_ms = self.window.as_millis() as i64;
        for (created_ms, text) in req.recent.iter().flatten() {
            let age_ms = now.wall_ms - created_ms;
            if *created_ms < not_before || !(0..=window_ms).contains(&age_ms) {
                continue;
            }
            let theirs = Shingles::of(text, self.shingle_words);
            consider(mine.similarity(&theirs), format!("a user message {}s ago", age_ms / 1000));
        }
        match best {
            Some((similarity, of)) => Check::Duplicate { similarity, of },
            None => Check::Fresh(mine),
        }
    }

    /// The prompt was admitted: later similar ones within the window are duplicates.
    pub fn remember(&mut self, req: &GuardRequest, shingles: Shingles, now: Now) {
        let entry = self.sent.entry((req.server.clone(), req.session.clone())).or_default();
        entry.push_back(Sent {
            at: now.mono,
            at_ms: now.wall_ms,
            kind: req.kind,
            decision: req.decision.clone(),
            shingles,
        });
    }

    /// The admitted prompt was not sent after all.
    pub fn forget(&mut self, server: &str, session: &str, text: &str) {
        let gone = Shingles::of(text, self.shingle_words);
        let key = (server.to_string(), session.to_string());
        if let Some(sent) = self.sent.get_mut(&key) {
            if let Some(i) = sent.iter().rposition(|s| s.shingles == gone) {
                sent.remove(i);
            }
            if sent.is_empty() {
                self.sent.remove(&key);
            }
        }
    }

    /// Drops everything older than the window (call now and then: memory stays bounded
    /// by the prompts of the last window).
    pub fn prune(&mut self, now: Now) {
        let window = self.window;
        self.sent.retain(|_, sent| {
            sent.retain(|s| now.mono.duration_since(s.at) <= window);
            !sent.is_empty()
        });
    }

    fn prune_session(&mut self, server: &str, session: &str, now: Now) {
        let key = (server.to_string(), session.to_string());
        if let Some(sent) = self.sent.get_mut(&key) {
            let window = self.window;
            sent.retain(|s| now.mono.duration_since(s.at) <= window);
            if sent.is_empty() {
                self.sent.remove(&key);
            }
        }
    }

    /// Sessions with prompts in memory (for status).
    pub fn sessions(&self) -> usize {
        self.sent.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now(t0: Instant, secs: u64) -> Now {
        Now { mono: t0 + Duration::from_secs(secs), wall_ms: 1_000_000 + secs as i64 * 1000 }
    }

    fn req(text: &str, recent: Option<Vec<(i64, String)>>) -> GuardRequest {
        GuardRequest {
            server: "s".into(),
            session: "ses_A".into(),
            kind: PromptKind::Custom,
            text: text.into(),
            decision: "d1".into(),
            lease: None,
            recent,
            not_before_ms: None,
        }
    }

    fn admit(d: &mut Dedupe, text: &str, at: Now) -> Check {
        admit_req(d, &req(text, Some(vec![])), at)
    }

    fn admit_req(d: &mut Dedupe, r: &GuardRequest, at: Now) -> Check {
        let c = d.check(r, at);
        if let Check::Fresh(sh) = &c {
            d.remember(r, sh.clone(), at);
        }
        c
    }

    fn decided(kind: PromptKind, text: &str, decision: &str) -> GuardRequest {
        GuardRequest { kind, decision: decision.into(), ..req(text, Some(vec![])) }
    }

    #[test]
    fn shepherds_own_new_decision_is_no_duplicate_of_its_previous_one_but_the_same_decision_is() {
        let t0 = Instant::now();
        let mut d = Dedupe::new(Duration::from_secs(30), 0.6, 1);
        let review = "All todos are done. Run the tests and check your work.";
        let round_1 = decided(PromptKind::Review, review, "ses_A-review-1");
        assert!(matches!(admit_req(&mut d, &round_1, now(t0, 0)), Check::Fresh(_)));
        // New todos were done within the window: the second round is a new decision.
        let round_2 = decided(PromptKind::Review, review, "ses_A-review-2");
        assert!(matches!(admit_req(&mut d, &round_2, now(t0, 10)), Check::Fresh(_)), "a new round is sent");
        // The same decision again (a retry) is a duplicate.
        let retry = admit_req(&mut d, &round_2, now(t0, 11));
        assert!(matches!(&retry, Check::Duplicate { of, .. } if of == "Shepherd's review 1s ago"), "{retry:?}");
        // A person's prompt through Shepherd that repeats it is a duplicate too …
        let custom = admit_req(&mut d, &decided(PromptKind::Custom, review, "ses_A-custom-3"), now(t0, 12));
        assert!(matches!(custom, Check::Duplicate { .. }), "{custom:?}");
        // … and so is Shepherd's decision that repeats what the person just sent.
        let mut d = Dedupe::new(Duration::from_secs(30), 0.6, 1);
        admit_req(&mut d, &decided(PromptKind::Custom, review, "ses_A-custom-1"), now(t0, 0));
        let after = admit_req(&mut d, &decided(PromptKind::Review, review, "ses_A-review-1"), now(t0, 5));
        assert!(matches!(&after, Check::Duplicate { of, .. } if of == "Shepherd's custom 5s ago"), "{after:?}");
    }

    #[test]
    fn a_similar_prompt_within_the_window_is_a_duplicate_and_after_it_is_not() {
        let t0 = Instant::now();
        let mut d = Dedupe::new(Duration::from_secs(30), 0.6, 1);
        assert!(matches!(admit(&mut d, "Please continue working", now(t0, 0)), Check::Fresh(_)));
        let again = admit(&mut d, "Continue working on tasks", now(t0, 10));
        assert!(matches!(&again, Check::Duplicate { of, .. } if of == "Shepherd's custom 10s ago"), "{again:?}");
        assert!(matches!(admit(&mut d, "Continue working on tasks", now(t0, 31)), Check::Fresh(_)));
        assert!(matches!(admit(&mut d, "Review your work and run the tests", now(t0, 32)), Check::Fresh(_)));
    }

    #[test]
    fn a_prompt_another_client_sent_counts_and_old_ones_do_not() {
        let t0 = Instant::now();
        let mut d = Dedupe::new(Duration::from_secs(30), 0.6, 1);
        let at = now(t0, 100);
        let recent = vec![(at.wall_ms - 5_000, "continue working please".to_string())];
        let c = d.check(&req("Please continue working", Some(recent)), at);
        assert!(matches!(&c, Check::Duplicate { of, .. } if of == "a user message 5s ago"), "{c:?}");
        let old = vec![(at.wall_ms - 60_000, "continue working please".to_string())];
        assert!(matches!(d.check(&req("Please continue working", Some(old)), at), Check::Fresh(_)));
        assert!(matches!(d.check(&req("Please continue working", None), at), Check::Fresh(_)), "fail open");
    }

    #[test]
    fn prompts_before_not_before_do_not_count_and_a_forgotten_prompt_is_no_duplicate() {
        let t0 = Instant::now();
        let mut d = Dedupe::new(Duration::from_secs(30), 0.6, 1);
        admit(&mut d, "Please continue working", now(t0, 0));
        let mut r = req("Continue working on tasks", Some(vec![]));
        r.not_before_ms = Some(now(t0, 5).wall_ms); // Shepherd aborted at 5 s
        assert!(matches!(d.check(&r, now(t0, 6)), Check::Fresh(_)));
        d.forget("s", "ses_A", "Please continue working");
        assert!(matches!(d.check(&req("Continue working on tasks", Some(vec![])), now(t0, 7)), Check::Fresh(_)));
        d.prune(now(t0, 100));
        assert_eq!(d.sessions(), 0);
    }
}
