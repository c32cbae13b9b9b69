//! Are two prompts "the same prompt" in different words? Pure.
//!
//! Word-shingle Jaccard over normalised text: lower case, letters and digits only,
//! common filler words dropped ("please", "the", "on", …), then the set of `k`-word
//! shingles of each text; similarity is |A ∩ B| / |A ∪ B|. With single words (the
//! default) "Please continue working" and "Continue working on tasks" share
//! {continue, working} of {continue, working, tasks}: 0.67.

use std::collections::HashSet;

/// Words that carry no meaning for "is this the same request?".
const FILLER: &[&str] = &[
    "a", "an", "the", "and", "or", "to", "of", "on", "in", "for", "with", "your", "you", "please", "now", "is", "are",
    "it", "this", "that", "be", "i", "we", "my", "our", "so", "just", "then", "any", "all", "shepherd",
];

/// A text reduced to its set of shingles (hashed, so a set is a few words' worth of bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shingles(HashSet<u64>);

impl Shingles {
    pub fn of(text: &str, k: usize) -> Shingles {
        let words: Vec<String> = text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .filter(|w| !FILLER.contains(&w.as_str()))
            .collect();
        let k = k.max(1);
        let mut set = HashSet::new();
        if words.len() < k {
            if !words.is_empty() {
                set.insert(hash(&words.join(" ")));
            }
        } else {
            for window in words.windows(k) {
                set.insert(hash(&window.join(" ")));
            }
        }
        Shingles(set)
    }

    /// Jaccard similarity in 0..=1; two empty texts are not similar (nothing to compare).
    pub fn similarity(&self, other: &Shingles) -> f64 {
        if self.0.is_empty() || other.0.is_empty() {
            return 0.0;
        }
        let common = self.0.intersection(&other.0).count();
        let union = self.0.len() + other.0.len() - common;
        common as f64 / union as f64
    }

    /// A stable fingerprint of the whole set (for exact claims across instances).
    pub fn fingerprint(&self) -> u64 {
        let mut all: Vec<u64> = self.0.iter().copied().collect();
        all.sort_unstable();
        all.iter().fold(0xcbf2_9ce4_8422_2325, |h, v| (h ^ v).wrapping_mul(0x0100_0000_01b3))
    }
}

fn hash(s: &str) -> u64 {
    // FNV-1a: stable across runs and machines (instances compare fingerprints).
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim(a: &str, b: &str) -> f64 {
        Shingles::of(a, 1).similarity(&Shingles::of(b, 1))
    }

    #[test]
    fn the_same_request_in_other_words_is_similar() {
        assert!(sim("Please continue working", "Continue working on tasks") >= 0.6);
        assert!(sim("Continue with the open todos.", "please CONTINUE with your open TODOs!") > 0.99);
    }

    #[test]
    fn different_requests_are_not_similar() {
        assert!(sim("Please continue working", "Review your work and run the tests") < 0.2);
        assert!(sim("Fix the login bug", "Write the release notes") < 0.2);
        assert_eq!(sim("", "anything"), 0.0);
    }

    #[test]
    fn fingerprints_are_stable_and_ignore_word_order_of_the_set() {
        let a = Shingles::of("continue working tasks", 1);
        let b = Shingles::of("tasks: continue, working!", 1);
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), Shingles::of("stop working", 1).fingerprint());
    }

    #[test]
    fn two_word_shingles_are_stricter() {
        let one = sim("continue the work on the parser", "the parser work continues");
        let two = Shingles::of("continue the work on the parser", 2)
            .similarity(&Shingles::of("the parser work continues", 2));
        assert!(two < one);
    }
}
