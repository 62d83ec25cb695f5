#!/usr/bin/env python3
"""ctest entry (label gpu) for test_transformers.py. Prints "SKIPPED: <reason>" and exits 0
where the machine cannot run it (no torch, transformers, pytest or numpy, no CUDA device,
or a build without CUDA); ctest reports that as Skipped, never as a pass. Otherwise runs
pytest (arguments are passed on, e.g. -k GROUP) and returns its exit status."""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def skip(reason):
    print(f"SKIPPED: {reason}")
    return 0


def main():
    for mod in ("torch", "transformers", "pytest", "numpy"):
        if importlib.util.find_spec(mod) is None:
            return skip(f"python module '{mod}' is not installed (the GPU machine has it)")
    import torch
    if not torch.cuda.is_available():
        return skip("no CUDA device")
    klib = os.environ.get("KVTIER_KERNELS_LIB", "")
    if klib and not os.path.exists(klib):
        return skip(f"{klib} was not built (a build without CUDA)")
    import pytest
    return pytest.main([os.path.join(HERE, "test_transformers.py"), "-q", "-s", "-p", "no:cacheprovider",
                        *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
