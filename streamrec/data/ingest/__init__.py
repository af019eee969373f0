"""The steps of reading an interaction log, one module each, chained by `streamrec.data.readers.read_interactions`:
`detect` (the format) -> `parse` (pyarrow) -> `columns` (names, conversion) -> `filters` -> `build`.
`options` holds `ReadOptions`, the one object every step reads."""
