#!/usr/bin/env bash
# System tools the tests drive, from Debian's packages: chromium (the HTML report is opened in a
# real headless browser) and tmux (`gpufeed watch` runs in a real terminal). Idempotent: installs
# only what is missing. .ci/run calls it. Elsewhere than CI, their tests skip without them (the
# pytest summary says so); on CI (CI set) they fail, and so does this script when it cannot
# install them.
set -euo pipefail
case "${CI:-}" in ""|0|false|no|FALSE|False) on_ci="" ;; *) on_ci=1 ;; esac
have() { command -v "$1" >/dev/null 2>&1 || { [ "$1" = chromium ] && command -v chromium-browser >/dev/null 2>&1; }; }
missing=()
have chromium || missing+=(chromium)
have tmux || missing+=(tmux)
[ ${#missing[@]} -eq 0 ] && exit 0
give_up() {
    if [ -n "$on_ci" ]; then
        echo "test-deps: cannot install ${missing[*]} ($1); on CI their tests must run" >&2
        exit 1
    fi
    echo "test-deps: please install ${missing[*]} ($1); their tests skip without them" >&2
    exit 0
}
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
command -v apt-get >/dev/null 2>&1 || give_up "no apt-get here"
[ -z "$sudo" ] || command -v sudo >/dev/null 2>&1 || give_up "not root, and no sudo"
$sudo apt-get update -qq || give_up "apt-get update failed"
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null || give_up "apt-get install failed"
for tool in "${missing[@]}"; do have "$tool" || give_up "$tool still not on PATH after apt-get install"; done
echo "test-deps: installed ${missing[*]}"
