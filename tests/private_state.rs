//! What Shepherd keeps on disk is private whatever the umask: the state folder 0700,
//! the ledger and SQLite's `-wal`/`-shm`, the status file and the hand-off notes 0600;
//! a link planted at a state path is not followed; a hand-off note is named from a
//! validated id or its hash, so a hostile id cannot put a file outside the state folder.
//!
//! One test per binary process on purpose: the umask is process-wide, and this test
//! sets it to 0 (the loosest a user could have) for its whole run.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;

use shepherd::store::SqliteLedger;
use shepherd_actors::ledger::{Ledger, Snapshot, SnapshotStore};
use shepherd_actors::ports::TurnSettings;

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).mode() & 0o777
}

fn snapshot(id: &str) -> Snapshot {
    Snapshot::seal(
        id.into(),
        "local".into(),
        "ses_A".into(),
        None,
        None,
        1,
        &TurnSettings::default(),
        "# Continue\nthe work".into(),
    )
}

/// Every regular file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if entry.file_type().unwrap().is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[actix::test]
async fn under_umask_000_every_state_file_is_0600_and_no_link_is_followed() {
    // SAFETY: umask(2) cannot fail; this binary runs this one test.
    unsafe { libc::umask(0) };
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = root.path().join("state/shepherd");

    // The ledger, with a write so SQLite has made its WAL and shared-memory files.
    let ledger = SqliteLedger::open(&state.join("ledger.sqlite3")).unwrap();
    ledger.save("local", "ses_A", &Default::default()).await.unwrap();
    // A hand-off note with an ordinary id, and ones with hostile ids.
    let shown = ledger.save_snapshot(&snapshot("hf_A_1")).await.unwrap().unwrap();
    assert_eq!(Path::new(&shown), state.join("handoffs/hf_A_1.md"));
    for hostile in ["../../../escaped", "a/b", "..", "%2e%2e", "x\0y", &"z".repeat(10_000)] {
        let shown = ledger.save_snapshot(&snapshot(hostile)).await.unwrap().unwrap();
        let shown = Path::new(&shown);
        assert_eq!(shown.parent(), Some(state.join("handoffs").as_path()), "{hostile:?} → {}", shown.display());
        assert!(shown.exists(), "{}", shown.display());
    }
    // The status file, and a link planted where its temp file goes.
    let outside = root.path().join("outside.txt");
    std::fs::write(&outside, "not Shepherd's").unwrap();
    let status = state.join("status.json");
    std::os::unix::fs::symlink(&outside, shepherd::private_state::temp_path(&status)).unwrap();
    shepherd::status::write_atomic(&status, b"{}").unwrap();
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "not Shepherd's", "the planted link was followed");
    assert!(std::fs::symlink_metadata(&status).unwrap().file_type().is_file());

    assert_eq!(mode(&state), 0o700, "the state folder");
    assert_eq!(mode(&state.join("handoffs")), 0o700, "the hand-off folder");
    let files = files_under(&state);
    let names: Vec<String> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    for wanted in ["ledger.sqlite3", "ledger.sqlite3-wal", "ledger.sqlite3-shm", "status.json", "hf_A_1.md"] {
        assert!(names.iter().any(|n| n == wanted), "{wanted} missing from {names:?}");
    }
    for f in &files {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
    // Nothing escaped the state folder: the root holds only it and the planted target.
    let mut top: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(top, ["outside.txt", "state"]);
    assert!(files_under(root.path()).iter().all(|f| f.starts_with(&state) || f == &outside));
}
