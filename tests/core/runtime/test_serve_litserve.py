"""core.runtime.serving.litserver.PipeLitServer against the private LitServer internals it replaces (no public API
chooses LitServe's queues): these fail on a litserve upgrade, so the override is checked again before the pin moves."""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing.queues

import litserve as ls
import pytest
from litserve.transport.process_transport import MPQueueTransport

from core.runtime.serving import litserver as serve


class _Echo(serve.BatchedAPI):
    def load(self, device: str) -> None:
        pass

    def predict_many(self, requests: list[dict]) -> list[dict]:
        return requests


def test_the_installed_litserve_is_the_supported_one():
    assert ls.__version__ == serve.LITSERVE_VERSION, (
        f"litserve {ls.__version__}: check PipeLitServer against LitServer._init_manager and _transport, then move "
        "LITSERVE_VERSION and constraints.txt")


def test_the_private_internals_it_replaces_are_where_it_expects_them():
    assert list(inspect.signature(ls.LitServer._init_manager).parameters) == ["self", "num_api_servers"]
    assert "self._transport = " in inspect.getsource(ls.LitServer._init_manager)
    for reader in (ls.LitServer.lifespan, ls.LitServer.launch_inference_worker):  # who hands the queues on
        assert "self._transport" in inspect.getsource(reader)
    assert "self._get_request_queue(" in inspect.getsource(ls.LitServer.launch_inference_worker)
    assert list(inspect.signature(MPQueueTransport).parameters) == ["manager", "queues"]


def test_requests_and_answers_go_through_pipe_queues():
    server = serve.PipeLitServer(_Echo(), accelerator="cpu")
    manager = server._init_manager(2)
    try:
        queues = [*server.litapi_request_queues.values(), *server._transport._queues]
        assert len(queues) == 3 and all(type(q) is multiprocessing.queues.Queue for q in queues)  # not Manager proxies
        assert type(server._transport) is MPQueueTransport
        server._transport.send({"answer": 1}, consumer_id=1)
        assert asyncio.run(server._transport.areceive(consumer_id=1, timeout=10)) == {"answer": 1}
    finally:
        manager.shutdown()


def test_another_litserve_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(ls, "__version__", "0.3.0")
    with pytest.raises(RuntimeError, match=r"^litserve 0\.3\.0 is installed.* litserve==0\.2\.19$") as err:
        serve.PipeLitServer(_Echo(), accelerator="cpu")
    assert "\n" not in str(err.value)
