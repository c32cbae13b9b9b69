//! Compaction: when Shepherd compacts a session (past `compaction.proactive` at the idle
//! edge, after a context overflow, opportunistically or behind the hard gate before a
//! follow-up), how the context and the window are learned, and what its report changes.

use super::*;

impl SessionCore {
    /// Exact numbers from a context-length error text (configurable patterns).
    pub(super) fn learn_from_overflow(&mut self, err: &ErrorInfo) {
        let Some(text) = err.data.as_ref().and_then(|d| d.message.as_deref()) else { return };
        for re in &self.cfg.error_patterns {
            if let Some(c) = re.captures(text) {
                let num = |name: &str| c.name(name).and_then(|m| m.as_str().parse::<u64>().ok());
                if let Some(limit) = num("limit") {
                    self.window = Some(limit);
                }
                if let Some(used) = num("used") {
                    self.context_tokens = Some(used);
                }
                return;
            }
        }
    }

    /// On a busy→idle edge: compact when the last turn overflowed (emergency: OpenCode's
    /// own compaction is off or failed) or the window is past `proactive`.
    pub(super) fn consider_compaction(&mut self, now: Now) -> Vec<Effect> {
        let cfg = &self.cfg.compaction;
        if !cfg.enabled || self.pause.is_some() {
            return Vec::new();
        }
        let overflowed = self.last_reply.error.as_deref() == Some(ErrorInfo::CONTEXT_OVERFLOW);
        let share = self.context_share();
        let numbers =
            Numbers { context_tokens: self.context_tokens, context_window: self.window, ..Numbers::default() };
        let reason = if overflowed {
            if self.last_reply.error_text.as_deref().is_some_and(|t| t.contains("too large to compact")) {
                let mut out = vec![self.record(
                    Action::Compact,
                    Outcome::Declined,
                    "the session is too large to compact: handing it off to a fresh session instead",
                    numbers,
                    now,
                )];
                if self.cfg.handoff.enabled {
                    if let Some(step) = self.rollover.request(false, "too large to compact") {
                        out.extend(self.on_rollover_step(step, now));
                    }
                }
                return out;
            }
            "the last turn overflowed the context window and OpenCode did not compact: emergency compaction"
        } else if share.is_some_and(|s| s >= cfg.proactive) {
            "idle past compaction.proactive of the context window"
        } else {
            return Vec::new();
        };
        if let Some(last) = self.last_compaction {
            if now.mono.duration_since(last) < cfg.cooldown && !overflowed {
                return vec![self.record(
                    Action::Compact,
                    Outcome::Declined,
                    "within compaction.cooldown",
                    numbers,
                    now,
                )];
            }
        }
        let Some(model) = self.model.clone() else {
            return vec![self.record(
                Action::Compact,
                Outcome::Declined,
                "the session's model is not known yet",
                numbers,
                now,
            )];
        };
        self.compaction_in_flight = true;
        self.last_compaction = Some(now.mono);
        vec![Effect::Compact(CompactOrder { session_id: self.id.to_string(), model, reason: reason.to_string() })]
    }

    /// Shepherd's compaction ended (`Ok` when OpenCode answered `true`).
    pub fn on_compaction_finished(
        &mut self,
        order: &CompactOrder,
        result: Result<(), String>,
        now: Now,
    ) -> Vec<Effect> {
        self.compaction_in_flight = false;
        self.compacting = None;
        let numbers =
            Numbers { context_tokens: self.context_tokens, context_window: self.window, ..Numbers::default() };
        let out = vec![match result {
            Ok(()) => {
                self.context_tokens = None;
                self.rollover.on_compacted();
                self.record(Action::Compact, Outcome::Done, &order.reason, numbers, now)
            }
            Err(e) => self.record(Action::Compact, Outcome::Failed, &format!("{}: {e}", order.reason), numbers, now),
        }];
        let mut out = out;
        if let Some(held) = self.held_prompt.take() {
            if let Some(p) = self.pause {
                // Paused during the compaction: not sent, as if skipped at delivery.
                self.followup.on_delivered(held.kind, Delivered::NotSent);
                let reason = format!("automation is paused ({})", p.as_str());
                let numbers = Numbers { round: Some(held.facts.attempts), ..Numbers::default() };
                out.push(self.record(action_of(held.kind), Outcome::Declined, &reason, numbers, now));
            } else {
                out.push(Effect::Prompt(*held)); // the hard gate's prompt, compacted or not
            }
        } else if self.busy == RunState::Idle {
            // Follow-ups held back while compacting get their turn now.
            self.followup.on_idle_edge(now.mono, &self.todos, false, &self.cfg.nudge, &self.cfg.review);
        }
        out
    }

