//! The one hasher for in-memory fingerprints: whether a session's durable state or
//! published detail changed, which remembered message an event is about, whether two
//! tool calls or two advisor situations are the same.
//!
//! Several of these run on every event of the fleet, so the hash is foldhash's (SipHash,
//! std's default, was a measurable part of an event's cost); the seed is fixed, so a
//! value means the same in every process. None is persisted, and none keys a hash table
//! whose keys come from outside (the tables of ids hash with a random seed instead).

use std::hash::BuildHasher;

/// Fixed: nothing hashed here is a key an outsider could choose to collide.
const SEED: u64 = 0x5e55_1011_de7a_1100;

/// A fresh hasher; what is fed to it in the same order hashes the same everywhere.
pub fn hasher() -> foldhash::fast::FoldHasher<'static> {
    foldhash::fast::FixedState::with_seed(SEED).build_hasher()
}

#[cfg(test)]
mod tests {
    use std::hash::{Hash, Hasher};

    #[test]
    fn the_same_input_hashes_the_same_and_a_different_one_differently() {
        let of = |v: &(&str, u64)| {
            let mut h = super::hasher();
            v.hash(&mut h);
            h.finish()
        };
        assert_eq!(of(&("msg_1", 7)), of(&("msg_1", 7)));
        assert_ne!(of(&("msg_1", 7)), of(&("msg_2", 7)));
        assert_ne!(of(&("msg_1", 7)), of(&("msg_1", 8)));
    }
}
