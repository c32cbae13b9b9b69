//! The status file survives its writer being killed at any point: after every write,
//! and after a kill in the middle of one, it is a complete, valid document.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use shepherd::status::write_atomic;
use shepherd_actors::journal::{Action, ActionRecord, Numbers, Outcome};
use shepherd_actors::stats::{StatsBook, StatusDocument};

/// Set in the child process: the file it writes in a loop until it is killed.
const CHILD_ENV: &str = "SHEPHERD_STATUS_WRITER_CHILD";
const TEST_NAME: &str = "the_status_file_is_valid_json_after_every_write_even_when_the_writer_is_killed";

/// A large document (about a megabyte) so a kill often lands mid-write.
fn document() -> StatusDocument {
    let mut book = StatsBook::new(20);
    for s in 0..300 {
        for i in 0..20 {
            book.apply(&ActionRecord {
                server: "local".into(),
                session: format!("ses_{s:04}"),
                action: if i % 2 == 0 { Action::StallDetected } else { Action::Continue },
                outcome: Outcome::Done,
                reason: "busy with no progress for the stall timeout, and a long reason to make the file big".into(),
                numbers: Numbers { last_part: Some(format!("tool:t{}", i % 7)), ..Numbers::default() },
                at_ms: 1000 + i,
            });
        }
    }
    book.document(&[], 0, &[], 0, "killed-writer")
}

/// Writes generation after generation (the timestamp counts them); the time goes into
/// writing, not into building or serialising.
fn write_forever(path: &Path) -> ! {
    let template = serde_json::to_string_pretty(&document()).expect("serialises");
    for generation in 1.. {
        let text = template.replacen("\"timestamp\": 0", &format!("\"timestamp\": {generation}"), 1);
        write_atomic(path, text.as_bytes()).expect("write");
    }
    unreachable!("the writer runs until it is killed")
}

/// The generation in the file now (0: no file yet).
fn generation(path: &Path) -> i64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<StatusDocument>(&t).ok())
        .map_or(0, |d| d.timestamp)
}

#[test]
fn the_status_file_is_valid_json_after_every_write_even_when_the_writer_is_killed() {
    if let Some(path) = std::env::var_os(CHILD_ENV) {
        write_forever(Path::new(&path));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("status.json");
    let mut last_generation = 0;
    for round in 0..20u64 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("child starts");
        // Once this child has written a few generations, kill it at a different point
        // of its write cycle each round.
        let started = generation(&path);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while generation(&path) < started + 3 {
            assert!(std::time::Instant::now() < deadline, "the child never wrote");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis((round * 7) % 20));
        child.kill().expect("kill");
        child.wait().expect("reaped");

        let text = std::fs::read_to_string(&path).expect("the file exists after a write");
        let doc: StatusDocument = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("round {round}: not a complete status document ({e}), {} bytes", text.len()));
        assert_eq!(doc.sessions.len(), 300);
        assert!(doc.timestamp >= 3);
        last_generation = last_generation.max(doc.timestamp);
    }
    assert!(last_generation > 1, "the child wrote more than once");
    // Each killed writer that died inside a write left its temp file behind: proof
    // that kills landed mid-write, not only between writes.
    let torn = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".tmp")))
        .count();
    eprintln!("kills that landed mid-write: {torn} of 20");
    assert!(torn >= 1, "no kill landed mid-write");
}
