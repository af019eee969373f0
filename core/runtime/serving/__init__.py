"""HTTP serving on LitServe, shared by `python -m streamrec.serve` and `python -m translate.serve` (docs/serving.md):
`schema` (request fields, strict JSON), `gate` (the ASGI middleware that checks bodies), `litserver`, `cli`."""
