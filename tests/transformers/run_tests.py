#!/usr/bin/env python3
"""ctest entry for the kvtier.transformers tests and the examples' smoke runs. Prints
"SKIPPED: <reason>" and exits 0 where the machine cannot run it (no torch, transformers,
pytest or numpy; for GPU entries no CUDA device or a kernels library built without CUDA);
ctest reports that as Skipped, never as a pass. Otherwise returns the run's exit status.

    run_tests.py [--file test_x.py] [--cpu] [pytest args, e.g. -k GROUP]
        pytest over tests/transformers/test_x.py (default test_transformers.py); --cpu: the
        file's tests run without a GPU (its GPU tests skip themselves)
    run_tests.py --example SCRIPT [args]
        examples/transformers/SCRIPT with args (e.g. bench_decode.py --smoke)
"""
import importlib.util
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.normpath(os.path.join(HERE, "..", "..", "examples", "transformers"))


def skip(reason):
    print(f"SKIPPED: {reason}")
    return 0


def main(argv):
    cpu, example, test_file = False, None, "test_transformers.py"
    while argv and argv[0] in ("--cpu", "--example", "--file"):
        flag = argv.pop(0)
        if flag == "--cpu":
            cpu = True
        elif flag == "--example":
            example = argv.pop(0)
        else:
            test_file = argv.pop(0)
    # CPU entries run under the CPU torch venv scripts/test.sh names (KVTIER_TORCH_PYTHON),
    # where this python lacks the modules; with KVTIER_REQUIRE_TORCH=1 (scripts/test.sh) a
    # missing module fails a CPU entry instead of skipping it.
    tp = os.environ.get("KVTIER_TORCH_PYTHON", "")
    # (No realpath comparison: a venv's python is a link to the interpreter it was made from,
    # and only the path it is started by selects the venv.)
    if cpu and tp and os.path.abspath(tp) != sys.executable and \
            os.environ.get("KVTIER_RUN_TESTS_REEXEC") != "1":
        os.environ["KVTIER_RUN_TESTS_REEXEC"] = "1"
        os.execv(tp, [tp, os.path.abspath(__file__), *sys.argv[1:]])
    for mod in ("torch", "transformers", "pytest", "numpy"):
        if importlib.util.find_spec(mod) is None:
            if cpu and os.environ.get("KVTIER_REQUIRE_TORCH") == "1":
                print(f"FAILED: python module '{mod}' is not installed in {sys.executable}"
                      " (KVTIER_REQUIRE_TORCH=1)")
                return 1
            return skip(f"python module '{mod}' is not installed (the GPU machine has it)")
    klib = os.environ.get("KVTIER_KERNELS_LIB", "")
    if klib and not os.path.exists(klib):
        return skip(f"{klib} was not built")
    if not cpu:
        import torch
        if not torch.cuda.is_available():
            return skip("no CUDA device")
        from kvtier import kernels
        if not kernels.built_with_cuda():
            return skip("libkvtier_kernels.so was built without CUDA")
    if example:
        return subprocess.run([sys.executable, os.path.join(EXAMPLES, example), *argv]).returncode
    import pytest
    return pytest.main([os.path.join(HERE, test_file), "-q", "-s", "-p", "no:cacheprovider", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
