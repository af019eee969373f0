"""What benchmarks/gpu/run_all.sh needs on the GPU machine: CUDA in torch, and every module the runs import.

Prints each module's version; exits 1 with the fix when torch sees no GPU (unless ALLOW_CPU=1, for a dry run
of run_all.sh on a CPU) or a needed module is missing (transformers is optional: without it gpu_train.py
reports the HF rows as skipped).
"""

from __future__ import annotations

import importlib
import os
import sys

import torch

NEEDED = ("lightning", "torchmetrics", "sentencepiece", "sacrebleu", "rich", "filelock", "pytest",
          "translate.model.module", "streamrec.model.module")
OPTIONAL = ("transformers",)


def main() -> int:
    cuda = torch.cuda.is_available()
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"device {torch.cuda.get_device_name() if cuda else 'none'}")
    missing = []
    for name in NEEDED + OPTIONAL:
        try:
            module = importlib.import_module(name)
        except Exception as e:  # report every failure, not only ImportError
            print(f"  {name}: MISSING ({type(e).__name__}: {e})")
            missing += [name] if name in NEEDED else []
            continue
        print(f"  {name} {getattr(module, '__version__', '')}".rstrip())
    if not cuda and os.environ.get("ALLOW_CPU") != "1":
        print("error: torch sees no CUDA device (ALLOW_CPU=1 for a dry run on a CPU)", file=sys.stderr)
        return 1
    if missing:
        packages = " ".join(m for m in missing if "." not in m) or "NAME (the package the error above names)"
        print(f"error: missing {', '.join(missing)}: run `bash benchmarks/gpu/fetch_wheels.sh {packages}` "
              "where pip works, then call the device tool with carry ['.whl']", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
