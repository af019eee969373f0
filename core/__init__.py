"""The shared core of both apps, in two parts that import in one direction only:

- `core.nn`: the pure-PyTorch transformer (attention, masks, positions, blocks, stacks, KV cache,
  losses, schedules, optimiser, attention capture). No Lightning, LitServe or file I/O.
- `core.runtime`: what both apps' programs share on top of it (the Lightning CLI, safe checkpoint
  I/O, locks and atomic writes, resume, precision, serving, export).
"""
