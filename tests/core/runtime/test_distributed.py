"""core.runtime.distributed: the process group is destroyed before interpreter shutdown, not left to it."""

import subprocess
import sys
import textwrap

import pytest

# Runs in a fresh interpreter: atexit handlers run last-registered first, so the reporting handler,
# registered before the call under test, sees the group as that call's handler left it.
SCRIPT = textwrap.dedent("""
    import atexit, sys
    import torch.distributed as dist
    from core.runtime.distributed import destroy_process_group_at_exit
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
    atexit.register(lambda: print("initialized at exit:", dist.is_initialized(), flush=True))
    if sys.argv[1] == "on":
        destroy_process_group_at_exit()
        destroy_process_group_at_exit()  # a second call registers nothing more
    print("script done; atexit handlers follow", flush=True)
""")


@pytest.mark.parametrize(("mode", "expected"), [("on", "False"), ("off", "True")])
def test_group_is_destroyed_at_exit(mode, expected, tmp_path):
    args = [sys.executable, "-c", SCRIPT, mode, str(tmp_path / "store")]
    run = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == f"initialized at exit: {expected}"


def test_without_a_group_nothing_is_registered(monkeypatch):
    import core.runtime.distributed as module

    monkeypatch.setattr(module, "_registered", False)
    registered = []
    monkeypatch.setattr(module.atexit, "register", registered.append)
    module.destroy_process_group_at_exit()
    assert registered == [] and module._registered is False
