#!/usr/bin/env bash
# The report test opens the HTML report in real headless Chromium: Debian's `chromium` package
# (a browser downloaded by playwright would come from outside the package registries).
# Installs it where this machine can (root with apt-get); otherwise says what to install and fails
# before any test runs.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian's chromium for the report test (apt-get install chromium)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium >/dev/null
  exit 0
fi
echo "make test needs Chromium for the report test: install Debian's package first" >&2
echo "  sudo apt-get install chromium      (or any 'chromium' on PATH)" >&2
echo "then run make test again; make test-fast runs without it." >&2
exit 1
