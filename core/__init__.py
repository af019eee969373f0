"""The shared core of both apps, in two parts that import in one direction only: `core.nn`, the pure-PyTorch
transformer (no Lightning, LitServe or file I/O), and `core.runtime`, what both apps' programs share on top of it."""
