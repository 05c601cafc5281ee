#!/usr/bin/env python3
"""Register, spill and shared-memory report for every CUDA kernel, from ptxas -v.

    python scripts/ptxas_report.py                 # compile csrc/**/*.cu with nvcc and report
    python scripts/ptxas_report.py --jobs 8        # compile files in parallel
    python scripts/ptxas_report.py --log build.log # parse an existing log (e.g. pip install -v)

Each csrc/**/*.cu file is compiled on its own with

    nvcc -c -O3 -std=c++17 -Icsrc -Xptxas -v <gencodes> -o /dev/null FILE

where the gencodes are sm_80 and sm_90a, or sm_90a alone for files under
csrc/sm90/ (wgmma and TMA need the 'a' target); csrc/tools/ (the standalone
harness) is skipped. ptxas writes its -v lines to stderr, which is parsed:

    ptxas info    : Compiling entry function '_Z...' for 'sm_80'
    ptxas info    : Function properties for _Z...
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem, 376 bytes cmem[0]

Names are demangled with c++filt when it is on PATH. Exit status: 0 when no
function uses local memory, 1 when any has spill stores/loads or a stack frame
(local memory, which a tuned kernel should never touch) or when ptxas reports
any C75xx wgmma/setmaxnreg diagnostic (serialized wgmma, an injected
warpgroup.wait or warpgroup.arrive, an ignored setmaxnreg), 2 when a compile
fails or nothing could be parsed.
"""
import argparse
import concurrent.futures
import os
import re
import shlex
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GENCODE_SM80 = "-gencode=arch=compute_80,code=sm_80"
GENCODE_SM90A = "-gencode=arch=compute_90a,code=sm_90a"
BASE_FLAGS = ["-c", "-O3", "-std=c++17", "-Icsrc", "-Xptxas", "-v"]

RE_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
RE_PROPS = re.compile(r"Function properties for (\S+)")
RE_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
RE_USED = re.compile(r"Used (\d+) registers")
RE_SMEM = re.compile(r"(\d+) bytes smem")
RE_WARN = re.compile(r"ptxas (?:warning|error)\s*:.*")
# ptxas undoing a wgmma pipeline or a register split, each a silent loss on the
# Hopper kernel (20-30 % when serialized). Seen with nvcc 13.0: "(C7514)
# Potential Performance Loss: wgmma.mma_async instructions are serialized due
# to non wgmma instructions reading accumulator registers ...", C7515 (...
# defining accumulator registers ...), C7518 (... due to program dependence),
# C7517 / C7519 (warpgroup.wait / warpgroup.arrive injected); C7508 (setmaxnreg
# ignored) is documented but not yet seen here. Every C75xx line fails the report.
RE_C75 = re.compile(r"\(C75\d\d\).*")
RE_CU_ARG = re.compile(r"(\S+\.cu)\b")


class Func:
    """One function as compiled for one arch; entry=False for a called device function."""

    def __init__(self, name, arch, src, entry):
        self.name, self.arch, self.src, self.entry = name, arch, src, entry
        self.regs = None
        self.stack = self.spill_st = self.spill_ld = 0
        self.smem = 0

    @property
    def local_mem(self):
        return self.stack > 0 or self.spill_st > 0 or self.spill_ld > 0


def parse(text, src="?", root_dir=None):
    """Parses ptxas -v output into Func records (in order of appearance), warnings
    and C75xx diagnostics.

    `src` names the compiled file; in a build log a line that invokes nvcc on
    a .cu file switches it (ninja prints each command before its output).
    """
    funcs, warnings, c75 = [], [], []
    entry = None      # the entry function whose "Used ..." line comes next
    props = None      # the function whose "N bytes stack frame" line comes next
    arch = "?"
    for line in text.splitlines():
        if "nvcc" in line and ".cu" in line and "ptxas info" not in line:
            m = RE_CU_ARG.findall(line)
            if m:
                src = m[-1]
                for root in (root_dir, REPO):  # show repo-relative paths where possible
                    if root and src.startswith(root.rstrip(os.sep) + os.sep):
                        src = os.path.relpath(src, root)
                        break
            continue
        m = RE_ENTRY.search(line)
        if m:
            arch = m.group(2)
            entry = Func(m.group(1), arch, src, True)
            funcs.append(entry)
            props = None
            continue
        m = RE_PROPS.search(line)
        if m:
            name = m.group(1)
            if entry is not None and entry.name == name and entry.arch == arch:
                props = entry
            else:  # a non-inlined device function (or ABI callee) of this module
                props = Func(name, arch, src, False)
                funcs.append(props)
            continue
        m = RE_FRAME.search(line)
        if m and props is not None:
            props.stack, props.spill_st, props.spill_ld = (int(x) for x in m.groups())
            props = None
            continue
        m = RE_USED.search(line)
        if m and entry is not None:
            entry.regs = int(m.group(1))
            sm = RE_SMEM.search(line)
            entry.smem = int(sm.group(1)) if sm else 0
            entry = None
            continue
        m = RE_C75.search(line)
        if m:
            c75.append(f"{src}: {m.group(0).strip()}")
            continue
        m = RE_WARN.search(line)
        if m:
            warnings.append(f"{src}: {m.group(0).strip()}")
    return funcs, warnings, c75


def demangle(names):
    """Maps mangled names to readable ones with one c++filt call (identity if absent)."""
    names = sorted(set(names))
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if not tool or not names:
        return {n: n for n in names}
    try:
        r = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True,
                           text=True, timeout=60)
        out = r.stdout.splitlines()
        if r.returncode == 0 and len(out) == len(names):
            return dict(zip(names, out))
    except (OSError, subprocess.SubprocessError):
        pass
    return {n: n for n in names}