    /// The share of the window in use, when both numbers are known.
    pub fn context_share(&self) -> Option<f64> {
        crate::advisor::context_share(self.context_tokens, self.window)
    }

    /// The window of the session's model, as the server lists it.
    pub fn set_window(&mut self, window: Option<u64>) {
        if window.is_some() {
            self.window = window;
        }
    }

    pub fn is_compacting(&self) -> bool {
        self.compacting.is_some() || self.compaction_in_flight
    }

    /// Past `compaction.opportunistic` and outside the cooldown.
    pub(super) fn opportune_compaction(&self, now: Now) -> bool {
        let cfg = &self.cfg.compaction;
        cfg.enabled
            && self.context_share().is_some_and(|s| s >= cfg.opportunistic)
            && self.last_compaction.is_none_or(|at| now.mono.duration_since(at) >= cfg.cooldown)
    }

    /// Past `handoff.hard` (the hard gate: compact before any follow-up prompt).
    pub(super) fn past_hard(&self) -> bool {
        self.cfg.compaction.enabled && self.context_share().is_some_and(|s| s >= self.cfg.handoff.hard)
    }
}

#[cfg(test)]
mod tests {
    use crate::session::core::testkit::*;

    #[test]
    fn the_context_size_is_the_latest_model_calls_prompt_not_the_session_total() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        assistant_with_tokens(&mut b, 10, "msg_1", 50_000, 10_000);
        assistant_with_tokens(&mut b, 20, "msg_2", 90_000, 30_000);
        b.core.set_window(Some(200_000));
        assert_eq!(b.core.context(), (Some(120_000), Some(200_000)));
        assert_eq!(b.core.model_key().as_deref(), Some("fake/fake-model"));
        assert!((b.core.context_share().unwrap() - 0.6).abs() < 1e-9);
    }

    #[test]
    fn an_idle_session_past_proactive_is_compacted_once_per_cooldown() {
        let mut b = bench_with_rules(compaction_rules());
        b.busy(0);
        assistant_with_tokens(&mut b, 10, "msg_1", 150_000, 0);
        b.core.set_window(Some(200_000));
        let effects = b.idle_ms(100);
        assert_eq!(compactions(&effects), vec!["idle past compaction.proactive of the context window".to_string()]);
        assert!(b.core.is_compacting());
        let Effect::Compact(order) = effects.iter().find(|e| matches!(e, Effect::Compact(_))).unwrap().clone() else {
            panic!()
        };
        let now = b.at_ms(5_000);
        let done = b.core.on_compaction_finished(&order, Ok(()), now);
        assert_eq!(actions(&done), vec![Action::Compact]);
        assert!(!b.core.is_compacting());
        // Grown again right away: the cooldown holds it back, and says so.
        b.busy(6);
        assistant_with_tokens(&mut b, 6_100, "msg_2", 160_000, 0);
        let effects = b.idle_ms(6_200);
        assert!(compactions(&effects).is_empty());
        assert_eq!(declined(&effects), vec!["within compaction.cooldown".to_string()]);
    }

    /// A turn that ran while the stream was down took the context past
    /// `compaction.proactive`: once its reply is read after the reconnect, the session is
    /// compacted as at any turn's end.
    #[test]
    fn an_unseen_turn_past_proactive_is_compacted_once_its_reply_is_read() {
        let mut b = bench_with_rules(compaction_rules());
        b.busy(0);
        assistant_with_tokens(&mut b, 10, "msg_1", 50_000, 0);
        b.core.set_window(Some(200_000));
        assert!(compactions(&b.idle_ms(100)).is_empty());
        b.core.on_blind();
        b.core.on_sight(b.at_ms(5_000));
        let json = r#"{"id":"msg_2","sessionID":"ses_A","role":"assistant","providerID":"fake","modelID":"fake-model","finish":"stop","tokens":{"input":150000,"output":5,"cache":{"read":0,"write":0}},"time":{"created":1,"completed":2}}"#;
        let reply = Box::new(crate::event::decode_message_info(json).unwrap());
        let now = b.at_ms(5_100);
        let turn = crate::ports::LastTurn {
            message_id: "msg_2".into(),
            completed: true,
            errored: false,
            running_task: false,
            reply: Some(reply),
            running: Vec::new(),
        };
        let effects = b.core.on_todos_refreshed(Vec::new(), TodoReread::AfterUnseenTurn, Some(turn), now);
        assert_eq!(compactions(&effects), vec!["idle past compaction.proactive of the context window".to_string()]);
    }

    #[test]
    fn below_proactive_nothing_is_compacted() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        assistant_with_tokens(&mut b, 10, "msg_1", 100_000, 0);
        b.core.set_window(Some(200_000));
        assert!(compactions(&b.idle_ms(100)).is_empty());
    }

    #[test]
    fn an_overflow_left_idle_gets_one_emergency_compaction_with_exact_numbers() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.feed_ms(10, OVERFLOW);
        assert_eq!(b.core.context(), (Some(250_123), Some(200_000)), "read from the error text");
        let effects = b.idle_ms(20);
        assert!(compactions(&effects)[0].contains("emergency"));
    }

    #[test]
    fn an_overflow_while_busy_is_left_to_opencode() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.feed_ms(10, r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"ContextOverflowError","data":{"message":"x"}}}}"#);
        // OpenCode compacts by itself: a compaction part, a summary, then a normal reply.
        b.feed_ms(20, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_pc","messageID":"msg_C","sessionID":"ses_A","type":"compaction","auto":true,"overflow":true}}}"#);
        assert!(b.core.is_compacting());
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_millis(20) + CompactionConfig::default().max_wait));
        assert!(!recovers(&b.tick_ms(60_000)), "a compaction within compaction.max_wait is left alone");
        b.feed_ms(30, r#"{"type":"session.compacted","properties":{"sessionID":"ses_A"}}"#);
        assistant_with_tokens(&mut b, 40, "msg_R", 20_000, 0);
        assert!(compactions(&b.idle_ms(50)).is_empty());
    }

    #[test]
    fn opencodes_compaction_past_max_wait_is_aborted_and_continued_like_a_stall() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.feed_ms(10_000, COMPACTION_PART);
        b.feed_ms(11_000, SUMMARY_STREAMING);
        // The summary trickles on: activity, but the bound counts from the first sight.
        for s in (20..=185).step_by(15) {
            b.feed_ms(s * 1000, SUMMARY_DELTA);
        }
        let max_wait = CompactionConfig::default().max_wait;
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(10) + max_wait));
        assert!(b.tick_ms(189_999).is_empty());
        let effects = b.tick_ms(190_000);
        assert!(recovers(&effects), "{effects:?}");
        let r = record_of(&effects, Action::StallDetected);
        assert!(r.reason.contains("compaction ran past compaction.max_wait"), "{}", r.reason);
        assert_eq!(r.numbers.compacting_for_ms, Some(180_000));
        assert_eq!(r.numbers.timeout_ms, Some(180_000), "compaction.max_wait");
        assert_eq!(r.numbers.idle_for_ms, Some(5_000), "it was not silent: only too long");
    }

    #[test]
    fn the_bound_of_a_compaction_our_abort_ended_does_not_carry_over_to_the_continued_turn() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.feed_ms(10_000, COMPACTION_PART);
        assert!(recovers(&b.tick_ms(190_000)));
        // Our abort's idle edge (no summary error seen), then the continue's turn.
        b.idle_ms(190_100);
        b.core.on_recovery_finished(
            &RecoveryReport::Continued {
                idle_after_ms: Some(100),
                open_todos: 0,
                compacted: None,
                tool_call_as_text: None,
                waited_ms: 0,
            },
            b.at_ms(191_000),
        );
        b.busy(192);
        assert!(!b.core.is_compacting());
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(192 + 180)), "the usual stall clock");
    }

    #[test]
    fn a_compaction_that_ends_in_time_leaves_the_usual_stall_clock_running() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.feed_ms(10_000, COMPACTION_PART);
        b.feed_ms(11_000, SUMMARY_STREAMING);
        b.feed_ms(100_000, r#"{"type":"session.compacted","properties":{"sessionID":"ses_A"}}"#);
        assert!(!b.core.is_compacting());
        assert!(b.tick_ms(190_000).is_empty(), "the compaction's bound is gone with it");
        assert_eq!(
            b.core.deadline(),
            Some(b.t0 + Duration::from_secs(100 + 180)),
            "silence since the compaction ended"
        );
    }

    #[test]
    fn a_session_too_large_to_compact_is_not_compacted_again() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.feed_ms(10, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_S","sessionID":"ses_A","role":"assistant","summary":true,"providerID":"fake","modelID":"fake-model","finish":"error","error":{"name":"ContextOverflowError","data":{"message":"Session too large to compact - context exceeds model limit even after stripping media"}},"time":{"created":1,"completed":2}}}}"#);
        let effects = b.idle_ms(20);
        assert!(compactions(&effects).is_empty());
        assert!(declined(&effects)[0].contains("too large to compact"));
    }

    #[test]
    fn past_opportunistic_a_nudge_to_an_idle_session_is_preceded_by_a_compaction_outside_the_cooldown() {
        let mut b = bench_with_rules(compaction_rules());
        b.todos_ms(0, &["pending"]);
        b.busy(0);
        b.core.set_window(Some(200_000));
        assistant_with_tokens(&mut b, 10, "msg_1", 110_000, 0); // 55%: past opportunistic, below proactive
        assert!(compactions(&b.idle_ms(20)).is_empty(), "below proactive: nothing at the idle edge");
        let effects = b.tick_ms(5_000);
        assert_eq!(
            compactions(&effects),
            vec!["past compaction.opportunistic, idle: compacting before the nudge".to_string()]
        );
        assert!(prompts(&effects).is_empty(), "the nudge waits for the compaction");
        let Some(Effect::Compact(order)) = effects.iter().find(|e| matches!(e, Effect::Compact(_))).cloned() else {
            panic!()
        };
        let after = b.core.on_compaction_finished(&order, Ok(()), b.at_ms(6_000));
        assert_eq!(prompts(&after), vec![PromptKind::Nudge]);
        // Within the cooldown the next nudge goes straight out.
        b.busy(7);
        assistant_with_tokens(&mut b, 7_100, "msg_2", 120_000, 0);
        b.idle_ms(7_200);
        let next = b.tick_ms(13_000);
        assert!(compactions(&next).is_empty());
    }

    #[test]
    fn past_the_hard_threshold_a_nudge_waits_behind_a_compaction_and_is_sent_whatever_it_gives() {
        let mut r = compaction_rules();
        r.compaction.cooldown = Duration::from_secs(3600); // the idle-edge compaction is held back
        let mut b = bench_with_rules(r);
        b.todos_ms(0, &["pending"]);
        b.busy(0);
        assistant_with_tokens(&mut b, 10, "msg_1", 100_000, 0);
        b.core.set_window(Some(200_000));
        let first = b.idle_ms(20); // 50%: no compaction; then the cooldown starts below
        assert!(compactions(&first).is_empty());
        b.core.last_compaction = Some(b.at_ms(30).mono);
        b.busy(1);
        assistant_with_tokens(&mut b, 1_100, "msg_2", 180_000, 0); // 90% > hard (88%)
        b.idle_ms(1_200);
        let effects = b.tick_ms(1_700);
        assert_eq!(compactions(&effects), vec!["past handoff.hard: compacting before the nudge".to_string()]);
        assert!(prompts(&effects).is_empty(), "the nudge waits");
        let Effect::Compact(order) = effects.iter().find(|e| matches!(e, Effect::Compact(_))).unwrap().clone() else {
            panic!()
        };
        let after = b.core.on_compaction_finished(&order, Err("timed out".into()), b.at_ms(9_000));
        assert_eq!(prompts(&after), vec![PromptKind::Nudge], "never stranded");
    }

    #[test]
    fn a_prompt_held_behind_a_compaction_is_not_sent_if_the_person_aborted_meanwhile() {
        let mut b = bench_with_rules(compaction_rules());
        b.todos_ms(0, &["pending"]);
        b.busy(0);
        b.core.set_window(Some(200_000));
        assistant_with_tokens(&mut b, 10, "msg_1", 110_000, 0); // 55%: past opportunistic
        b.idle_ms(20);
        let effects = b.tick_ms(5_000);
        let Some(Effect::Compact(order)) = effects.iter().find(|e| matches!(e, Effect::Compact(_))).cloned() else {
            panic!("the nudge waits behind a compaction: {effects:?}")
        };
        b.feed_ms(
            5_100,
            r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"MessageAbortedError"}}}"#,
        );
        let after = b.core.on_compaction_finished(&order, Err("aborted".into()), b.at_ms(5_200));
        assert!(prompts(&after).is_empty(), "{after:?}");
        assert_eq!(declined(&after), vec!["automation is paused (user_abort)".to_string()]);
    }

    #[test]
    fn past_the_hard_threshold_a_stall_recovery_compacts_between_abort_and_continue() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        assistant_with_tokens(&mut b, 0, "msg_1", 190_000, 0);
        b.core.set_window(Some(200_000));
        b.busy(0);
        let effects = b.tick(180);
        let order = effects.iter().find_map(|e| match e {
            Effect::Recover(o) => Some(o.clone()),
            _ => None,
        });
        assert!(order.expect("recovers").compact_first.is_some());
    }
}
