"""The steps of reading an interaction log, chained by `streamrec.data.readers.read_interactions`:
`parse` (the format, then pyarrow) -> `columns` (names, conversion, filters) -> `build`.
`options` holds `ReadOptions`, the one object every step reads."""