def short_name(pretty):
    """'void ns::k<128, true>(Params)' -> 'ns::k<128, true>' (drops return type and arguments)."""
    s = pretty
    if s.endswith(")"):
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                s = s[:i]
                break
    depth, cut = 0, 0
    for i, c in enumerate(s):  # drop a return type: the last top-level space
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == " " and depth == 0:
            cut = i + 1
    return s[cut:] or pretty


def find_sources(root):
    srcs = []
    csrc = os.path.join(root, "csrc")
    for d, subdirs, files in os.walk(csrc):
        rel = os.path.relpath(d, root)
        subdirs[:] = sorted(x for x in subdirs if os.path.join(rel, x) != os.path.join("csrc", "tools"))
        srcs += [os.path.join(rel, f) for f in sorted(files) if f.endswith(".cu")]
    return srcs


def gencodes_for(src):
    parts = src.replace(os.sep, "/").split("/")
    return [GENCODE_SM90A] if "sm90" in parts[:-1] else [GENCODE_SM80, GENCODE_SM90A]


def compile_one(nvcc, root, src, extra):
    cmd = [nvcc] + BASE_FLAGS + gencodes_for(src) + extra + ["-o", os.devnull, src]
    r = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    # ptxas -v writes to stderr; keep stdout too in case a wrapper moves it.
    return src, cmd, r.returncode, r.stdout + r.stderr


def render(funcs, full_names):
    pretty = demangle(f.name for f in funcs)
    head = ("kernel", "arch", "regs", "spill st", "spill ld", "stack", "smem", "file")
    rows = []
    for f in funcs:
        name = pretty[f.name] if full_names else short_name(pretty[f.name])
        if not f.entry:
            name = "(device fn) " + name
        rows.append((name, f.arch.replace("sm_", ""), "-" if f.regs is None else str(f.regs),
                     str(f.spill_st), str(f.spill_ld), str(f.stack), str(f.smem), f.src,
                     f.local_mem))
    rows.sort(key=lambda r: (r[7], r[0], r[1]))
    w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    fmt_l = {0, 1, 7}

    def line(cells, flag=""):
        return " ".join(c.ljust(w[i]) if i in fmt_l else c.rjust(w[i])
                        for i, c in enumerate(cells)).rstrip() + flag

    out = [line(head), line(["-" * x for x in w])]
    out += [line(r[:8], "   <-- local memory" if r[8] else "") for r in rows]
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=None)
    p.add_argument("--log", help="parse this ptxas -v log instead of compiling")
    p.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1,
                   help="files compiled in parallel (default: CPU count)")
    p.add_argument("--root", default=REPO, help="repository root holding csrc/ (default: this repo)")
    p.add_argument("--nvcc", default=os.environ.get("NVCC") or shutil.which("nvcc")
                   or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"),
                   help="nvcc to run (default $NVCC, nvcc on PATH, or $CUDA_HOME/bin/nvcc)")
    p.add_argument("--extra", default="", help="extra nvcc flags, one string (e.g. '-DNDEBUG -lineinfo')")
    p.add_argument("--full-names", action="store_true", help="print demangled names with arguments")
    p.add_argument("files", nargs="*", help="compile only these .cu files (relative to --root)")
    args = p.parse_args(argv)

    funcs, warnings, c75, failed = [], [], [], []
    if args.log:
        with open(args.log, errors="replace") as f:
            funcs, warnings, c75 = parse(f.read(), src=os.path.basename(args.log),
                                root_dir=os.path.abspath(args.root))
    else:
        if not (os.path.isfile(args.nvcc) or shutil.which(args.nvcc)):
            print(f"nvcc not found at {args.nvcc!r}; pass --nvcc or set CUDA_HOME", file=sys.stderr)
            return 2
        srcs = args.files or find_sources(args.root)
        if not srcs:
            print(f"no .cu files under {os.path.join(args.root, 'csrc')}", file=sys.stderr)
            return 2
        extra = shlex.split(args.extra)
        jobs = max(1, min(args.jobs, len(srcs)))
        print(f"compiling {len(srcs)} file(s) with {jobs} job(s): {' '.join(srcs)}", flush=True)
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
            results = list(ex.map(lambda s: compile_one(args.nvcc, args.root, s, extra), srcs))
        for src, cmd, rc, text in results:
            if rc != 0:
                failed.append(src)
                print(f"\nFAILED ({rc}): {' '.join(shlex.quote(c) for c in cmd)}\n{text.rstrip()}",
                      file=sys.stderr)
                continue
            fs, ws, cs = parse(text, src=src)
            funcs += fs
            warnings += ws
            c75 += cs

    if not funcs:
        print("no ptxas -v function records found" + (" (see failures above)" if failed else ""),
              file=sys.stderr)
        return 2
    print(render(funcs, args.full_names))
    for w in warnings:
        print(w)
    bad = [f for f in funcs if f.local_mem]
    entries = sum(f.entry for f in funcs)
    print(f"\n{entries} kernel(s) across {len({f.arch for f in funcs})} arch(es); "
          f"{len(bad)} function(s) use local memory (spills or stack frame)"
          + (f"; {len(failed)} file(s) failed to compile: {' '.join(failed)}" if failed else ""))
    if failed:
        return 2
    for w in c75:
        print("wgmma/setmaxnreg diagnostic:", w)
    return 1 if bad or c75 else 0


if __name__ == "__main__":
    sys.exit(main())
