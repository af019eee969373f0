"""Serve a Translate checkpoint over HTTP: POST sentences, get their translations with scores.

    python -m translate.serve --ckpt runs/translate_demo/checkpoints/best.ckpt --port 8001
    curl -s localhost:8001/predict -H 'Content-Type: application/json' \\
         -d '{"sentences": ["he can sleep .", "she sees the dog ."], "beam_size": 5}'
    # {"translations": [{"text": "er kann schlafen .", "score": -0.41, "log_prob": -0.52}, ...]}

The request (POST /predict) is a JSON object with `sentences` (or `text`, one sentence, answered with "translation")
and optionally `beam_size`, `n_best` and `return_scores`; docs/serving.md lists their ranges and defaults. `score` is
what beam search ranks by, as in `translate.Translator.translate`. Sentences of requests arriving together (up to
--max-batch-size requests, waiting at most --batch-timeout seconds) are decoded in one `Translator.translate_with` call
per distinct `SearchOptions`. A malformed or out-of-range request gets a 4xx answer {"error": "one line"} and the server
goes on serving. GET /health answers 200 "ok" once the model is loaded. The server listens on 127.0.0.1 (see --host)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from core.runtime.errors import InputError
from core.runtime.serving.cli import ServerOptions, one_line_errors, run_server, serve_parser
from core.runtime.serving.litserver import BatchedAPI
from core.runtime.serving.schema import Field, RequestError, check_fields
from translate.search.options import SearchOptions

MAX_SENTENCES = 64  # per request
MAX_CHARS = 1000  # per sentence; the model truncates sources longer than its max_len (in subwords) anyway
MAX_BEAM = 16

FIELDS = {
    "sentences": Field(list, None, lo=1, hi=MAX_SENTENCES, item=str, item_hi=MAX_CHARS),
    "text": Field(str, None, hi=MAX_CHARS),
    "beam_size": Field(int, 5, lo=1, hi=MAX_BEAM),
    "n_best": Field(int, 1, lo=1, hi=MAX_BEAM),
    "return_scores": Field(bool, True),
}


def check_request(payload: object) -> dict:
    """The checked request (JSON, for the worker): `check_fields`, exactly one of `sentences` and `text`, and
    valid `search_options`."""
    try:
        request = check_fields(payload, FIELDS)
        search_options(request)
    except InputError as err:  # RequestError, or `n_best` above `beam_size`
        raise err if isinstance(err, RequestError) else RequestError(str(err)) from None
    if (request["sentences"] is None) == (request["text"] is None):
        raise RequestError("give either `sentences` (a list) or `text` (one sentence), not both or neither")
    return request


def search_options(request: dict) -> SearchOptions:
    return SearchOptions(beam_size=request["beam_size"], n_best=request["n_best"])


class TranslateAPI(BatchedAPI):
    """Translations for a batch of requests: one `Translator.translate_with` call per distinct `SearchOptions`. `ckpt`
    is loaded in each worker process by `setup`; the other arguments as `Translator.load` and
    `core.runtime.serving.litserver.BatchedAPI` take them."""

    def __init__(self, ckpt: list[str], dtype: str = "float32", threads: int = 0, max_batch_size: int = 1,
                 batch_timeout: float = 0.0):
        super().__init__(threads, max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.ckpt, self.dtype = ckpt, dtype

    def load(self, device: str) -> None:
        from translate.api import Translator

        self.translator = Translator.load(self.ckpt, device, self.dtype)

    def predict_many(self, requests: list[dict]) -> list[dict]:
        """One answer per request; the sentences of requests with the same options are decoded together."""
        sources = [[r["text"]] if r["sentences"] is None else r["sentences"] for r in requests]
        answers: list[dict[str, Any]] = [{} for _ in requests]
        groups: dict[SearchOptions, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(search_options(r), []).append(i)
        for options, rows in groups.items():
            flat = [s for i in rows for s in sources[i]]
            done = self.translator.translate_with(flat, options, return_scores=True)
            start = 0
            for i in rows:
                out = [_encode(t, requests[i]["return_scores"]) for t in done[start : start + len(sources[i])]]
                start += len(sources[i])
                answers[i] = {"translations": out} if requests[i]["text"] is None else {"translation": out[0]}
        return answers


def _encode(result: Any, with_scores: bool) -> Any:
    """A `Translation` (or a list of them, for n_best > 1) as JSON: an object with scores, or the text."""
    if isinstance(result, list):
        return [_encode(r, with_scores) for r in result]
    return {"text": result.text, "score": result.score, "log_prob": result.log_prob} if with_scores else result.text


def build_parser() -> argparse.ArgumentParser:
    p = serve_parser("python -m translate.serve", __doc__, 8001, "a checkpoint written by `python -m translate fit`")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "int8"),
                   help="weights and activations: float32, bfloat16 (CPUs with bf16 units, GPUs) or int8 (CPU)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    options = ServerOptions.from_args(args)
    with one_line_errors():
        from translate.api import Translator

        # Loaded here once, through the safe loader, so a bad checkpoint stops before any server process starts.
        Translator.load(args.ckpt, "cpu", args.dtype if args.dtype != "bfloat16" else "float32")
        api = TranslateAPI(args.ckpt, args.dtype, options.threads_per_worker, options.max_batch_size,
                           options.batch_timeout)
        metadata = {"app": "translate", "ckpt": args.ckpt, "max_sentences": MAX_SENTENCES, "max_chars": MAX_CHARS,
                    "max_beam": MAX_BEAM, "max_body_bytes": options.max_body_bytes}
        run_server(api, check_request, options, metadata)


if __name__ == "__main__":
    sys.exit(main())
