# lit configuration for ppcc's pass tests: one .ppir file per case, with
# `// RUN: %ppcc-opt %s ... | FileCheck %s` and `// CHECK:` lines.
import os

import lit.formats

config.name = "ppcc"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".ppir", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["Inputs", "lit.cfg.py"]

repo = os.path.dirname(config.test_source_root)
bin_dir = os.environ.get("PPCC_BIN_DIR", os.path.join(repo, "target", "debug"))
llvm_bin = os.environ.get("LLVM_BIN_DIR", "/usr/lib/llvm-22/bin")

for tool in ("ppcc-opt", "ppcc"):
    path = os.path.join(bin_dir, tool)
    if not os.path.exists(path):
        lit_config.fatal(f"{path} not found: build with `cargo build` or set PPCC_BIN_DIR")
    # `%ppcc-opt` must be substituted before `%ppcc`, which is its prefix.
    config.substitutions.append((f"%{tool}", path))

config.environment["PATH"] = os.pathsep.join([llvm_bin, config.environment.get("PATH", "")])
config.substitutions.append(("%examples", os.path.join(repo, "examples")))
