//! The event stream: one generator thread renders due beats into batches and hands
//! them to every `GET /global/event` stream (back-pressure included); a stall begins
//! when its last frames leave.

use std::cmp::Reverse;
use std::sync::Arc;
use std::time::Instant;

use actix_web::HttpResponse;
use bytes::Bytes;
use tokio::sync::mpsc;

use super::script::Beat;
use super::{epoch_us, Batch, Data, Kind, Shared, BATCH_BYTES, HEARTBEAT, STREAM_QUEUE};

/// The generator: renders due steps into batches and hands them to every stream.
pub(super) fn generate(shared: Arc<Shared>) {
    let mut buf = String::with_capacity(BATCH_BYTES + 8192);
    loop {
        buf.clear();
        let mut frames = 0u64;
        let mut marks = Vec::new();
        let subscribers;
        {
            let mut w = shared.lock();
            let now = Instant::now();
            if now >= w.next_heartbeat {
                frames += w.heartbeat(&mut buf);
                w.next_heartbeat = now + HEARTBEAT;
            }
            while buf.len() < BATCH_BYTES {
                let Some(&Reverse((due, idx, epoch))) = w.heap.peek() else { break };
                if due > now {
                    break;
                }
                w.heap.pop();
                if w.sessions[idx].epoch != epoch {
                    continue;
                }
                let Some(step) = w.sessions[idx].plan.pop_front() else {
                    w.sessions[idx].kind = Kind::Idle;
                    continue;
                };
                frames += w.render(idx, &step, &mut buf, &mut marks);
                w.sync_busy(idx);
                // A stall begins when this step's frames leave: mark it on this batch.
                if w.sessions[idx].plan.front() == Some(&Beat::Stall) {
                    w.sessions[idx].plan.pop_front();
                    marks.push(idx);
                }
                if w.sessions[idx].plan.is_empty() {
                    if w.sessions[idx].kind == Kind::Working {
                        w.sessions[idx].kind = Kind::Idle;
                    }
                } else {
                    let next = if w.sessions[idx].interval.is_zero() { now } else { due + w.sessions[idx].interval };
                    w.schedule(idx, next.max(now));
                }
            }
            if frames == 0 && marks.is_empty() {
                let wait = w
                    .heap
                    .peek()
                    .map(|Reverse((due, _, _))| *due)
                    .unwrap_or(w.next_heartbeat)
                    .min(w.next_heartbeat)
                    .saturating_duration_since(now);
                let _ = shared.wake.wait_timeout(w, wait).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            w.subscribers.retain(|s| !s.is_closed());
            subscribers = w.subscribers.clone();
            if subscribers.is_empty() {
                w.frames_dropped += frames;
            }
        }
        let batch = Batch { bytes: Bytes::copy_from_slice(buf.as_bytes()), frames, stall_marks: marks };
        for sub in &subscribers {
            let _ = sub.blocking_send(batch.clone());
        }
        if subscribers.is_empty() && !batch.stall_marks.is_empty() {
            // Nobody listens: the stall still starts now.
            let mut w = shared.lock();
            let (now, wall) = (Instant::now(), epoch_us());
            for idx in batch.stall_marks {
                w.stall_began(idx, now, wall);
            }
        }
    }
}

pub(super) async fn global_event(data: Data) -> HttpResponse {
    let (tx, rx) = mpsc::channel::<Batch>(STREAM_QUEUE);
    let connected = {
        let mut w = data.lock();
        w.count("GET /global/event");
        let evt = w.next_evt();
        w.subscribers.push(tx);
        format!("data: {{\"payload\":{{\"id\":\"{evt}\",\"type\":\"server.connected\",\"properties\":{{}}}}}}\n\n")
    };
    let shared = data.into_inner();
    let first = futures::stream::once(async move { Ok::<_, std::convert::Infallible>(Bytes::from(connected)) });
    let rest = futures::stream::unfold((rx, shared), |(mut rx, shared)| async move {
        let batch = rx.recv().await?;
        {
            let mut w = shared.lock();
            w.frames_sent += batch.frames;
            if !batch.stall_marks.is_empty() {
                let (now, wall) = (Instant::now(), epoch_us());
                for &idx in &batch.stall_marks {
                    // Several streams carry the same batch: the first one stamps it.
                    if w.sessions[idx].stalled_at.is_none() {
                        w.stall_began(idx, now, wall);
                    }
                }
            }
        }
        Some((batch.bytes, (rx, shared)))
    });
    use futures::StreamExt as _;
    // OpenCode writes every event as its own HTTP chunk; so does the simulator.
    let rest = rest.flat_map(|bytes| futures::stream::iter(one_chunk_per_frame(bytes)));
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        .streaming(first.chain(rest))
}

/// A batch's frames, each as its own chunk of the response (the bytes are shared, not
/// copied): OpenCode's server sends one chunk per event, and a reader meets every
/// chunk boundary it would meet there.
fn one_chunk_per_frame(bytes: Bytes) -> impl Iterator<Item = Result<Bytes, std::convert::Infallible>> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let rest = bytes.get(at..).filter(|rest| !rest.is_empty())?;
        let end = memchr::memmem::find(rest, b"\n\n").map_or(bytes.len(), |i| at + i + 2);
        let chunk = bytes.slice(at..end);
        at = end;
        Some(Ok(chunk))
    })
}
