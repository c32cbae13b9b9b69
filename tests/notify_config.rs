//! `[[notify]]` through the real configuration layers (what `shepherd config check` and
//! `shepherd run` read): each mistake is refused naming its key path.

use shepherd::config::{load_with_env, ConfigSources};
use shepherd_actors::config::{NotifyEvent, NotifyKind};

fn load(notify: &str) -> Result<shepherd_actors::config::Config, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shepherd.toml");
    let text = format!("[[servers]]\nname = \"local\"\nurl = \"http://127.0.0.1:4096\"\n\n{notify}\n");
    std::fs::write(&file, text).unwrap();
    load_with_env(&ConfigSources { file: Some(file), ..Default::default() }, &[]).map_err(|e| e.to_string())
}

#[test]
fn two_targets_load_with_their_defaults() {
    let cfg = load(
        "[[notify]]\nkind = \"ntfy\"\nurl = \"https://ntfy.sh/t\"\npriority = 4\ntags = [\"robot\"]\n\
         [[notify]]\nkind = \"slack\"\nurl = \"https://hooks.example/T/B/x\"\nevents = [\"gave_up\"]\nafter = \"3m\"",
    )
    .unwrap();
    assert_eq!(cfg.notify.len(), 2);
    assert_eq!((cfg.notify[0].kind, cfg.notify[0].priority), (NotifyKind::Ntfy, Some(4)));
    assert_eq!(cfg.notify[0].events, NotifyEvent::all(), "all events by default");
    assert_eq!(cfg.notify[0].after, std::time::Duration::from_secs(600), "after defaults to 10m");
    assert_eq!(cfg.notify[1].events, vec![NotifyEvent::GaveUp]);
    assert_eq!(cfg.notify[1].after, std::time::Duration::from_secs(180));
}

#[test]
fn a_bad_kind_is_refused_naming_the_key() {
    let err = load("[[notify]]\nkind = \"email\"\nurl = \"http://x\"").unwrap_err();
    assert!(err.contains("notify[0].kind: unknown variant `email`"), "{err}");
}

#[test]
fn a_bad_url_is_refused_naming_the_key() {
    let err = load("[[notify]]\nkind = \"webhook\"\nurl = \"example.com/hook\"").unwrap_err();
    assert!(err.contains("notify[0].url: must start with http:// or https://"), "{err}");
}

#[test]
fn an_unknown_event_is_refused_naming_the_key() {
    let err =
        load("[[notify]]\nkind = \"webhook\"\nurl = \"http://x\"\nevents = [\"paused\", \"exploded\"]").unwrap_err();
    assert!(err.contains("notify[0].events[1]: unknown variant `exploded`"), "{err}");
}

#[test]
fn an_unknown_key_is_refused_naming_it() {
    let err = load("[[notify]]\nkind = \"webhook\"\nurl = \"http://x\"\nprio = 3").unwrap_err();
    assert!(err.contains("notify[0]") && err.contains("prio"), "{err}");
}
