#!/usr/bin/env python3
"""Write the ONNX backend node test cases (onnx/backend/test/case/node) as test folders.

    onnx-node-data.py OUT_DIR      -> OUT_DIR/node/<case>/model.onnx, test_data_set_0/*.pb

Some onnx wheels ship these folders under onnx/backend/test/data/node; others (1.23 here)
ship only the generators. This runs the generators the way `onnx.backend.test.cmd_tools
generate-data` does for model cases, with numpy's global seed fixed, so the same onnx and
numpy versions give the same bytes. Used by cli/tests/conformance_node.rs.
"""
import argparse
import sys
import types

import numpy as np
import onnx
import onnx.backend.test.case.node as node_cases
import onnx.backend.test.cmd_tools as cmd_tools


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="output folder (the cases go to OUT/node/)")
    args = ap.parse_args()
    np.random.seed(0)
    # generate_data writes every case collect_testcases returns (kind "node" -> OUT/node).
    cmd_tools.model_test = types.SimpleNamespace(
        collect_testcases=node_cases.collect_testcases
    )
    cmd_tools.generate_data(argparse.Namespace(output=args.out))
    print(f"onnx {onnx.__version__}, numpy {np.__version__}: wrote {args.out}/node", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
