#!/usr/bin/env python3
"""sass_diff.py -- compares the SASS of flashcore's kernels between a git revision and
the working tree, without a GPU.

    python scripts/sass_diff.py --ref 74b0e18                      # every csrc/sm90/*.cu, sm_90a
    python scripts/sass_diff.py --ref HEAD~1 csrc/sm80/attn_fwd_sm80_d128.cu --arch sm_80
    python scripts/sass_diff.py --ref HEAD~1 --show 20             # print the first 20 differing blocks
    python scripts/sass_diff.py --ref 74b0e18 --rename 'Lb0E='     # kernel gained a template argument
    python scripts/sass_diff.py --ref HEAD --rename-both 'v8Sm90Args.*=v'  # a parameter's type changed

For each file, both versions are compiled to a cubin with nvcc (same flags) and
disassembled with nvdisasm. Per kernel it prints the instruction counts and whether the
code is identical once labels and internal helper names are normalized; otherwise the
difflib similarity of the instruction sequences and of the opcode sequences alone.
Identical SASS with an identical launch means identical performance, so this is how a
refactor that should not change a kernel is checked, and how a performance change is
traced to the code ptxas emitted (perf notes, "D = 64 regression").

nvdisasm ships with the CUDA toolkit; where it is missing, `pip install nvidia-cuda-nvdisasm`
provides one, which this script finds in site-packages. Exit status: 0, or 1 with
--fail-on-diff when any kernel differs.
"""
import argparse
import difflib
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC_FLAGS = ["-O3", "-std=c++17", "-Icsrc", "-DFC_HAVE_SM90"]


def find_nvdisasm():
    exe = shutil.which("nvdisasm")
    if exe:
        return exe
    nvcc = shutil.which("nvcc")
    if nvcc and os.path.exists(os.path.join(os.path.dirname(nvcc), "nvdisasm")):
        return os.path.join(os.path.dirname(nvcc), "nvdisasm")
    for base in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        hits = glob.glob(os.path.join(base, "nvidia", "*", "bin", "nvdisasm"))
        if hits:
            return hits[0]
    return None


def export_tree(rev, dest):
    """Writes csrc/ of `rev` under dest."""
    data = subprocess.run(["git", "archive", rev, "csrc"], cwd=ROOT, check=True, capture_output=True).stdout
    tmp = os.path.join(dest, "csrc.tar")
    with open(tmp, "wb") as f:
        f.write(data)
    with tarfile.open(tmp) as t:
        t.extractall(dest)


def disassemble(tree, src, arch, nvdisasm, out_dir, tag):
    """Kernel name -> list of instructions of `src` compiled in `tree`."""
    cubin = os.path.join(out_dir, f"{tag}.cubin")
    subprocess.run(["nvcc", *NVCC_FLAGS, f"-arch={arch}", "-cubin", src, "-o", cubin], cwd=tree, check=True,
                   capture_output=True)
    sass = subprocess.run([nvdisasm, "-c", cubin], check=True, capture_output=True, text=True).stdout
    kernels, cur = {}, None
    for line in sass.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            cur = m.group(1)
            kernels[cur] = []
            continue
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if m and cur:
            kernels[cur].append(m.group(1))
    return kernels


def normalize(ins):
    """Drops what changes without changing the code: label numbers and symbol names."""
    ins = re.sub(r"\.L_x_\d+", ".L", ins)
    ins = re.sub(r"`\(([^)]*)\)", "`(sym)", ins)
    return ins


def opcode(ins):
    parts = ins.split()
    return parts[1] if parts[0].startswith("@") and len(parts) > 1 else parts[0]


def compare(name, ref, new, show):
    a, b = [normalize(x) for x in ref], [normalize(x) for x in new]
    if a == b:
        print(f"  {name}: {len(a)} instructions, identical")
        return True
    full = difflib.SequenceMatcher(None, a, b, autojunk=False)
    ops = difflib.SequenceMatcher(None, [opcode(x) for x in a], [opcode(x) for x in b], autojunk=False)
    blocks = [x for x in full.get_opcodes() if x[0] != "equal"]
    print(f"  {name}: {len(a)} -> {len(b)} instructions, similarity {full.ratio():.4f} "
          f"(opcodes {ops.ratio():.4f}), {len(blocks)} differing blocks")
    for tag, i1, i2, j1, j2 in blocks[:show]:
        print(f"    {tag} ref[{i1}:{i2}] new[{j1}:{j2}]: {a[i1:i2][:3]} -> {b[j1:j2][:3]}")
    return False


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", required=True, help="git revision to compare the working tree against")
    ap.add_argument("--arch", default="sm_90a", help="nvcc -arch for both builds (default sm_90a)")
    ap.add_argument("--show", type=int, default=0, help="print this many differing blocks per kernel")
    ap.add_argument("--rename", default=None, metavar="REGEX=REPL",
                    help="rewrite working-tree kernel names before pairing them with the reference's")
    ap.add_argument("--rename-both", default=None, metavar="REGEX=REPL",
                    help="rewrite the kernel names of both versions before pairing them")
    ap.add_argument("--fail-on-diff", action="store_true", help="exit 1 when any kernel differs")
    ap.add_argument("files", nargs="*", help="kernel .cu files (default csrc/sm90/attn_fwd_sm90_d*.cu)")
    args = ap.parse_args(argv)

    nvdisasm = find_nvdisasm()
    if not nvdisasm:
        print("sass_diff: nvdisasm not found; install the CUDA toolkit's, or pip install nvidia-cuda-nvdisasm",
              file=sys.stderr)
        return 2
    files = args.files or sorted(os.path.relpath(f, ROOT) for f in glob.glob(os.path.join(ROOT, "csrc/sm90/attn_fwd_sm90_d*.cu")))
    all_same = True
    with tempfile.TemporaryDirectory() as tmp:
        ref_tree = os.path.join(tmp, "ref")
        os.makedirs(ref_tree)
        export_tree(args.ref, ref_tree)
        for f in files:
            print(f"{f} ({args.arch}), {args.ref} -> working tree")
            if not os.path.exists(os.path.join(ref_tree, f)):
                print("  not in the reference revision")
                all_same = False
                continue
            ref = disassemble(ref_tree, f, args.arch, nvdisasm, tmp, "ref")
            new = disassemble(ROOT, f, args.arch, nvdisasm, tmp, "new")
            if args.rename:
                pat, _, repl = args.rename.partition("=")
                new = {re.sub(pat, repl, k): v for k, v in new.items()}
            if args.rename_both:
                pat, _, repl = args.rename_both.partition("=")
                ref = {re.sub(pat, repl, k): v for k, v in ref.items()}
                new = {re.sub(pat, repl, k): v for k, v in new.items()}
            for name in sorted(set(ref) | set(new)):
                if name not in ref or name not in new:
                    print(f"  {name}: only in {'the working tree' if name in new else args.ref}")
                    all_same = False
                    continue
                all_same &= compare(name, ref[name], new[name], args.show)
    return 1 if args.fail_on_diff and not all_same else 0


if __name__ == "__main__":
    sys.exit(main())
