#!/usr/bin/env bash
# Compares builds of the fleet bench, one size, in alternating runs: one summary line per
# run, so two builds meet the same hour of a noisy machine.
#
#   cargo bench --bench fleet --no-run      # then copy target/release/deps/fleet-<hash>
#   scripts/fleet-compare.sh 10000 3 /tmp/fleet-before /tmp/fleet-after
#
# Each line: events/s and the simulator's own rate in the run, the abort latency (p50 /
# p99 / max ms; past 10,000 sessions also the phase at the 10k load), the p99 of the
# stalls no stop of the host touched (with how many one did), the stall path
# split in two (deadline → stall_detected, → abort request), the burst's CPU time per
# event, Shepherd's and the simulator's (on a machine the two fill, events/s is the
# cores over their sum), live RSS per session after all phases, and the share of the
# CPUs the host took (steal) in the burst and while the stalls were aborted, Shepherd's own
# measure of how late it looked at the stalls and of its wait for status reads — a run with
# a few percent stolen has a longer tail whatever the
# build. The environment passes through (FLEET_IDLE_SECS defaults to 1 here).
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 SESSIONS ROUNDS FLEET_BINARY..." >&2
  exit 2
fi
sessions=$1 rounds=$2
shift 2
for _ in $(seq 1 "$rounds"); do
  for bin in "$@"; do
    log=$(mktemp)
    if ! FLEET_IDLE_SECS=${FLEET_IDLE_SECS:-1} "$bin" --fleet-scale "$sessions" 2>"$log" \
      | sed -n 's/^FLEET_RESULT //p' \
      | python3 -c '
import json, sys
name = sys.argv[1]
r = json.load(sys.stdin)
n = r["sessions"]
ev = r["burst_frames"] / max(r["burst_done_secs"], 1e-9)
line = [
    name,
    "ev/s %.0f (%.0f%% of %.0f)" % (ev, 100 * ev / r["sim_capacity_fps"], r["sim_capacity_fps"]),
    "abort p50/p99/max %.1f/%.1f/%.1f" % (r["abort_p50_ms"], r["abort_p99_ms"], r["abort_max_ms"]),
    # The p99 of the stalls no stop of the host touched, and how many a stop did.
    "no-stop p99 %.1f (%d left out, stops from %s ms)" % (r.get("abort_p99_clear_ms", float("nan")), r.get("stalls_across_freeze", 0), r.get("stall_freeze_gap_ms") or 25),
    "detect p99 %.1f, to abort p99 %.1f" % (r["detect_p99_ms"], r["detect_to_abort_p99_ms"]),
    # A share of a core (%) over events per second, in µs per event.
    "burst CPU µs/event: Shepherd %.2f, simulator %.2f" % (r["burst_cpu_pct"] * 1e4 / ev, r["burst_sim_cpu_pct"] * 1e4 / ev),
    "live RSS %.2f KiB" % ((r["rss_end_live_kib"] - r["rss_connected_live_kib"]) / n),
    "stolen %.0f%%/%.0f%%" % (r.get("burst_steal_pct", float("nan")), r.get("stall_steal_pct", float("nan"))),
]
# Shepherd-side halves, from its /metrics (the timings line): how late stalls were
# looked at, and a recovery waiting whole for its (shared) status read.
import re
for label, name in (("detection", "stall detected after its deadline"), ("status wait", "GET /session/status (a reader\x27s wait, shared reads)")):
    m = re.search(re.escape(name) + r" \d+ × ([\d.]+) ms \([\d.]+ % over 5 ms, ([\d.]+) % over 10 ms\)", r.get("timings_stall", ""))
    if m:
        line.append("%s mean %s ms, %s %% over 10 ms" % (label, m.group(1), m.group(2)))
s = r.get("stall_same_load")
if s:
    line.append("10k load p99 %.1f (stolen %.0f%%)" % (s["abort_p99_ms"], s.get("stall_steal_pct", float("nan"))))
# Aborts of sessions that were not stalled, in every stall phase (any is a false abort).
line.append("unexpected aborts %d" % (r["unexpected_aborts"] + (s or {}).get("unexpected_aborts", 0)))
print(" | ".join(line))
' "$(basename "$bin")"; then
      echo "$(basename "$bin"): failed; its last lines:" >&2
      tail -5 "$log" >&2
    fi
    rm -f "$log"
  done
done
