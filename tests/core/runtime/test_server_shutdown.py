"""SIGTERM stops a server built on core.runtime.serving cleanly: the requests it accepted are answered, the port
is refused after, the command exits 0 and leaves no process behind.

The signal goes to the server process alone (as `kill PID`, Docker, Kubernetes send it) and to its whole process
group (as systemd, `timeout` and Ctrl-C do), which reaches the model worker at the same moment.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import suppress
from pathlib import Path

import pytest

from streamrec import Recommender
from streamrec.serve import StreamRecAPI, check_request, request_fields

pytestmark = pytest.mark.slow  # end-to-end: a real server in a subprocess

ROOT = Path(__file__).resolve().parents[3]
CKPT = ROOT / "tests" / "streamrec" / "fixtures" / "sasrec.ckpt"
REQUESTS = 12
NOT_ACCEPTED = (ConnectionRefusedError, ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(port: int, log: Path) -> subprocess.Popen:
    """The server on 127.0.0.1:`port`, in its own session, ready; one worker answering one request at a time,
    so that most of the concurrent requests are still queued when the signal comes."""
    command = [sys.executable, "-m", "streamrec.serve", "--ckpt", str(CKPT), "--host", "127.0.0.1",
               "--port", str(port), "--max-batch-size", "1", "--threads", "1", "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=ROOT, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        with suppress(OSError, http.client.HTTPException):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return proc
        time.sleep(0.25)
    stop(proc, [])
    raise RuntimeError(f"the server did not get ready: {log.read_text(errors='replace')[-2000:]}")


def descendants(pid: int) -> list[int]:
    """Every living process below `pid`, whichever process group it is in (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        with suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return sorted(set(found))


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for init to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop(proc: subprocess.Popen, pids: list[int]) -> None:
    """Kill whatever a failed test left running: the session, and the processes found below the server."""
    for pid in pids:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def post(url: str, payload: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url + "/predict", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:  # an HTTPError (4xx, 5xx) fails the test
        return response.status, json.loads(response.read())


def same(answer: object, expected: object) -> bool:
    """Equal JSON, floats to a tolerance (the server's worker runs on one thread, this process on several)."""
    if isinstance(expected, float):
        return answer == pytest.approx(expected, rel=1e-4, abs=1e-5)
    if isinstance(expected, dict):
        return isinstance(answer, dict) and answer.keys() == expected.keys() and all(
            same(answer[k], expected[k]) for k in expected)
    if isinstance(expected, list):
        return isinstance(answer, list) and len(answer) == len(expected) and all(map(same, answer, expected))
    return answer == expected


@pytest.fixture(scope="module")
def requests_and_answers() -> tuple[list[dict], list[object]]:
    """The requests both cases send, and what the API answers each in this process (the reference)."""
    rec = Recommender.load(CKPT)
    items = list(rec.vocab.items)
    # Explained answers: one model call per history item, slow enough to be in flight when the signal comes.
    payloads = [{"history": (items[i:] + items[:i]) * 2, "top_k": 5, "explain": True} for i in range(REQUESTS)]
    api = StreamRecAPI(str(CKPT))
    api.load("cpu")
    fields = request_fields(rec.vocab.num_items)
    return payloads, [json.loads(json.dumps(api.predict_many([check_request(p, fields)])[0])) for p in payloads]


@pytest.mark.parametrize("target", ["server", "group"])
def test_sigterm_answers_the_accepted_requests_and_exits_0(target, requests_and_answers, tmp_path):
    payloads, expected = requests_and_answers
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(port, tmp_path / "server.log")
    pids = descendants(proc.pid)
    outcomes: dict[int, object] = {}
    answered = threading.Event()

    def send(i: int) -> None:
        try:
            outcomes[i] = post(url, payloads[i])
            answered.set()
        except Exception as err:  # judged below
            outcomes[i] = err

    threads = [threading.Thread(target=send, args=(i,)) for i in range(REQUESTS)]
    try:
        for t in threads:
            t.start()
        assert answered.wait(60), outcomes
        in_flight = REQUESTS - len(outcomes)
        if target == "group":
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        returncode = proc.wait(timeout=10)
        for t in threads:
            t.join(timeout=60)
        deadline = time.monotonic() + 10  # the resource tracker and the worker follow the server out
        while time.monotonic() < deadline and any(map(alive, pids)):
            time.sleep(0.1)
        left = [pid for pid in pids if alive(pid)]
    finally:
        stop(proc, pids)

    log = (tmp_path / "server.log").read_text(errors="replace")[-3000:]
    assert returncode == 0, log
    assert in_flight > 0  # the signal came while requests were still waiting for their answers
    answers = {i: o for i, o in outcomes.items() if isinstance(o, tuple)}
    refused = {i: o for i, o in outcomes.items() if not isinstance(o, tuple)}
    assert len(answers) + len(refused) == REQUESTS
    assert all(isinstance(err, NOT_ACCEPTED) for err in refused.values()), (refused, log)
    assert len(answers) > REQUESTS - in_flight, log  # some answered after the signal
    for i, (status, answer) in answers.items():
        assert status == 200 and same(answer, expected[i]), (i, answer, expected[i])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert left == [], log
    assert len(pids) >= 3  # the Manager, the worker and the HTTP process were all watched
