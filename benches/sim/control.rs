//! The simulator's own endpoints (`/_sim/*`), which the benches drive it with: a run
//! and its report, the faults to inject, a stream drop, a restart, the soak's workload,
//! Shepherd's state and the soak's books.

use std::time::Duration;

use actix_web::{web, HttpResponse};
use serde::Deserialize;

use super::{Data, Faults, Kind, RunSpec, SimReport, SoakSpec, CONNECTIONS};

pub(super) async fn set_faults(data: Data, faults: web::Json<Faults>) -> HttpResponse {
    data.lock().faults = faults.into_inner();
    HttpResponse::NoContent().finish()
}

pub(super) async fn drop_streams(data: Data) -> HttpResponse {
    let mut w = data.lock();
    w.counts.stream_drops += 1;
    w.cut_streams();
    HttpResponse::NoContent().finish()
}

#[derive(Deserialize)]
pub(super) struct RestartBody {
    down_ms: u64,
}

pub(super) async fn restart(data: Data, body: web::Json<RestartBody>) -> HttpResponse {
    data.lock().restart(Duration::from_millis(body.down_ms));
    HttpResponse::NoContent().finish()
}

pub(super) async fn set_soak(data: Data, spec: web::Json<SoakSpec>) -> HttpResponse {
    data.lock().soak = spec.into_inner();
    HttpResponse::NoContent().finish()
}

#[derive(Deserialize)]
pub(super) struct ShepherdBody {
    down: bool,
}

pub(super) async fn shepherd_state(data: Data, body: web::Json<ShepherdBody>) -> HttpResponse {
    data.lock().shepherd_down = body.down;
    HttpResponse::NoContent().finish()
}

#[derive(Deserialize)]
pub(super) struct GraceQuery {
    grace_ms: Option<u64>,
}

pub(super) async fn soak_report(data: Data, q: web::Query<GraceQuery>) -> HttpResponse {
    let r = data.lock().soak_report(Duration::from_millis(q.grace_ms.unwrap_or(0)));
    HttpResponse::Ok().json(r)
}

pub(super) async fn run(data: Data, spec: web::Json<RunSpec>) -> HttpResponse {
    let planned = data.lock().run(&spec);
    data.wake.notify_one();
    HttpResponse::Ok().json(planned)
}

#[derive(Deserialize)]
pub(super) struct ReportQuery {
    /// The stalls' times from this one on; none without it. The harness polls the report
    /// every 100 ms while stalls are aborted: a copy of every time so far (11,000 at
    /// 100,000 sessions) held this thread — the one answering Shepherd's REST calls — and
    /// the world's lock for 5 ms, and the harness's parse of it held Shepherd's
    /// supervisor thread 3 ms: clusters of late aborts that were the bench's own.
    times_from: Option<usize>,
}

pub(super) async fn report(data: Data, q: web::Query<ReportQuery>) -> HttpResponse {
    let w = data.lock();
    let from = |n: usize| q.times_from.map_or(n, |from| from.min(n));
    let mut r = SimReport {
        frames_sent: w.frames_sent,
        frames_dropped: w.frames_dropped,
        unexpected_aborts: w.unexpected_aborts,
        stalls_recorded: w.stall_times.len() as u64,
        abort_latency_us: w.latencies[from(w.latencies.len())..].to_vec(),
        messages: w.messages,
        stall_times: w.stall_times[from(w.stall_times.len())..].to_vec(),
        connections: CONNECTIONS.load(std::sync::atomic::Ordering::Relaxed),
        requests: w.requests.clone(),
        ..SimReport::default()
    };
    for s in &w.sessions {
        r.busy += s.busy as u64;
        r.prompts += s.prompts as u64;
        if s.kind == Kind::Stalling {
            if s.aborted {
                r.stalls_aborted += 1;
                r.stalled_continued += (s.prompts > s.prompts_at_stall) as u64;
            } else {
                r.stalling_pending += 1;
            }
        }
    }
    HttpResponse::Ok().json(r)
}
