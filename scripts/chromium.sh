#!/usr/bin/env bash
# Installs Debian's chromium for the tests that load surge's web pages in a
# real headless browser (chromedp), and prints its path.
set -euo pipefail
if ! command -v chromium >/dev/null; then
  echo "chromium.sh: installing chromium" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
command -v chromium
