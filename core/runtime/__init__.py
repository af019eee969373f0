"""What both apps' programs share: the Lightning CLI, checkpoint I/O, locks and atomic writes, resume, serving, export.
Modules are imported one by one, so the readers import `core.runtime.errors` without paying for torch or Lightning."""
