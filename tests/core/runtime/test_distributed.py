"""core.runtime.distributed: the process group is destroyed before interpreter shutdown, not left to it."""

import subprocess
import sys
import textwrap

import pytest

# Runs in a fresh interpreter, which forks before any group exists: the child runs the call under test, the
# parent does not. atexit handlers run last-registered first, so the reporting handler, registered before the
# call, sees the group as that call's handler left it.
SCRIPT = textwrap.dedent("""
    import atexit, os, sys
    import torch.distributed as dist
    from core.runtime.distributed import destroy_process_group_at_exit
    child = os.fork()
    mode = "on" if child == 0 else "off"
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1] + mode, rank=0, world_size=1)
    atexit.register(lambda: print(mode, "initialized at exit:", dist.is_initialized(), flush=True))
    if mode == "on":
        destroy_process_group_at_exit()
        destroy_process_group_at_exit()  # a second call registers nothing more
    else:
        _, status = os.waitpid(child, 0)
        assert status == 0, status
    print(mode, "script done; atexit handlers follow", flush=True)
""")


@pytest.fixture(scope="module")
def at_exit(tmp_path_factory) -> list[str]:
    """What the two processes (the call made, the call not made) printed, in the order they printed it."""
    store = tmp_path_factory.mktemp("store") / "store-"
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(store)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


@pytest.mark.parametrize(("mode", "expected"), [("on", "False"), ("off", "True")])
def test_group_is_destroyed_at_exit(mode, expected, at_exit):
    printed = [line.split(" ", 1)[1] for line in at_exit if line.startswith(f"{mode} ")]
    assert printed[-1] == f"initialized at exit: {expected}", at_exit


def test_without_a_group_nothing_is_registered(monkeypatch):
    import core.runtime.distributed as module

    monkeypatch.setattr(module, "_registered", False)
    registered = []
    monkeypatch.setattr(module.atexit, "register", registered.append)
    module.destroy_process_group_at_exit()
    assert registered == [] and module._registered is False
