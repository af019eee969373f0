"""core.runtime.logs: an app's INFO lines reach stderr once, from the first process only."""

import logging

import pytest

from core.runtime.logs import log_info_to_stderr


@pytest.fixture
def package():
    name = "core_logs_test_pkg"
    yield name
    logging.getLogger(name).handlers.clear()


def test_info_lines_reach_the_current_stderr_once(package, capsys):
    log_info_to_stderr(package)
    log_info_to_stderr(package)  # a second call adds no second handler
    logging.getLogger(f"{package}.data").info("skipped %d of %d pairs", 2, 4)
    assert capsys.readouterr().err == f"{package}.data: skipped 2 of 4 pairs\n"
    logging.getLogger(f"{package}.data").debug("not shown")
    assert capsys.readouterr().err == ""


def test_other_ddp_ranks_stay_quiet(package, capsys, monkeypatch):
    log_info_to_stderr(package)
    monkeypatch.setenv("LOCAL_RANK", "1")
    logging.getLogger(package).info("from rank 1")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("LOCAL_RANK", "0")
    logging.getLogger(package).info("from rank 0")
    assert capsys.readouterr().err == f"{package}: from rank 0\n"
