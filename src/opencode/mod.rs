//! The adapter to OpenCode servers: REST ([`client`]), the event stream ([`pump`]) and
//! its framing ([`body`]: HTTP's, [`sse`]: the events'). Decoding of event payloads is shared with the cores
//! (`shepherd_actors::event`). [`version`] holds the OpenCode releases supported,
//! [`pinned`] the one release the tests and the demo run.

mod body;
pub mod client;
pub mod io_thread;
pub mod pinned;
pub mod pump;
pub mod sse;
pub mod stream;
pub mod version;

pub use client::{CallTimer, Credentials, OpenCodeClient};
pub use pump::{EventPump, PumpRegistry, PumpStats};
