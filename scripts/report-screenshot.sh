#!/usr/bin/env bash
# Writes the HTML report of the examples to docs/example-report.html and the screenshot of its top
# that the README shows to docs/report.png, with Debian's Chromium in headless mode.
# Usage: scripts/report-screenshot.sh   (from the repository root, with the project installed)
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,4s/^# //p' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
python3 -m pytest -q -p no:cacheprovider examples --vramleak-report=docs/example-report.html >/dev/null || true
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$profile" --hide-scrollbars \
    --window-size=1280,1900 --screenshot=docs/report.png "file://$PWD/docs/example-report.html" 2>/dev/null
echo "wrote docs/example-report.html and docs/report.png"
