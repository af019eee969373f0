"""HTTP serving on LitServe, shared by `python -m streamrec.serve` and `python -m translate.serve` (docs/serving.md).

One job a module: `schema` (the request fields and strict JSON), `gate` (the ASGI middleware that limits and checks
bodies in the HTTP process), `litserver` (the LitAPI an app fills in and a LitServer on pipe queues), `cli` (the
options every server takes and `run_server`).
Unlike `core.nn`, this package imports LitServe and FastAPI.
"""
