"""Serve a StreamRec checkpoint over HTTP: POST a history, get the top-k items with their scores.

    python -m streamrec.serve --ckpt runs/streamrec_demo/checkpoints/best.ckpt --port 8000
    curl -s localhost:8000/predict -H 'Content-Type: application/json' \\
         -d '{"history": ["v0001", "v0002"], "top_k": 3}'
    # {"items": [{"item_id": "v0007", "score": 8.1}, ...], "unknown_items": [], "cold": false}

The request (POST /predict) is a JSON object with `history` (item ids, oldest first) and optionally `top_k`,
`exclude_seen`, `items` (an allow-list), `cold_slots` and `explain`; docs/serving.md lists their ranges and defaults.
Requests arriving together (up to --max-batch-size, waiting at most --batch-timeout seconds) are scored in one model
call (`streamrec.Recommender.recommend`). A malformed or out-of-range request gets a 4xx answer {"error": "one line"}
and the server goes on serving. GET /health answers 200 "ok" once the model is loaded. The server listens on 127.0.0.1
unless --host says otherwise."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from core.runtime.errors import InputError
from core.runtime.serving.cli import ServerOptions, one_line_errors, run_server, serve_parser
from core.runtime.serving.litserver import BatchedAPI
from core.runtime.serving.schema import Field, RequestError, check_fields
from streamrec.api import Recommender, as_item_ids

MAX_TOP_K = 1000
MAX_HISTORY = 10_000  # items per history; only the last max_len reach the model, the rest only filter seen items
MAX_ALLOWED = 100_000  # ids in an allow-list
MAX_ID_CHARS = 256


def request_fields(num_items: int) -> dict[str, Field]:
    return {
        "history": Field(list, item=str, hi=MAX_HISTORY, item_hi=MAX_ID_CHARS),
        "top_k": Field(int, 10, lo=1, hi=min(MAX_TOP_K, num_items)),
        "exclude_seen": Field(bool, True),
        "items": Field(list, None, hi=MAX_ALLOWED, item=str, item_hi=MAX_ID_CHARS),
        "explain": Field(bool, False),
        "cold_slots": Field(int, 0, lo=0, hi=min(MAX_TOP_K, num_items)),
    }


def check_request(payload: object, fields: dict[str, Field]) -> dict[str, Any]:
    """The request with its defaults filled in, or a `RequestError` naming the field at fault; integer item ids
    become their string form (`streamrec.api.as_item_ids`)."""
    if isinstance(payload, dict):
        payload = dict(payload)
        for name in ("history", "items"):
            if isinstance(payload.get(name), list):
                try:
                    payload[name] = as_item_ids(payload[name], name)
                except InputError as err:
                    raise RequestError(str(err)) from None
    request = check_fields(payload, fields)
    if request["cold_slots"] > request["top_k"]:
        raise RequestError(f"`cold_slots` ({request['cold_slots']}) must be at most `top_k` ({request['top_k']})")
    if request["cold_slots"] and request["explain"]:
        raise RequestError("`cold_slots` does not apply to explained answers; send explain: false or cold_slots: 0")
    return request


class StreamRecAPI(BatchedAPI):
    """Recommendations for a batch of requests: one `Recommender.recommend` call per distinct (exclude_seen, items,
    cold_slots). The checkpoint is loaded in each worker process by `setup`."""

    def __init__(self, ckpt: list[str], threads: int = 0, max_batch_size: int = 1, batch_timeout: float = 0.0):
        super().__init__(threads, max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.ckpt = ckpt

    def load(self, device: str) -> None:
        self.rec = Recommender.load(self.ckpt, device)

    def predict_many(self, requests: list[dict]) -> list[dict]:
        """One answer per request; users who share `exclude_seen`, the allow-list and the cold slots are batched."""
        answers: list[dict[str, Any]] = [{} for _ in requests]
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            if r["explain"]:
                answers[i] = self._explained(r)
            else:
                # With cold slots a shorter list is not the head of a longer one: K joins the key.
                key = (r["exclude_seen"], None if r["items"] is None else tuple(r["items"]), r["cold_slots"],
                       r["top_k"] if r["cold_slots"] else None)
                groups.setdefault(key, []).append(i)
        for (exclude_seen, items, cold_slots, _), rows in groups.items():
            # Otherwise each user's top K is the head of the top (largest K): one call serves every K.
            top_k = max(requests[i]["top_k"] for i in rows)
            recs = self.rec.recommend([requests[i]["history"] for i in rows], top_k, exclude_seen, items,
                                      cold_slots=cold_slots)
            for i, ranked in zip(rows, recs, strict=True):
                answers[i] = self._answer(requests[i], ranked[: requests[i]["top_k"]])
        return answers

    def _answer(self, request: dict, ranked: list[tuple[str, float]],
                encoded: tuple[list[int], list[str]] | None = None) -> dict[str, Any]:
        """The JSON answer; `encoded` is the history's `Recommender.encode` where the caller already has it."""
        known, unknown = encoded or self.rec.encode(request["history"])  # one vocabulary lookup per list
        if request["items"]:
            unknown = [*unknown, *self.rec.encode(request["items"])[1]]
        return {"items": [{"item_id": item, "score": score} for item, score in ranked],
                "unknown_items": list(dict.fromkeys(unknown)), "cold": not known}

    def _explained(self, request: dict) -> dict[str, Any]:
        encoded = self.rec.encode(request["history"])
        if not encoded[0]:
            return {**self._answer(request, [], encoded), "explanation": None}
        why = self.rec.explain(request["history"], request["top_k"], request["exclude_seen"], request["items"])
        because = [{"item_id": item, "most_attended": attended, "most_important": removed, "score_drop": drop}
                   for (item, _), (attended, removed, drop) in zip(why.recommendations, why.because, strict=True)]
        explanation = {"history": why.history, "attention": why.attention, "because": because}
        return {**self._answer(request, why.recommendations, encoded), "explanation": explanation}


def build_parser() -> argparse.ArgumentParser:
    """`python -m streamrec.serve`'s options (those of `core.runtime.serving.cli.serve_parser`)."""
    return serve_parser("python -m streamrec.serve", __doc__, 8000, "a checkpoint written by `python -m streamrec fit`")


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: a bad checkpoint or option ends with one line on stderr and exit status 1."""
    args = build_parser().parse_args(argv)
    options = ServerOptions.from_args(args)
    with one_line_errors():
        # Loaded here once, through the safe loader, so a bad checkpoint stops before any server process starts.
        num_items = Recommender.load(args.ckpt).vocab.num_items
        fields = request_fields(num_items)
        api = StreamRecAPI(args.ckpt, options.threads_per_worker, options.max_batch_size, options.batch_timeout)
        metadata = {"app": "streamrec", "ckpt": args.ckpt, "num_items": num_items, "max_top_k": fields["top_k"].hi,
                    "max_history": MAX_HISTORY, "max_body_bytes": options.max_body_bytes}
        run_server(api, lambda payload: check_request(payload, fields), options, metadata)


if __name__ == "__main__":
    sys.exit(main())
