//! The adapter to OpenCode servers: REST ([`client`]), the event stream ([`pump`]) and
//! its framing ([`sse`]). Decoding of event payloads is shared with the cores
//! (`shepherd_actors::event`). [`version`] holds the OpenCode releases supported.

pub mod client;
pub mod pump;
pub mod sse;
pub mod stream;
pub mod version;

pub use client::{Credentials, OpenCodeClient};
pub use pump::{EventPump, PumpRegistry, PumpStats};
