#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine: installs what the tests need
# (the pinned OpenCode server from the npm registry; Node.js/npm and git from Debian if
# missing), then `cargo test`; then a smoke subset of the real-OpenCode tests again on
# the oldest supported OpenCode (OLDEST_SUPPORTED in src/opencode/version.rs), a few
# minutes. Arguments go to the main `cargo test`; with arguments the subset is skipped
# unless SHEPHERD_TEST_OLDEST=1 (SHEPHERD_TEST_OLDEST=0 always skips it). Idempotent;
# safe to run again.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# A clean test build takes about 3.5 GB; say what the disk had, so a full disk reads as one.
echo "test.sh: free disk at $repo: $(df -h --output=avail . | tail -1 | tr -d ' ')" >&2

need_apt=()
command -v git >/dev/null || need_apt+=(git)
command -v npm >/dev/null || need_apt+=(nodejs npm)
# Instances sharing state (the guard's Redis backend) are tested on a real Redis.
command -v redis-server >/dev/null || need_apt+=(redis-server)
# The allocator (jemalloc, built from source by tikv-jemalloc-sys) needs a C compiler and make.
command -v cc >/dev/null || need_apt+=(gcc)
command -v make >/dev/null || need_apt+=(make)
if ((${#need_apt[@]})); then
  echo "test.sh: installing ${need_apt[*]} from Debian" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >&2
fi

# The pinned OpenCode server (the tests would install it on first use too; doing it
# once up front keeps parallel tests from waiting on each other).
opencode_bin="$(bash scripts/install-opencode.sh)"
export SHEPHERD_OPENCODE_BIN="$opencode_bin"
echo "test.sh: OpenCode $("$opencode_bin" --version) at $opencode_bin" >&2

cargo test --workspace --locked "$@"

# The oldest supported OpenCode: a turn, a question, a stall recovered, a crash
# recovered, a nudge then a review, a hand-off, a subagent, and the version check.
if [[ "${SHEPHERD_TEST_OLDEST:-$(($# == 0))}" != 0 ]]; then
  oldest="$(sed -n 's/^pub const OLDEST_SUPPORTED: Version = Version::new(\([0-9]*\), \([0-9]*\), \([0-9]*\));/\1.\2.\3/p' \
    src/opencode/version.rs)"
  if [[ -z "$oldest" ]]; then
    echo "test.sh: cannot read OLDEST_SUPPORTED from src/opencode/version.rs" >&2
    exit 1
  fi
  oldest_bin="$(bash scripts/install-opencode.sh "$oldest")"
  echo "test.sh: smoke subset on the oldest supported OpenCode $("$oldest_bin" --version) at $oldest_bin" >&2
  SHEPHERD_OPENCODE_BIN="$oldest_bin" cargo test --workspace --locked \
    --test testbed_smoke --test e2e_recovery --test e2e_followup --test e2e_handoff --test e2e_subagents \
    --test e2e_versions -- --exact \
    ok_turn_goes_busy_then_idle_with_the_fake_text \
    question_turn_shows_a_pending_question \
    stalled_session_is_aborted_and_continued_with_its_todos_then_finishes \
    a_turn_cut_off_by_an_opencode_crash_is_continued_once_after_the_restart \
    idle_with_open_todos_is_nudged_once_with_the_todos_then_reviewed_once_when_done \
    a_session_past_prepare_is_handed_to_a_fresh_session_that_receives_the_continuation_and_works \
    a_parent_whose_background_subagent_was_aborted_is_prompted_once \
    a_supported_opencode_is_read_at_connect_without_a_warning
fi
