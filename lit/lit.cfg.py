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

# Pass plugins (lit/plugin/): the example plugin from the same build, the ABI's C header and
# a C compiler for the misbehaving test plugins, and a system library that is not a plugin.
import shutil

plugin = os.path.join(bin_dir, "libppcc_example_plugin.so")
if not os.path.exists(plugin):
    lit_config.fatal(f"{plugin} not found: build with `cargo build` (the workspace builds it)")
config.substitutions.append(("%plugin", plugin))
config.substitutions.append(("%abi-include", os.path.join(repo, "plugin", "include")))
cc = shutil.which("cc") or shutil.which("clang", path=llvm_bin)
if cc:
    config.available_features.add("cc")
    config.substitutions.append(("%cc", cc))
for lib in (
    "/lib/x86_64-linux-gnu/libz.so.1",
    "/usr/lib/x86_64-linux-gnu/libz.so.1",
    "/lib/aarch64-linux-gnu/libz.so.1",
    "/usr/lib64/libz.so.1",
    "/lib64/libz.so.1",
    "/usr/lib/libz.so.1",
):
    if os.path.exists(lib):
        config.available_features.add("system-lib")
        config.substitutions.append(("%system-lib", lib))
        break
