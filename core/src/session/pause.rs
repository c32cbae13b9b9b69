//! Why automation is off for a session: the one fact every behaviour of the core, and
//! the follow-ups, consult before acting. Setting and lifting it is the core's
//! (`core/hold.rs` for a person's or the fleet's pause, `core/facts.rs` for an abort
//! the person sent).

/// Why automation is off for this session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pause {
    /// The person aborted the session.
    UserAbort,
    /// Shepherd's limits were reached.
    GaveUp,
    /// A person paused Shepherd for this session (`shepherd pause SESSION`): see
    /// `core/hold.rs`. The person writing does not lift it.
    Person,
    /// The fleet is paused (`shepherd pause --all`).
    Fleet,
}

impl Pause {
    pub fn as_str(self) -> &'static str {
        match self {
            Pause::UserAbort => "user_abort",
            Pause::GaveUp => "gave_up",
            Pause::Person => "person",
            Pause::Fleet => "fleet",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Pause> {
        [Pause::UserAbort, Pause::GaveUp, Pause::Person, Pause::Fleet].into_iter().find(|p| p.as_str() == text)
    }

    /// Whether the person writing in the session lifts it (not a hold they asked for).
    pub(crate) fn lifted_by_the_person_writing(self) -> bool {
        matches!(self, Pause::UserAbort | Pause::GaveUp)
    }
}
