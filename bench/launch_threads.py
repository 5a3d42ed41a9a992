#!/usr/bin/env python3
"""Count the CUDA launch sites whose thread block is too small.

Reads the kernel form of stage modules (`ppcc-opt STAGE.ppir --pass
'lower-to-mlir{target=cuda-kernels}'`) and prints, per file, how many `gpu.launch_func`
sites there are, how many launch one thread per block and how many fewer than a warp (32).
Block sizes that are not constants count as large.

    python3 bench/launch_threads.py FILE.mlir...
"""
import re
import sys


def count(text):
    consts = dict(re.findall(r"(%[\w]+) = arith.constant (\d+) : index", text))
    sites = one = small = 0
    for m in re.finditer(
        r"gpu.launch_func\s+@\S+\s+blocks in \(([^)]*)\) threads in \(([^)]*)\)", text
    ):
        threads = 1
        for name in m.group(2).split(","):
            v = consts.get(name.strip())
            threads *= int(v) if v else 1 << 30
        sites += 1
        one += threads == 1
        small += threads < 32
    return sites, one, small


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    total = [0, 0, 0]
    for path in sys.argv[1:]:
        with open(path) as f:
            c = count(f.read())
        total = [a + b for a, b in zip(total, c)]
        print(f"{path}: launch sites {c[0]}, one thread per block {c[1]}, fewer than a warp {c[2]}")
    if len(sys.argv) > 2:
        print(f"total: launch sites {total[0]}, one thread per block {total[1]}, fewer than a warp {total[2]}")


if __name__ == "__main__":
    main()
