#!/usr/bin/env bash
# System tools the tests drive, from Debian's packages: chromium (the HTML report is opened in a
# real headless browser) and tmux (`gpufeed watch` runs in a real terminal). Idempotent: installs
# only what is missing. .ci/run calls it; without these tools, their tests skip (except on CI).
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if ! command -v apt-get >/dev/null 2>&1 || { [ -n "$sudo" ] && ! command -v sudo >/dev/null 2>&1; }; then
    echo "test-deps: please install ${missing[*]}; their tests skip without them" >&2
    exit 0
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
echo "test-deps: installed ${missing[*]}"
