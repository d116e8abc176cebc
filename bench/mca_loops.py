#!/usr/bin/env python3
"""Static cycle estimates of a kernel's hot loop (llvm-mca), for two revisions side by side.

On a shared machine a kernel change of 10% hides in the noise of timed runs; llvm-mca's model
of the core (its ports, latencies and throughputs) gives a deterministic estimate. For each
revision this extracts src/ (`git archive`), compiles FILE to assembly with the
project's flags (-O3, -march from --march: native by default), finds the functions whose mangled names match
--function, takes each one's largest loop (the instructions between a label and the last
backward jump to it) and prints llvm-mca's cycles for --iterations runs of it and its
instruction count. Compare revisions only on loops that do the same work (same unrolling:
look at the instruction mix with --show: a "loop" of pops and jumps is not the hot one, which
happens where the hot loop was inlined into a larger one). Example (the forty-second session's
lane loops):

    python3 bench/mca_loops.py --rev a275f9b 5cc8569 --file src/backend/cpu/qgemv_q8.cc \\
        --function 'KBlocks32.*run_lanesILb0E' --mcpu znver3

The estimate is of the loop alone with its data in L1: not a measurement, and blind to the
rest of the function (the Q5_0 lane form's unpacking, per-row set-up).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def largest_loops(asm):
    """{mangled function name: list of instruction lines of its largest loop}."""
    lines = asm.split("\n")
    out = {}
    i = 0
    while i < len(lines):
        m = re.match(r"^(_Z\S+):$", lines[i])
        if not m:
            i += 1
            continue
        name, start = m.group(1), i
        end = start
        while end < len(lines) and not (lines[end].strip().startswith(".size") and name in lines[end]):
            end += 1
        body = lines[start:end]
        labels = {}
        for k, line in enumerate(body):
            lm = re.match(r"^(\.L\w+):", line)
            if lm:
                labels[lm.group(1)] = k
        best = []
        for k, line in enumerate(body):
            jm = re.match(r"\s+j\w+\s+(\.L\w+)", line)
            if jm and jm.group(1) in labels and labels[jm.group(1)] < k:
                ins = [x for x in body[labels[jm.group(1)]:k + 1]
                       if x.startswith("\t") and not x.strip().startswith(".")]
                if len(ins) > len(best):
                    best = ins
        if best:
            out[name] = best
        i = end + 1
    return out


def compile_rev(rev, file, march, tmp):
    src = os.path.join(tmp, rev)
    os.makedirs(src, exist_ok=True)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "src"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
    asm = os.path.join(src, "out.s")
    subprocess.run(["c++", f"-I{src}/src", "-O3", "-DNDEBUG", f"-march={march}",
                    "-fopenmp", "-std=gnu++20", "-S", "-o", asm, os.path.join(src, file)],
                   check=True)
    with open(asm) as f:
        return f.read()


def mca(instructions, mcpu, iterations, tmp):
    path = os.path.join(tmp, "loop.s")
    with open(path, "w") as f:
        f.write("\n".join(instructions) + "\n")
    tool = next((t for t in ("llvm-mca", "llvm-mca-14", "llvm-mca-15", "llvm-mca-16")
                 if subprocess.run(["which", t], capture_output=True).returncode == 0), None)
    if tool is None:
        sys.exit("mca_loops: llvm-mca not found (Debian: apt-get install llvm)")
    out = subprocess.run([tool, f"-mcpu={mcpu}", f"-iterations={iterations}", path],
                         check=True, capture_output=True, text=True).stdout
    cycles = re.search(r"Total Cycles:\s+(\d+)", out)
    return int(cycles.group(1)) if cycles else None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", nargs="+", required=True, help="git revisions to compare")
    ap.add_argument("--file", required=True, help="source file, relative to the repository")
    ap.add_argument("--function", required=True, help="regular expression on mangled names")
    ap.add_argument("--mcpu", default="native", help="llvm-mca's -mcpu (e.g. znver3, sapphirerapids)")
    ap.add_argument("--march", default="native", help="the compiler's -march")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--show", action="store_true", help="print each loop's instruction mix")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        table = {}
        for rev in a.rev:
            loops = largest_loops(compile_rev(rev, a.file, a.march, tmp))
            for name, ins in loops.items():
                if re.search(a.function, name):
                    table.setdefault(name, {})[rev] = (len(ins), mca(ins, a.mcpu, a.iterations, tmp), ins)
        if not table:
            sys.exit(f"mca_loops: no function in {a.file} matches '{a.function}'")
        for name in sorted(table):
            print(name)
            for rev in a.rev:
                if rev not in table[name]:
                    print(f"  {rev:>12}: (absent)")
                    continue
                n, cycles, ins = table[name][rev]
                print(f"  {rev:>12}: {n:4d} instructions, {cycles / a.iterations:7.1f} cycles an iteration")
                if a.show:
                    mix = {}
                    for x in ins:
                        op = x.split()[0]
                        mix[op] = mix.get(op, 0) + 1
                    print("      " + " ".join(f"{k}:{v}" for k, v in sorted(mix.items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    main()
