//! A fleet for the view's tests, built by the real status builder
//! ([`StatsBook::document`]) from what a supervisor and two pumps would report.

use shepherd_actors::control::SessionDetail;
use shepherd_actors::event::{Todo, TodoStatus};
use shepherd_actors::journal::{Action, ActionRecord, Numbers, Outcome};
use shepherd_actors::stats::{LiveSession, StatsBook, StatusDocument, StreamFacts};

/// The document's time: every age in the fixtures is relative to it.
pub const NOW_MS: i64 = 1_800_000_000_000;
const S: i64 = 1_000;
const M: i64 = 60 * S;

fn todos(done: usize, open: usize) -> Vec<Todo> {
    let todo = |status| Todo { content: "x".into(), status, priority: None };
    (0..done).map(|_| todo(TodoStatus::Completed)).chain((0..open).map(|_| todo(TodoStatus::Pending))).collect()
}

fn record(session: &str, action: Action, ago_ms: i64) -> ActionRecord {
    ActionRecord {
        server: "local".into(),
        session: session.into(),
        action,
        outcome: Outcome::Done,
        reason: format!("{} for the test", action.as_str()),
        numbers: Numbers::default(),
        at_ms: NOW_MS - ago_ms,
    }
}

fn session(id: &str, title: Option<&str>, change: impl FnOnce(&mut SessionDetail)) -> SessionDetail {
    let mut d = SessionDetail {
        title: title.map(str::to_string),
        directory: Some("/work/project".into()),
        last_activity_ms: NOW_MS - 10 * S,
        ..SessionDetail::new("local", id)
    };
    change(&mut d);
    d
}

/// Six live sessions, one in each of the states a person watches for, on two servers
/// (one of them disconnected).
pub fn fleet_doc() -> StatusDocument {
    let live = [
        session("ses_stuck", Some("Refactor the storage layer"), |d| {
            d.busy = true;
            d.stall_timeout_ms = Some(180_000);
            d.last_activity_ms = NOW_MS - 200 * S;
            d.todos = todos(2, 3);
            d.context_tokens = Some(96_000);
            d.context_window = Some(128_000);
            d.last_action = Some((&record("ses_stuck", Action::Nudge, 12 * M)).into());
        }),
        session("ses_busy", Some("Fix the parser"), |d| {
            d.busy = true;
            d.stall_timeout_ms = Some(180_000);
            d.last_activity_ms = NOW_MS - 45 * S;
            d.todos = todos(3, 1);
            d.context_tokens = Some(30_000);
            d.context_window = Some(200_000);
            d.last_action = Some((&record("ses_busy", Action::Continue, 5 * M)).into());
        }),
        session("ses_asks", Some("Which database to use?"), |d| {
            d.waiting_on_person = true;
            d.last_activity_ms = NOW_MS - 4 * M;
            d.context_tokens = Some(12_000);
            d.context_window = Some(128_000);
        }),
        session("ses_recov", Some("Port the CLI to clap"), |d| {
            d.busy = true;
            d.recovering = true;
            d.last_activity_ms = NOW_MS - 3 * M;
            d.todos = todos(1, 1);
            d.last_action = Some((&record("ses_recov", Action::StallDetected, 2 * S)).into());
        }),
        session("ses_0123456789abcdef", None, |d| {
            d.server = "remote".into();
            d.last_activity_ms = NOW_MS - 3 * 60 * M;
        }),
        session("ses_paused", Some("Write the docs"), |d| {
            d.paused = Some("user_abort".into());
            d.last_activity_ms = NOW_MS - 20 * M;
            d.last_action = Some((&record("ses_paused", Action::Pause, 20 * M)).into());
        }),
    ];
    let streams = vec![
        StreamFacts {
            name: "local".into(),
            connected: true,
            reconciled: true,
            connects: 2,
            frames: 1234,
            malformed: 0,
            last_event_ms: Some(NOW_MS - 2 * S),
            opencode_version: None,
            behind_ms: 0,
        },
        StreamFacts {
            name: "remote".into(),
            connected: false,
            reconciled: false,
            connects: 5,
            frames: 99,
            malformed: 1,
            last_event_ms: Some(NOW_MS - 5 * M),
            opencode_version: None,
            behind_ms: 0,
        },
    ];
    let mut book = StatsBook::new(10);
    // Every record passes the book (the sessions' last actions above among them).
    for r in [
        record("ses_stuck", Action::Nudge, 12 * M),
        record("ses_busy", Action::Continue, 5 * M),
        record("ses_recov", Action::StallDetected, 2 * S),
        record("ses_paused", Action::Pause, 20 * M),
    ] {
        book.apply(&r);
    }
    let live: Vec<LiveSession> = live.iter().map(LiveSession::from).collect();
    book.document(&live, NOW_MS, &streams, NOW_MS, "fixture")
}

/// The journal of `ses_stuck`, oldest first.
pub fn journal() -> Vec<ActionRecord> {
    let mut stall = record("ses_stuck", Action::StallDetected, 30 * M);
    stall.reason = "busy with no progress for the stall timeout".into();
    let mut abort = record("ses_stuck", Action::Abort, 30 * M - 2 * S);
    abort.reason = "stalled: aborted the turn".into();
    let mut cont = record("ses_stuck", Action::Continue, 30 * M - 4 * S);
    cont.reason = "continue sent after the abort".into();
    let mut nudge = record("ses_stuck", Action::Nudge, 12 * M);
    nudge.reason = "idle with 3 open todos".into();
    vec![stall, abort, cont, nudge]
}
