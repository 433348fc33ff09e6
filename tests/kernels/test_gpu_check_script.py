"""scripts/gpu-check.sh stops loudly, before installing anything, on a machine without a GPU."""

from __future__ import annotations

import os
import shutil
import subprocess

from tests.helpers import REPO


def test_gpu_check_fails_loudly_without_a_gpu(tmp_path):
    # a PATH with the shell tools the script needs and no nvidia-smi: the machine has no GPU driver
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "grep"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    result = subprocess.run([shutil.which("bash"), str(REPO / "scripts" / "gpu-check.sh")], capture_output=True,
                            text=True, timeout=60, env={"PATH": str(bin_dir), "HOME": str(tmp_path)})
    assert result.returncode == 2
    assert "gpu-check: FAILED: no NVIDIA driver" in result.stderr


def test_gpu_check_fails_when_the_driver_lists_no_gpu(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "grep"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/bash\necho 'No devices were found'\nexit 6\n")
    fake.chmod(0o755)
    result = subprocess.run([shutil.which("bash"), str(REPO / "scripts" / "gpu-check.sh")], capture_output=True,
                            text=True, timeout=60, env={"PATH": str(bin_dir), "HOME": str(tmp_path)})
    assert result.returncode == 2
    assert "nvidia-smi lists no GPU" in result.stderr
