#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine: installs what the tests need
# (the pinned OpenCode server from the npm registry; Node.js/npm and git from Debian if
# missing), then `cargo test`. Idempotent; safe to run again.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

need_apt=()
command -v git >/dev/null || need_apt+=(git)
command -v npm >/dev/null || need_apt+=(nodejs npm)
# Instances sharing state (the guard's Redis backend) are tested on a real Redis.
command -v redis-server >/dev/null || need_apt+=(redis-server)
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
