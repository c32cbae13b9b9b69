//! The world's own bookkeeping: its start (every session idle), a run's plans, the
//! schedule of due beats, request counts, event ids, a session's remembered history.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::script::{plan_frames, stall_plan, work_turn, Beat};
use super::{
    epoch_ms, make_id, FaultCounts, Faults, HistMsg, Kind, RunPlanned, RunSpec, SimConfig, SimSession, SoakSpec, World,
    HEARTBEAT, HISTORY,
};

impl World {
    pub(super) fn new(cfg: &SimConfig) -> Self {
        let base_ms = epoch_ms();
        let dirs: Vec<String> = (0..cfg.directories.max(1)).map(|d| format!("/sim/project-{d:02}")).collect();
        let mut sessions = Vec::with_capacity(cfg.sessions);
        let mut index = HashMap::with_capacity(cfg.sessions);
        for i in 0..cfg.sessions {
            let id = make_id("ses_", base_ms, i as u64);
            let dir = i % dirs.len();
            index.insert(id.clone(), i);
            sessions.push(SimSession {
                id,
                dir,
                created_ms: base_ms - 60_000,
                busy: false,
                todo_done: 0,
                plan: VecDeque::new(),
                interval: Duration::ZERO,
                epoch: 0,
                kind: Kind::Idle,
                user_msg: String::new(),
                asst_msg: String::new(),
                part: String::new(),
                part_chars: 0,
                counter: 0,
                seq: 0,
                agent: "build".into(),
                stalled_at: None,
                stalled_wall_us: 0,
                aborted: false,
                prompts: 0,
                prompts_at_stall: 0,
                history: VecDeque::new(),
                episode: None,
                last_episode: None,
                soak_next: None,
                last_was_stall: false,
            });
        }
        World {
            sessions,
            index,
            busy_by_dir: vec![std::collections::BTreeSet::new(); dirs.len()],
            dirs,
            project: "34a087cc2cab9675f8102d62afcd43ca8afdd98e".into(),
            heap: BinaryHeap::new(),
            subscribers: Vec::new(),
            evt: 0,
            base_ms,
            stall_timeout: Duration::from_secs(2),
            frames_sent: 0,
            frames_dropped: 0,
            unexpected_aborts: 0,
            latencies: Vec::new(),
            stall_times: Vec::new(),
            messages: 0,
            requests: HashMap::new(),
            next_heartbeat: Instant::now() + HEARTBEAT,
            faults: Faults::default(),
            counts: FaultCounts::default(),
            down_until: None,
            soak: SoakSpec::default(),
            soak_turns: 0,
            shepherd_down: false,
            episodes: Vec::new(),
            decisions: HashMap::new(),
            false_aborts: Vec::new(),
            idle_aborts: 0,
            aborts: 0,
            prompts_by_kind: HashMap::new(),
            untagged_prompts: 0,
            rng: 0x2545_F491_4F6C_DD1D ^ base_ms as u64,
        }
    }

    /// A uniform number in 0..n (xorshift; no dependency for a bench).
    pub(super) fn random(&mut self, n: u64) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % n.max(1)
    }

    pub(super) fn count(&mut self, what: &str) {
        *self.requests.entry(what.to_string()).or_default() += 1;
    }

    /// Brings the directory's busy set in line with the session (after anything that may
    /// have changed whether it is busy).
    pub(super) fn sync_busy(&mut self, idx: usize) {
        let s = &self.sessions[idx];
        let set = &mut self.busy_by_dir[s.dir];
        if s.busy {
            set.insert(idx);
        } else {
            set.remove(&idx);
        }
    }

    pub(super) fn schedule(&mut self, idx: usize, at: Instant) {
        let epoch = self.sessions[idx].epoch;
        self.heap.push(Reverse((at, idx, epoch)));
    }

    /// Replaces a session's plan (stale heap entries are skipped by epoch).
    pub(super) fn replan(&mut self, idx: usize, plan: Vec<Beat>, interval: Duration, kind: Kind, start: Instant) {
        let s = &mut self.sessions[idx];
        s.plan = plan.into();
        s.interval = interval;
        s.kind = kind;
        s.epoch = s.epoch.wrapping_add(1);
        self.schedule(idx, start);
    }

    pub(super) fn run(&mut self, spec: &RunSpec) -> RunPlanned {
        let now = Instant::now();
        self.stall_timeout = Duration::from_millis(spec.stall_timeout_ms);
        let interval = Duration::from_micros(spec.step_interval_us);
        let n = match spec.sessions {
            0 => self.sessions.len(),
            k => k.min(self.sessions.len()),
        };
        let mut planned = RunPlanned::default();
        for idx in 0..n {
            let stalls = spec.stall_every > 0 && idx % spec.stall_every as usize == 0;
            if stalls {
                let plan = stall_plan(spec.stall_deltas);
                planned.frames += plan_frames(&plan);
                planned.stalling += 1;
                let k = idx / spec.stall_every as usize;
                let per = n.div_ceil(spec.stall_every as usize).max(1);
                let offset = Duration::from_micros(spec.stall_spread_ms * 1000 * k as u64 / per as u64);
                self.sessions[idx].stalled_at = None;
                self.sessions[idx].aborted = false;
                self.sessions[idx].prompts_at_stall = self.sessions[idx].prompts;
                self.replan(idx, plan, interval.max(Duration::from_millis(5)), Kind::Stalling, now + offset);
            } else if spec.turns > 0 {
                let mut plan = Vec::new();
                for _ in 0..spec.turns {
                    plan.extend(work_turn(spec.deltas, spec.tool));
                }
                planned.frames += plan_frames(&plan);
                let offset = Duration::from_micros(spec.start_spread_ms * 1000 * idx as u64 / n.max(1) as u64);
                self.replan(idx, plan, interval, Kind::Working, now + offset);
            }
        }
        // A session left out of this run is done with any stall of an earlier one: it is
        // not counted among this run's stalls.
        for s in &mut self.sessions[n..] {
            if s.kind == Kind::Stalling {
                s.kind = Kind::Idle;
            }
        }
        planned
    }

    pub(super) fn next_evt(&mut self) -> String {
        self.evt += 1;
        make_id("evt_", self.base_ms, self.evt)
    }

    pub(super) fn push_history(&mut self, idx: usize, msg: HistMsg) {
        let h = &mut self.sessions[idx].history;
        if h.len() == HISTORY {
            h.pop_front();
        }
        h.push_back(msg);
    }
}
