//! Edges of "the session waits on the person": one `waits_on_person` record when it
//! begins (a question or permission opens, or the session stops on a reply that asks)
//! and one `wait_ended` when it ends, so whoever follows the journal (the notifier)
//! knows without asking the session. Pure.

use super::*;

impl SessionCore {
    /// What the session waits on the person for, if it does: the open request's id (the
    /// smallest, so the same set names the same one), else the reply that asks.
    pub(super) fn waits_on(&self) -> Option<String> {
        if let Some(id) = self.waiting_on_person.ids().min() {
            return Some(id.clone());
        }
        self.waits_on_person().then(|| self.last_reply.message_id.as_deref().unwrap_or("reply").to_string())
    }

    /// After an event: a record if waiting on the person began or ended with it.
    pub(super) fn person_edge(&self, before: Option<String>, now: Now, out: &mut Vec<Effect>) {
        let after = if self.waits_on_person() { self.waits_on() } else { None };
        let (action, reason, on) = match (&before, &after) {
            (None, Some(on)) => {
                let what = if self.waiting_on_person.is_empty() {
                    "the last reply asks the person something"
                } else {
                    "a question or permission waits for the person"
                };
                (Action::WaitsOnPerson, what, on.clone())
            }
            (Some(on), None) => (Action::WaitEnded, "no longer waits on the person", on.clone()),
            _ => return,
        };
        let numbers = Numbers { waits_on: Some(on), ..Numbers::default() };
        out.push(self.record(action, Outcome::Done, reason, numbers, now));
    }
}
