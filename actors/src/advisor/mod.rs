//! The advisor: "the model advises, rules decide". The decisions (heuristic, reply,
//! prompt, gate) and the advice types are `shepherd_core::advisor`'s, re-exported here;
//! [`actor`] is the actix shell: cache, bounded concurrency, timeout, fallback, logging.

pub mod actor;

pub use shepherd_core::advisor::*;
