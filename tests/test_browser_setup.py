"""`make test`'s browser check (scripts/ensure_browser.sh): passes where chromium is on PATH, and
where it is not and cannot be installed, stops with the command to run instead of failing later."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ensure_browser.sh"


def test_a_chromium_on_path_is_enough(tmp_path):
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    assert subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True).returncode == 0


def test_without_chromium_or_a_way_to_install_it_it_says_what_to_run(tmp_path):
    # a PATH with the shell tools but neither chromium nor apt-get
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "id", "env"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    r = subprocess.run([str(bin_dir / "bash"), str(SCRIPT)], env={"PATH": str(bin_dir)}, capture_output=True,
                       text=True)
    assert r.returncode == 1
    assert "apt-get install chromium" in r.stderr and "make test-fast" in r.stderr
