#!/usr/bin/env bash
# Installs an OpenCode server binary into a cache directory and prints the binary's path
# on stdout. Without a version, the pinned one (the one Shepherd's test bed and demo run).
#
#   scripts/install-opencode.sh            # -> $REPO/.opencode-cache/<version>/node_modules/.../opencode
#   scripts/install-opencode.sh 1.15.13    # another release, into $REPO/.opencode-cache/1.15.13/
#   SHEPHERD_OPENCODE_VERSION=1.15.13 scripts/install-opencode.sh   # the same
#   SHEPHERD_OPENCODE_CACHE=/dir scripts/install-opencode.sh        # install into /dir
#
# The pinned version is read from OPENCODE_VERSION in src/opencode/pinned.rs (one place:
# the daemon's version warning and the test bed in testbed/ both compile that file); the
# oldest supported one CI also tests is OLDEST_SUPPORTED in src/opencode/version.rs. The
# npm meta package `opencode-ai` is not published for every version, so the platform
# package (`opencode-linux-x64` / `opencode-linux-arm64`) is installed directly.
# Idempotent: an installed binary that reports the pinned version is reused. Parallel runs
# are serialised with flock(1) when it exists; the install itself lands by atomic rename.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="${1:-${SHEPHERD_OPENCODE_VERSION:-}}"
if [[ -z "$version" ]]; then
  version="$(sed -n 's/^pub const OPENCODE_VERSION: &str = "\(.*\)";/\1/p' \
    "$repo/src/opencode/pinned.rs")"
fi
if [[ -z "$version" ]]; then
  echo "install-opencode: cannot read OPENCODE_VERSION from src/opencode/pinned.rs" >&2
  exit 1
fi
if [[ ! "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "install-opencode: '$version' is not a release version (MAJOR.MINOR.PATCH)" >&2
  exit 1
fi

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) pkg=opencode-linux-x64 ;;
  Linux-aarch64 | Linux-arm64) pkg=opencode-linux-arm64 ;;
  *) echo "install-opencode: unsupported platform $(uname -s)-$(uname -m)" >&2; exit 1 ;;
esac

cache="${SHEPHERD_OPENCODE_CACHE:-$repo/.opencode-cache/$version}"
bin="$cache/node_modules/$pkg/bin/opencode"

installed() {
  [[ -x "$bin" ]] && [[ "$("$bin" --version 2>/dev/null)" == "$version" ]]
}

if installed; then
  echo "$bin"
  exit 0
fi

command -v npm >/dev/null || { echo "install-opencode: npm is required" >&2; exit 1; }
mkdir -p "$(dirname "$cache")"

install_now() {
  installed && return 0
  local tmp
  tmp="$(mktemp -d "$cache.tmp.XXXXXX")"
  trap 'rm -rf "$tmp"' RETURN
  echo "install-opencode: installing $pkg@$version into $cache" >&2
  npm install --no-save --no-audit --no-fund --loglevel=error --prefix "$tmp" "$pkg@$version" >&2
  local got
  got="$("$tmp/node_modules/$pkg/bin/opencode" --version)"
  if [[ "$got" != "$version" ]]; then
    echo "install-opencode: installed binary reports '$got', expected '$version'" >&2
    return 1
  fi
  rm -rf "$cache"
  mv -T "$tmp" "$cache"
}

if command -v flock >/dev/null; then
  exec 9>"$cache.lock"
  flock 9
fi
install_now
installed || { echo "install-opencode: install failed" >&2; exit 1; }
echo "$bin"
