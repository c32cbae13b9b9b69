//! The soak's side of the world: episodes (a stall, or a turn a restart cut off) and
//! the books kept on them, the workload clock that starts turns, and the faults injected
//! into REST answers and streams (errors, late answers, cut streams, a restart).

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::HttpResponse;
use serde_json::json;

use super::script::{stall_plan, work_turn};
use super::{epoch_ms, Data, Episode, EpisodeKind, EpisodeReport, Kind, Shared, SoakReport, World};

impl World {
    /// A soak was started: episodes are booked (until the end, after its workload stops).
    pub(super) fn books_kept(&self) -> bool {
        self.soak.gap_ms > 0
    }

    pub(super) fn is_down(&self) -> bool {
        self.down_until.is_some_and(|t| Instant::now() < t)
    }

    /// A stalling session's last frame has left: its silence (and the episode) begins.
    pub(super) fn stall_began(&mut self, idx: usize, now: Instant, wall_us: i64) {
        self.sessions[idx].stalled_at = Some(now);
        self.sessions[idx].stalled_wall_us = wall_us;
        if self.books_kept() {
            self.open_episode(idx, EpisodeKind::Stall, now);
        }
    }

    pub(super) fn open_episode(&mut self, idx: usize, kind: EpisodeKind, now: Instant) {
        if self.sessions[idx].episode.is_some() {
            return;
        }
        let e = self.episodes.len();
        self.episodes.push(Episode {
            session: idx,
            kind,
            began: now,
            began_wall_ms: epoch_ms(),
            aborts: 0,
            continues: Vec::new(),
            shepherd_down: self.shepherd_down,
        });
        self.sessions[idx].episode = Some(e);
        self.sessions[idx].last_episode = Some(e);
    }

    /// Every stream ends (the generator drops them with their senders).
    pub(super) fn cut_streams(&mut self) {
        self.counts.streams_cut += self.subscribers.len() as u64;
        self.subscribers.clear();
    }

    /// A server restart: streams cut, down for `down`, every busy turn cut off.
    pub(super) fn restart(&mut self, down: Duration) {
        let now = Instant::now();
        self.counts.restarts += 1;
        self.cut_streams();
        self.down_until = Some(now + down);
        for idx in 0..self.sessions.len() {
            let s = &mut self.sessions[idx];
            if !s.busy && s.plan.is_empty() {
                continue;
            }
            let was_busy = s.busy;
            s.busy = false;
            s.plan.clear();
            s.epoch = s.epoch.wrapping_add(1);
            s.part.clear();
            if s.kind == Kind::Working {
                s.kind = Kind::Idle;
            }
            self.sync_busy(idx);
            if was_busy {
                self.counts.turns_cut += 1;
                let last = self.sessions[idx].history.back();
                let kind = match last {
                    Some(m) if !m.user && m.completed_ms.is_none() => Some(EpisodeKind::Interrupted),
                    Some(m) if m.user || m.finish == Some("tool-calls") => Some(EpisodeKind::CutBetweenSteps),
                    // The reply had finished (`stop`), only the idle status was to come.
                    _ => None,
                };
                if let (Some(kind), true) = (kind, self.books_kept()) {
                    self.open_episode(idx, kind, now);
                } else if kind.is_none() {
                    self.counts.cut_after_finish += 1;
                }
            }
        }
    }

    /// The workload: free sessions start their next turn when due.
    pub(super) fn soak_tick(&mut self, now: Instant) -> bool {
        if !self.soak.running || self.is_down() {
            return false;
        }
        let mut started = false;
        for idx in 0..self.sessions.len() {
            let s = &self.sessions[idx];
            if s.busy || !s.plan.is_empty() || s.episode.is_some() {
                continue;
            }
            let Some(at) = s.soak_next else {
                let gap = Duration::from_millis(self.random(2 * self.soak.gap_ms.max(1)));
                self.sessions[idx].soak_next = Some(now + gap);
                continue;
            };
            if at > now {
                continue;
            }
            let stall = !self.sessions[idx].last_was_stall && self.random(1000) < self.soak.stall_permille as u64;
            let step = Duration::from_millis(self.soak.step_ms);
            self.soak_turns += 1;
            let s = &mut self.sessions[idx];
            s.soak_next = None;
            s.last_was_stall = stall;
            if stall {
                s.stalled_at = None;
                s.aborted = false;
                self.replan(idx, stall_plan(self.soak.deltas.min(3)), step, Kind::Stalling, now);
            } else {
                self.replan(idx, work_turn(self.soak.deltas, true), step, Kind::Working, now);
            }
            started = true;
        }
        started
    }

