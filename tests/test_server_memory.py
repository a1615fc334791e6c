"""``dpproxy serve`` gives large freed blocks back to the OS (`listener.return_freed_memory`)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

# In a fresh process, a 20 MB array is freed (mapped on its own: glibc then raises its threshold
# to 20 MB); then a 10 MB one is filled and freed, before and after the server's setting: the
# RSS kept each time, in MB.
KEPT = """
import numpy as np
from proxy.server.listener import return_freed_memory

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

def kept():
    before = rss()
    middle = np.ones(10 * 2**20 // 8)
    del middle
    return rss() - before

large = np.ones(20 * 2**20 // 8)
del large
print(kept(), return_freed_memory(), kept())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_a_freed_array_leaves_the_servers_rss() -> None:
    done = subprocess.run([sys.executable, "-c", KEPT], capture_output=True, text=True, check=True)
    default, changed, serving = done.stdout.split()
    assert float(default) > 8  # glibc alone keeps it: the test can tell
    assert changed == "True"
    assert float(serving) < 2