    pub(super) fn episode_report(&self, e: &Episode) -> EpisodeReport {
        let s = &self.sessions[e.session];
        EpisodeReport {
            session: s.id.clone(),
            kind: format!("{:?}", e.kind),
            began_wall_ms: e.began_wall_ms,
            aborts: e.aborts,
            continues: e.continues.clone(),
            busy_now: s.busy,
            messages: s
                .history
                .iter()
                .map(|m| {
                    format!(
                        "{} {} {}{}{}",
                        if m.user { "user" } else { "assistant" },
                        m.created_ms,
                        m.finish.unwrap_or(if m.completed_ms.is_some() { "completed" } else { "open" }),
                        if m.aborted { " aborted" } else { "" },
                        m.parts
                            .iter()
                            .filter_map(|p| p.pointer("/metadata/shepherd/decision").and_then(|d| d.as_str()))
                            .map(|d| format!(" tag={d}"))
                            .collect::<String>()
                    )
                })
                .collect(),
            shepherd_down: e.shepherd_down,
        }
    }

    pub(super) fn soak_report(&self, grace: Duration) -> SoakReport {
        let now = Instant::now();
        let mut r = SoakReport {
            turns: self.soak_turns,
            false_aborts: self.false_aborts.len() as u64,
            false_abort_detail: self.false_aborts.iter().take(20).cloned().collect(),
            idle_aborts: self.idle_aborts,
            aborts: self.aborts,
            prompts_by_kind: self.prompts_by_kind.clone(),
            untagged_prompts: self.untagged_prompts,
            faults: self.counts.clone(),
            frames_sent: self.frames_sent,
            frames_dropped: self.frames_dropped,
            ..SoakReport::default()
        };
        for e in &self.episodes {
            match e.kind {
                EpisodeKind::Stall => r.stall_episodes += 1,
                EpisodeKind::Interrupted => r.interrupted_episodes += 1,
                EpisodeKind::CutBetweenSteps => {
                    r.between_steps_episodes += 1;
                    r.between_steps_continued += !e.continues.is_empty() as u64;
                }
            }
            r.continues += e.continues.len() as u64;
            if !e.continues.is_empty() {
                r.continued += 1;
            }
            if e.continues.len() > 1 {
                r.duplicated += 1;
                if r.duplicated_detail.len() < 20 {
                    r.duplicated_detail.push(self.episode_report(e));
                }
            }
            if e.continues.is_empty() && e.kind != EpisodeKind::CutBetweenSteps {
                if now.duration_since(e.began) < grace {
                    r.in_grace += 1;
                } else if e.kind == EpisodeKind::Stall {
                    r.lost += 1;
                    if r.lost_detail.len() < 20 {
                        r.lost_detail.push(self.episode_report(e));
                    }
                } else {
                    r.lost_interrupted += 1;
                    if r.lost_detail.len() < 20 {
                        r.lost_detail.push(self.episode_report(e));
                    }
                }
            }
        }
        for (d, n) in &self.decisions {
            if *n > 1 {
                r.duplicate_decisions += 1;
                if r.duplicate_decision_ids.len() < 20 {
                    r.duplicate_decision_ids.push(format!("{d} ×{n}"));
                }
            }
        }
        r
    }
}

/// The soak's workload clock: free sessions start turns when due.
pub(super) fn drive(shared: Arc<Shared>) {
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let started = shared.lock().soak_tick(Instant::now());
        if started {
            shared.wake.notify_one();
        }
    }
}

/// Decides a REST request's fault (the server down, a 5xx, a late answer), answers the
/// refusals itself and delays the late answers after the work is done.
pub(super) async fn inject_faults(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<actix_web::dev::ServiceResponse<actix_web::body::BoxBody>, actix_web::Error> {
    let path = req.path();
    if path.starts_with("/_sim") {
        return next.call(req).await.map(|r| r.map_into_boxed_body());
    }
    let stream = path == "/global/event";
    let (refuse, delay) = match req.app_data::<Data>() {
        None => (None, Duration::ZERO),
        Some(data) => {
            let mut w = data.lock();
            if w.is_down() {
                w.counts.refused_down += 1;
                (Some(503), Duration::ZERO)
            } else {
                let f = w.faults.clone();
                let roll = w.random(1000) as u32;
                if roll < f.error_permille {
                    w.counts.errors += 1;
                    (Some([500, 502, 503][w.random(3) as usize]), Duration::ZERO)
                } else if stream {
                    (None, Duration::ZERO)
                } else if roll < f.error_permille + f.slow_permille {
                    w.counts.slow += 1;
                    (None, Duration::from_millis(f.slow_ms))
                } else if roll < f.error_permille + f.slow_permille + f.very_slow_permille {
                    w.counts.very_slow += 1;
                    (None, Duration::from_millis(f.very_slow_ms))
                } else {
                    (None, Duration::ZERO)
                }
            }
        }
    };
    if let Some(code) = refuse {
        let status =
            actix_web::http::StatusCode::from_u16(code).unwrap_or(actix_web::http::StatusCode::SERVICE_UNAVAILABLE);
        let resp =
            HttpResponse::build(status).json(json!({"name": "UnknownError", "data": {"message": "injected fault"}}));
        return Ok(req.into_response(resp).map_into_boxed_body());
    }
    let res = next.call(req).await?;
    if !delay.is_zero() {
        actix_web::rt::time::sleep(delay).await;
    }
    Ok(res.map_into_boxed_body())
}
