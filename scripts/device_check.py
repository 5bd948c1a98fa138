#!/usr/bin/env python3
"""The device check: every GPU figure of packpipe in one run on a lent GPU machine (DEVICE.md).

    scripts/device-check.sh [--dry-run] [--out DIR] [--build-dir DIR] [--budget S] [--steps a,b,...]

Steps, in order (each timed out, each recorded whatever happens, the next one runs regardless):

  environment    GPU, driver, CUDA, NCCL, torch, Python, compiler and CMake versions
  build          packpipe with CUDA (sm_90) and NCCL against the carried Debian packages (.device/),
                 Release, only the CLI, the Python module and the GPU test executable
  gpu_tests      ctest -L gpu: CUDA replay of 4- and 8-stage plans, the one-rank NCCL self send/receive
  plans          packpipe plan on the embedded demo data: 4 and 8 stages, and a one-rank plan
  replay_cuda    packpipe run --replay --transport cuda on the demo plans: measured / simulated and the
                 executor's overhead per instruction, at several time scales
  nccl_replay    packpipe run --replay --transport nccl, one rank
  torch          scripts/device_check_torch.py: the small GPT on the GPU against the CPU (gradients),
                 packpipe's plans against the baseline methods (throughput), measured op times
  profile        packpipe profile on the GPU for a GPT-1.3B-wide layer grid: time, leave-one-out error
  calibration    the torch GPT's layers profiled; costmodel validate --measured of the analytic, the
                 profiled and the calibrated (costmodel calibrate) model on the GPU's iterations
  replay_threads the same replays on threads, for comparison

The run keeps its own budget (--budget, 450 s by default: under 8 minutes with the report): a step
gets at most what is left, and a step that cannot get its minimum is skipped and recorded as such.
$OUT (or --out) receives device-report.json, device-report.md, device-console.log and
device-logs.tar.gz (every step's log and the files the steps made), rewritten after every step so that
a run stopped from outside still leaves its report.

--dry-run runs the same steps on the CPU (the torch and profile steps with device cpu, the replay on
threads, small sizes); the steps that need CUDA are recorded as "skipped: needs CUDA". make test runs it
(tests/device/test_dry_run.py).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORT_FORMAT = "packpipe-device-report"
REPORT_VERSION = 1
REPORT_FILES = ("device-report.json", "device-report.md", "device-console.log", "device-logs.tar.gz")
SKIP_CUDA = "skipped: needs CUDA"

# The small GPT the torch and calibration steps train and profile, per mode.
TORCH_MODEL = {
    "device": {"hidden": 1024, "layers": 8, "heads": 16, "vocab": 8192, "dtype": "bf16"},
    "dry": {"hidden": 32, "layers": 2, "heads": 2, "vocab": 128, "dtype": "fp32"},
}
# Everything else each step does, per mode (the dry run: small enough for make test on 2 cores).
SIZES: Dict[str, Dict[str, Any]] = {
    "device": {
        "plan_stages": (4, 8), "plan_iterations": 8,
        # (time scale, iterations): real durations, then shorter ops, then no waiting (executor overhead).
        "replay": ((1.0, 2), (0.1, 4), (0.01, 8), (0.0, 8)),
        "torch": ["--workload", "demo", "--tokens", "16384", "--iterations", "4", "--rounds", "3",
                  "--grid", "2,4,8", "--token-grid", "2048,4096,8192", "--grad-configs", "2:1f1b,4:zero-bubble",
                  "--measure-iterations", "8"],
        "profile": ["--model", "gpt", "--hidden", "2048", "--heads", "16", "--vocab", "50257", "--layers", "24",
                    "--mbs", "1,2,4,8", "--seq", "128,256,512,1024,2048", "--recompute", "none,selective,full",
                    "--repeats", "5", "--warmup", "2", "--device", "cuda", "--dtype", "bf16"],
        "calibration_profile": ["--recompute", "none", "--repeats", "5", "--warmup", "2", "--device", "cuda"],
        "calibration_grid": {"min_seq": 16, "split_seq": 256, "long_mbs": 8},
    },
    "dry": {
        "plan_stages": (4, 8), "plan_iterations": 2,
        "replay": ((0.01, 2), (0.0, 2)),
        "torch": ["--workload", "short", "--tokens", "1024", "--iterations", "2", "--rounds", "1",
                  "--grid", "2,4", "--token-grid", "512", "--grad-configs", "2:1f1b,4:zero-bubble",
                  "--measure-iterations", "4", "--threads", "1"],
        "profile": ["--model", "gpt", "--hidden", "32", "--heads", "2", "--vocab", "128", "--layers", "2",
                    "--mbs", "1,2", "--seq", "32,64,128", "--recompute", "none,full", "--repeats", "2",
                    "--warmup", "1", "--device", "cpu", "--dtype", "fp32", "--threads", "1"],
        "calibration_profile": ["--recompute", "none", "--repeats", "2", "--warmup", "1", "--device", "cpu",
                                "--threads", "1"],
        "calibration_grid": {"min_seq": 16, "split_seq": 32, "long_mbs": 2},
    },
}
BUILD_TARGETS = ("packpipe_cli", "_core", "packpipe_tests_gpu")


class StepFailed(Exception):
    """A step's check failed; figures gathered so far go with it."""

    def __init__(self, message: str, figures: Optional[Dict[str, Any]] = None):
        super().__init__(message)
        self.figures = figures or {}


class StepTimeout(StepFailed):
    pass


class Step:
    def __init__(self, name: str, title: str, fn: Callable, timeout_s: float, min_s: float,
                 needs_cuda: bool = False, requires: Tuple[str, ...] = ()):
        self.name, self.title, self.fn = name, title, fn
        self.timeout_s, self.min_s = timeout_s, min_s
        self.needs_cuda, self.requires = needs_cuda, requires
        self.deadline = 0.0
        self.log = ""
        self.figures: Dict[str, Any] = {}  # what the step has found so far (kept when it fails)


class Context:
    def __init__(self, a):
        self.dry = a.dry_run
        self.mode = "dry" if self.dry else "device"
        self.python = a.python
        self.build = os.path.abspath(a.build_dir)
        self.out = os.path.abspath(a.out)
        self.budget = a.budget
        self.jobs = a.jobs or os.cpu_count() or 2
        self.cuda_arch = a.cuda_arch
        self.timeout_scale = a.timeout_scale
        self.work = tempfile.mkdtemp(prefix="packpipe-device-check-")
        self.logs = os.path.join(self.work, "logs")
        self.art = os.path.join(self.work, "artifacts")
        os.makedirs(self.logs)
        os.makedirs(self.art)
        self.t0 = time.monotonic()
        self.artifacts: Dict[str, str] = {}  # what later steps need: name -> path or value
        self.env = dict(os.environ)
        for k in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):  # a make test parent's jobserver is not ours
            self.env.pop(k, None)
        self.env["PYTHONPATH"] = os.path.join(self.build, "python") + (
            ":" + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
        self.env["PYTHONUNBUFFERED"] = "1"
        self.report: Dict[str, Any] = {}
        self.console = open(os.path.join(self.out, "device-console.log"), "w")

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def say(self, text: str) -> None:
        line = f"[device-check {self.elapsed():6.1f} s] {text}"
        print(line, flush=True)
        self.console.write(line + "\n")
        self.console.flush()

    def size(self, key: str):
        return SIZES[self.mode][key]

    def cli(self) -> str:
        return self.artifacts["cli"]


# ---- running commands ------------------------------------------------------------------------------

def run(ctx: Context, step: Step, argv: List[str], *, capture: bool = False, cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None, timeout_s: Optional[float] = None) -> Tuple[int, str]:
    """Runs argv with its output appended to the step's log (stdout returned instead when `capture`),
    within the step's deadline (and timeout_s); a command past it is killed with its process group
    and StepTimeout raised. Returns (exit status, captured stdout)."""
    limit = step.deadline - time.monotonic()
    if timeout_s is not None:
        limit = min(limit, timeout_s)
    if limit <= 1:
        raise StepTimeout(f"no time left for {os.path.basename(argv[0])} (the step's limit is reached)")
    with open(step.log, "a") as log:
        log.write(f"$ {' '.join(shlex.quote(x) for x in argv)}\n")
        log.flush()
        try:
            p = subprocess.Popen(argv, cwd=cwd or ROOT, env=env or ctx.env, stdout=subprocess.PIPE if capture else log,
                                 stderr=log, stdin=subprocess.DEVNULL, text=True, errors="replace",
                                 start_new_session=True)
        except OSError as e:
            raise StepFailed(f"could not start {argv[0]}: {e}") from None
        try:
            out, _ = p.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            _kill_group(p)
            log.write(f"\n[device-check] killed after {limit:.0f} s\n")
            raise StepTimeout(f"{os.path.basename(argv[0])} ran past {limit:.0f} s and was stopped") from None
        if capture:
            log.write(out if len(out) < 200000 else out[:200000] + "\n[... cut]\n")
        log.write(f"[exit {p.returncode}]\n")
    return p.returncode, out or ""


def _kill_group(p: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            break
        try:
            p.communicate(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def check(rc: int, what: str, step: Step) -> None:
    if rc != 0:
        raise StepFailed(f"{what} exited with status {rc}{last_error(step)} (logs/{os.path.basename(step.log)})")


def last_error(step: Step) -> str:
    """': <the last line of the step's log that says error>' (the failed command's own message), or ''."""
    try:
        with open(step.log, errors="replace") as f:
            lines = f.read().splitlines()[-400:]
    except OSError:
        return ""
    for ln in reversed(lines):
        if re.search(r"error|Error|ERROR|Traceback|not found|refuse", ln) and not ln.startswith("$ "):
            ln = ln.strip()
            return ": " + (ln if len(ln) <= 300 else ln[:300] + " ...")
    return ""


def run_json(ctx: Context, step: Step, argv: List[str], what: str, **kw) -> Dict[str, Any]:
    """Runs a command that prints one JSON object; its object, or StepFailed naming it."""
    rc, out = run(ctx, step, argv, capture=True, **kw)
    check(rc, what, step)
    try:
        return json.loads(out)
    except ValueError as e:
        raise StepFailed(f"{what} printed no JSON object ({e})") from None


def probe(argv: List[str], timeout_s: float = 20) -> Optional[str]:
    """stdout of a short command, or None when it is missing or fails."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def tool(ctx: "Context", name: str) -> str:
    """A build tool on PATH, else beside the interpreter (a virtual environment's cmake, ctest, ninja)."""
    here = os.path.join(os.path.dirname(ctx.python), name)
    return shutil.which(name) or (here if os.access(here, os.X_OK) else name)


def first_line(text: Optional[str]) -> Optional[str]:
    return text.splitlines()[0].strip() if text else None


# ---- steps ------------------------------------------------------------------------------------------

ENV_PROBE = r"""
import json, platform, sys
out = {"python": sys.version.split()[0], "executable": sys.executable, "platform": platform.platform()}
try:
    import numpy
    out["numpy"] = numpy.__version__
except Exception as e:
    out["numpy"] = f"missing ({e})"
try:
    import pybind11
    out["pybind11"] = pybind11.__version__
except Exception:
    out["pybind11"] = None
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out["device_name"] = p.name
        out["capability"] = f"{p.major}.{p.minor}"
        out["multiprocessors"] = p.multi_processor_count
        out["memory_gib"] = round(p.total_memory / 2**30, 1)
        try:
            v = torch.cuda.nccl.version()
            out["torch_nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as e:
            out["torch_nccl"] = f"unknown ({e})"
except Exception as e:
    out["torch"] = f"missing ({e})"
print(json.dumps(out))
"""


def step_environment(ctx: Context, step: Step):
    env: Dict[str, Any] = {"mode": ctx.mode, "cores": os.cpu_count(), "kernel": os.uname().release}
    try:
        with open("/proc/meminfo") as f:
            env["memory_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    smi = probe(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm",
                 "--format=csv,noheader"])
    if smi:
        f = [x.strip() for x in smi.splitlines()[0].split(",")]
        env["gpu"] = dict(zip(("name", "driver", "memory", "compute_capability", "max_sm_clock"), f))
        env["gpus"] = len(smi.splitlines())
    nvcc = find_nvcc()
    env["nvcc"] = nvcc
    if nvcc:
        v = probe([nvcc, "--version"])
        m = re.search(r"release ([\d.]+), V([\d.]+)", v or "")
        env["cuda_toolkit"] = m.group(2) if m else None
    env["cxx"] = first_line(probe(["c++", "--version"]))
    env["cmake"] = first_line(probe([tool(ctx, "cmake"), "--version"]))
    env["ninja"] = probe([tool(ctx, "ninja"), "--version"])
    env["dpkg"] = shutil.which("dpkg")
    env["pkg_config"] = shutil.which("pkg-config") or shutil.which("pkgconf")
    inc, lib, ver = find_nccl(ctx)
    env["nccl"] = {"include": inc, "library": lib, "version": ver}
    rc, out = run(ctx, step, [ctx.python, "-c", ENV_PROBE], capture=True, timeout_s=90)
    check(rc, "the Python probe", step)
    env.update({k: v for k, v in json.loads(out).items()})
    ctx.report["environment"] = env
    gpu = env.get("gpu", {}).get("name") or env.get("device_name")
    summary = (f"{gpu or 'no GPU'}; driver {env.get('gpu', {}).get('driver', '-')}; "
               f"CUDA {env.get('cuda_toolkit') or '-'}"
               f"; NCCL {ver or '-'}; torch {env.get('torch')}; Python {env.get('python')}; {env['cores']} cores")
    if not ctx.dry and not env.get("cuda_available"):
        raise StepFailed(f"no CUDA device visible to torch ({summary})", {"summary": summary})
    return {"summary": summary}


def find_nvcc() -> Optional[str]:
    return shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.access(p, os.X_OK)), None)


def find_nccl(ctx: Context) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """(include dir, library, version) of NCCL: $NCCL_HOME, the nvidia-nccl wheel beside the
    interpreter's torch (the NCCL torch itself loads), the CUDA toolkit, the system."""
    bases: List[str] = []
    if os.environ.get("NCCL_HOME"):
        bases.append(os.environ["NCCL_HOME"])
    wheel = probe([ctx.python, "-c", "import nvidia, sys; sys.stdout.write('\\n'.join(nvidia.__path__))"])
    for top in (wheel or "").splitlines():
        for dirpath, dirnames, filenames in os.walk(top):
            if dirpath[len(top):].count(os.sep) > 3:
                dirnames[:] = []
            elif "nccl.h" in filenames:
                bases.append(os.path.dirname(dirpath))
    nvcc = find_nvcc()
    if nvcc:
        cuda = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        bases += [cuda, os.path.join(cuda, "targets", "x86_64-linux")]
    bases += ["/usr", "/usr/local"]
    for base in bases:
        inc = os.path.join(base, "include")
        if not os.path.isfile(os.path.join(inc, "nccl.h")):
            continue
        libs = []
        for d in ("lib", "lib64", "lib/x86_64-linux-gnu"):
            for name in ("libnccl.so", "libnccl.so.2"):
                if os.path.exists(os.path.join(base, d, name)):
                    libs.append(os.path.join(base, d, name))
        if libs:
            return inc, libs[0], nccl_header_version(os.path.join(inc, "nccl.h"))
    return None, None, None


def nccl_header_version(header: str) -> Optional[str]:
    try:
        with open(header, errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    parts = [re.search(rf"#define NCCL_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else None


def unpack_prefix(ctx: Context, step: Step) -> Optional[str]:
    """The carried Debian packages (.device/debs, scripts/gpu-prefix.sh download) unpacked into
    .device/prefix (dpkg -x keeps the packages' times: an unchanged prefix rebuilds nothing)."""
    debs_dir = os.path.join(ROOT, ".device", "debs")
    debs = sorted(f for f in os.listdir(debs_dir) if f.endswith(".deb")) if os.path.isdir(debs_dir) else []
    if not debs:
        return None
    prefix = os.path.join(ROOT, ".device", "prefix")
    stamp = os.path.join(prefix, ".unpacked")
    want = "\n".join(debs)
    if not (os.path.isfile(stamp) and open(stamp).read() == want):
        os.makedirs(prefix, exist_ok=True)
        for d in debs:
            if shutil.which("dpkg"):
                rc, _ = run(ctx, step, ["dpkg", "-x", os.path.join(debs_dir, d), prefix], timeout_s=60)
                check(rc, f"dpkg -x {d}", step)
            else:
                unpack_deb(os.path.join(debs_dir, d), prefix)
        with open(stamp, "w") as f:
            f.write(want)
    return prefix


def unpack_deb(deb: str, prefix: str) -> None:
    """dpkg -x without dpkg: a .deb is an ar archive whose data.tar.* member holds the files (times,
    modes and links kept, as dpkg -x keeps them)."""
    import io
    with open(deb, "rb") as f:
        blob = f.read()
    if blob[:8] != b"!<arch>\n":
        raise StepFailed(f"{deb}: not a Debian package (no ar header)")
    pos = 8
    while pos + 60 <= len(blob):
        name = blob[pos:pos + 16].decode().strip().rstrip("/")
        size = int(blob[pos + 48:pos + 58].decode().strip())
        data = blob[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
        if name.startswith("data.tar"):
            try:
                tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
            except tarfile.TarError as e:
                raise StepFailed(f"{deb}: cannot read {name} without dpkg ({e})") from None
            with tar:
                kw = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
                tar.extractall(prefix, **kw)
            return
    raise StepFailed(f"{deb}: no data.tar member")


def configure_args(ctx: Context, step: Step, prefix: Optional[str],
                   figures: Dict[str, Any]) -> Tuple[List[str], Dict[str, str]]:
    """The cmake configure command of the device build, and its environment."""
    args = [tool(ctx, "cmake"), "-S", ROOT, "-B", ctx.build, "-DCMAKE_BUILD_TYPE=Release",
            f"-DPACKPIPE_PYTHON_EXECUTABLE={ctx.python}", "-DPACKPIPE_BUILD_BENCHMARKS=OFF",
            "-DPACKPIPE_BUILD_FUZZERS=OFF", "-DPACKPIPE_SANITIZE=", "-DCMAKE_POLICY_VERSION_MINIMUM=3.5"]
    env = dict(ctx.env)
    ninja = tool(ctx, "ninja")
    if os.access(ninja, os.X_OK) or shutil.which(ninja):
        args += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={shutil.which(ninja) or ninja}"]
    nvcc = find_nvcc()
    if nvcc:
        args += ["-DPACKPIPE_WITH_CUDA=ON", f"-DCMAKE_CUDA_COMPILER={nvcc}",
                 f"-DCMAKE_CUDA_ARCHITECTURES={ctx.cuda_arch}"]
    else:
        args += ["-DPACKPIPE_WITH_CUDA=AUTO"]
        figures["problems"].append("nvcc not found: built without CUDA")
    inc, lib, ver = find_nccl(ctx)
    if nvcc and inc:
        args += ["-DPACKPIPE_WITH_NCCL=ON", f"-DNCCL_INCLUDE_DIR={inc}", f"-DNCCL_LIBRARY={lib}"]
        figures["nccl"] = {"include": inc, "library": lib, "version": ver}
    else:
        args += ["-DPACKPIPE_WITH_NCCL=AUTO"]
        figures["problems"].append("NCCL not found ($NCCL_HOME, the nvidia-nccl wheel, the CUDA toolkit): built "
                                   "without NCCL")
    pyb = probe([ctx.python, "-m", "pybind11", "--cmakedir"])
    if pyb:
        args.append(f"-Dpybind11_DIR={pyb}")
    if prefix:
        usr = os.path.join(prefix, "usr")
        args.append(f"-DCMAKE_PREFIX_PATH={usr}")
        libdir = os.path.join(usr, "lib", "x86_64-linux-gnu")
        env["LD_LIBRARY_PATH"] = libdir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        # xxhash comes through pkg-config: the carried pkgconf when the machine has none, the
        # carried .pc files either way, their /usr paths under the prefix.
        pkgconf = os.path.join(usr, "bin", "pkgconf")
        if not (shutil.which("pkg-config") or shutil.which("pkgconf")) and os.access(pkgconf, os.X_OK):
            args.append(f"-DPKG_CONFIG_EXECUTABLE={pkgconf}")
        env["PKG_CONFIG_LIBDIR"] = f"{libdir}/pkgconfig:{usr}/share/pkgconfig"
        env["PKG_CONFIG_SYSROOT_DIR"] = prefix
    return args, env


def configure(ctx: Context, step: Step, prefix: Optional[str], figures: Dict[str, Any]) -> Dict[str, str]:
    """Configures the build; when that fails for the Python module or for CUDA / NCCL, configures
    again without it (recorded as a problem), so that what does not need it still builds and runs.
    Returns the environment the build runs in."""
    args, env = configure_args(ctx, step, prefix, figures)
    dropped: List[str] = []
    while True:
        with open(step.log, "a") as log:
            start = log.tell()
        rc, _ = run(ctx, step, args + dropped, env=env, timeout_s=180 * ctx.timeout_scale)
        if rc == 0:
            return env
        with open(step.log, errors="replace") as log:
            log.seek(start)
            lines = log.read().splitlines()
        # What the errors say (each "CMake Error" and the lines after it), not what configure found.
        text = "\n".join("\n".join(lines[i:i + 8]) for i, ln in enumerate(lines) if "CMake Error" in ln)
        if "-DPACKPIPE_BUILD_PYTHON=OFF" not in dropped and re.search(r"[Pp]ython|pybind11", text):
            extra, what = ["-DPACKPIPE_BUILD_PYTHON=OFF"], "the Python module (the torch and profile steps need it)"
        elif "-DPACKPIPE_WITH_CUDA=OFF" not in dropped and re.search(r"CUDA|nvcc|NCCL", text):
            extra, what = ["-DPACKPIPE_WITH_CUDA=OFF", "-DPACKPIPE_WITH_NCCL=OFF"], "CUDA and NCCL"
        else:
            raise StepFailed(f"cmake (configure) exited with status {rc} (logs/{os.path.basename(step.log)})", figures)
        figures["problems"].append(f"configure failed with {what}: configured again without it")
        dropped += extra
        shutil.rmtree(os.path.join(ctx.build, "CMakeFiles"), ignore_errors=True)
        try:
            os.remove(os.path.join(ctx.build, "CMakeCache.txt"))
        except OSError:
            pass


def built(ctx: Context) -> Dict[str, Optional[str]]:
    """The build's files the later steps use (None: missing)."""
    core = [f for f in (os.listdir(os.path.join(ctx.build, "python", "packpipe"))
                        if os.path.isdir(os.path.join(ctx.build, "python", "packpipe")) else [])
            if f.startswith("_core") and f.endswith(".so")]
    files = {"cli": os.path.join(ctx.build, "packpipe"),
             "gpu_test_exe": os.path.join(ctx.build, "tests", "packpipe_tests_gpu")}
    out = {k: (v if os.access(v, os.X_OK) else None) for k, v in files.items()}
    out["core"] = os.path.join(ctx.build, "python", "packpipe", core[0]) if core else None
    return out


def build_config(ctx: Context) -> Dict[str, Any]:
    cfg: Dict[str, Any] = {}
    try:
        with open(os.path.join(ctx.build, "generated", "common", "config.h")) as f:
            text = f.read()
        for k in ("CUDA", "NCCL"):
            m = re.search(rf"#define PACKPIPE_HAS_{k} (\d)", text)
            cfg[k.lower()] = bool(int(m.group(1))) if m else None
    except OSError:
        pass
    try:
        with open(os.path.join(ctx.build, "CMakeCache.txt")) as f:
            for line in f:
                for key in ("CMAKE_GENERATOR:", "CMAKE_BUILD_TYPE:", "CMAKE_CUDA_ARCHITECTURES:", "pybind11_DIR:",
                            "CMAKE_CXX_COMPILER:", "NCCL_LIBRARY:", "CMAKE_PREFIX_PATH:", "PACKPIPE_BUILD_PYTHON:"):
                    if line.startswith(key):
                        cfg[key.rstrip(":")] = line.split("=", 1)[1].strip()
    except OSError:
        pass
    return cfg


def step_build(ctx: Context, step: Step):
    figures = step.figures
    figures.update(problems=[], targets=list(BUILD_TARGETS), jobs=ctx.jobs)
    # The carried packages, unpacked for a build that is configured here or was configured with them
    # (a tree configured against the system's packages, as the dry run's, needs none).
    configured = os.path.isfile(os.path.join(ctx.build, "CMakeCache.txt"))
    cached = build_config(ctx).get("CMAKE_PREFIX_PATH", "")
    prefix = unpack_prefix(ctx, step) if not configured or ".device/prefix" in cached else None
    env = dict(ctx.env)
    if prefix:
        libdir = os.path.join(prefix, "usr", "lib", "x86_64-linux-gnu")
        env["LD_LIBRARY_PATH"] = libdir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    t = time.monotonic()
    if not os.path.isfile(os.path.join(ctx.build, "CMakeCache.txt")):
        env = configure(ctx, step, prefix, figures)
        figures["configure_s"] = round(time.monotonic() - t, 1)
    else:
        figures["configure_s"] = 0.0
        figures["reused"] = ctx.build
    t = time.monotonic()
    cfg = build_config(ctx)
    targets = [x for x in BUILD_TARGETS if x != "_core" or cfg.get("PACKPIPE_BUILD_PYTHON", "ON") != "OFF"]
    figures["targets"] = targets
    keep_going = ["--", "-k", "0"] if cfg.get("CMAKE_GENERATOR") == "Ninja" else ["--", "-k"]
    rc, _ = run(ctx, step, [tool(ctx, "cmake"), "--build", ctx.build, "--target", *targets, "-j", str(ctx.jobs),
                            *keep_going], env=env)
    figures["build_s"] = round(time.monotonic() - t, 1)
    figures.update(build_config(ctx))
    figures["dependencies"] = ("carried (.device/prefix)" if ".device/prefix" in figures.get("CMAKE_PREFIX_PATH", "")
                               else "the system's")
    files = built(ctx)
    for k, v in files.items():
        if v:
            ctx.artifacts[k] = v
    ctx.artifacts["build_nccl"] = figures.get("nccl")
    missing = [k for k, v in files.items() if not v]
    if files["cli"]:
        ldd = probe(["ldd", files["cli"]]) or ""
        unresolved = [ln.split()[0] for ln in ldd.splitlines() if "not found" in ln]
        if unresolved:
            figures["problems"].append(f"the CLI's libraries not found: {', '.join(unresolved)}")
    if not ctx.dry:
        if not figures.get("cuda"):
            figures["problems"].append("the build has no CUDA")
        if not figures.get("nccl"):
            figures["problems"].append("the build has no NCCL")
    on = {True: "on"}
    figures["summary"] = (f"CUDA {on.get(figures.get('cuda'), 'off')}, NCCL {on.get(figures.get('nccl'), 'off')}; "
                          f"configure {figures['configure_s']} s, build {figures['build_s']} s (-j{ctx.jobs}); "
                          f"dependencies {figures['dependencies']}")
    if rc != 0 or missing:
        raise StepFailed(f"the build failed (exit {rc}; missing: {', '.join(missing) or 'nothing'})", figures)
    if figures["problems"]:
        raise StepFailed("; ".join(figures["problems"]), figures)
    return figures


REPLAY_LINE = re.compile(r"cuda replay (\S+) S=(\d+): measured ([\d.]+) ms, simulated ([\d.]+) ms \(([\d.]+)\), "
                         r"([\d.]+) us own per instruction")


def step_gpu_tests(ctx: Context, step: Step):
    limit = max(step.deadline - time.monotonic() - 5, 10)
    rc, out = run(ctx, step, [tool(ctx, "ctest"), "-L", "gpu", "-V", "--no-tests=error", "--timeout", str(int(limit))],
                  capture=True, cwd=ctx.build)
    replays = [{"schedule": m.group(1), "stages": int(m.group(2)), "measured_ms": float(m.group(3)),
                "simulated_ms": float(m.group(4)), "measured_over_simulated": float(m.group(5)),
                "own_us_per_instruction": float(m.group(6))} for m in REPLAY_LINE.finditer(out)]
    figures = step.figures
    figures["cuda_replays"] = replays
    m = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", out)
    if m:
        figures["ctest"] = {"passed_percent": int(m.group(1)), "failed": int(m.group(2)), "total": int(m.group(3))}
    # The NCCL case passes without sending when the build has no NCCL (it warns): say which.
    nccl = ctx.artifacts.get("build_nccl")
    figures["nccl_self_send_recv"] = ("not run: built without NCCL" if nccl is False else
                                      "passed" if rc == 0 else "see the log")
    m = re.search(r"All tests passed \((\d+) assertions? in (\d+) test cases?\)", out)
    if m:
        figures["catch"] = {"assertions": int(m.group(1)), "test_cases": int(m.group(2))}
    if replays:
        r = [x["measured_over_simulated"] for x in replays]
        o = [x["own_us_per_instruction"] for x in replays]
        figures["summary"] = (f"{len(replays)} CUDA replays, measured/simulated {min(r):.3f}-{max(r):.3f}, "
                              f"executor's own {min(o):.2f}-{max(o):.2f} us/instruction; NCCL self send/receive: "
                              f"{figures['nccl_self_send_recv']}")
    if "***Skipped" in out or "no CUDA device" in out:
        raise StepFailed("ctest skipped the GPU tests: the test saw no CUDA device", figures)
    check(rc, "ctest -L gpu", step)
    return figures


def step_plans(ctx: Context, step: Step):
    manifest = os.path.join(ROOT, "data", "demo", "manifest.json")
    figures = step.figures
    figures["plans"] = {}
    n = ctx.size("plan_iterations")
    specs = [(f"demo{s}", ["--stages", str(s), "--layers-per-stage", "4", "--global-batch-tokens", "65536",
                           "--iterations", str(n)]) for s in ctx.size("plan_stages")]
    specs.append(("demo1", ["--stages", "1", "--chunks", "2", "--layers-per-stage", "2", "--global-batch-tokens",
                            "16384", "--iterations", "2"]))
    for name, extra in specs:
        path = os.path.join(ctx.art, f"{name}.plan")
        t = time.monotonic()
        rep = run_json(ctx, step, [ctx.cli(), "plan", "--manifest", manifest, "--model", "gpt-6.7b", "--device",
                                   "A100-40GB", "--seed", "1234", "--no-baselines", "--out", path, "--json", *extra],
                       f"packpipe plan ({name})")
        its = rep.get("iterations", [])
        figures["plans"][name] = {
            "file": os.path.relpath(path, ctx.work), "iterations": len(its), "seconds": round(time.monotonic() - t, 2),
            "simulated_iteration_ms_median": (statistics.median(i["packpipe"]["iteration_ms"] for i in its)
                                              if its else None),
            "microbatches": [i["packpipe"]["microbatches"] for i in its],
            "schedules": sorted({i["packpipe"].get("schedule", "") for i in its})}
        ctx.artifacts[f"plan_{name}"] = path
    figures["summary"] = ", ".join(f"{k}: {v['iterations']} iterations, {v['simulated_iteration_ms_median']:.0f} ms "
                                   f"simulated" for k, v in figures["plans"].items())
    return figures


def replay(ctx: Context, step: Step, transport: str):
    figures = step.figures
    rows, errors = [], []
    figures.update(transport=transport, runs=rows)
    for s in ctx.size("plan_stages"):
        plan = ctx.artifacts[f"plan_demo{s}"]
        for scale, its in ctx.size("replay"):
            argv = [ctx.cli(), "run", plan, "--replay", "--transport", transport, "--time-scale", str(scale),
                    "--iterations", str(its), "--timeout", "120", "--json"]
            try:
                j = run_json(ctx, step, argv, f"packpipe run --transport {transport} (S={s}, scale {scale})")
            except StepTimeout:
                raise
            except StepFailed as e:
                errors.append(str(e))
                rows.append({"stages": s, "time_scale": scale, "error": str(e)})
                continue
            rows.append({"stages": s, "time_scale": scale, "iterations": j["iterations"],
                         "measured_ms": j["measured_ms"], "simulated_ms": j["simulated_ms"],
                         "measured_over_simulated": j["measured_over_simulated"],
                         "median_ratio_per_plan": j["median_ratio_per_plan"],
                         "overhead_us_per_instruction": j["overhead_ns_per_instruction"] / 1e3,
                         "instructions": j["instructions"], "wait_fraction": j["wait_fraction"]})
    ok = [r for r in rows if "error" not in r]
    parts = []
    for s in ctx.size("plan_stages"):
        mine = [r for r in ok if r["stages"] == s]
        if not mine:
            continue
        top = max(mine, key=lambda r: r["time_scale"])
        zero = [r for r in mine if r["time_scale"] == 0]
        parts.append(f"S={s}: measured/simulated {top['measured_over_simulated']:.4f} at scale {top['time_scale']:g}"
                     + (f", {zero[0]['overhead_us_per_instruction']:.2f} us/instruction at scale 0" if zero else ""))
    figures["summary"] = "; ".join(parts)
    if errors:
        raise StepFailed(f"{len(errors)} of {len(rows)} replays failed; the first: {errors[0]}", figures)
    return figures


def step_replay_cuda(ctx, step):
    return replay(ctx, step, "cuda")


def step_replay_threads(ctx, step):
    return replay(ctx, step, "threads")


def step_nccl_replay(ctx: Context, step: Step):
    id_file = os.path.join(ctx.work, "nccl.id")
    env = dict(ctx.env, NCCL_DEBUG=ctx.env.get("NCCL_DEBUG", "WARN"))
    t = time.monotonic()
    j = run_json(ctx, step, [ctx.cli(), "run", ctx.artifacts["plan_demo1"], "--replay", "--transport", "nccl",
                             "--rank", "0", "--nccl-id-file", id_file, "--time-scale", "0.01", "--timeout", "60",
                             "--json"], "packpipe run --transport nccl", env=env)
    return {"iterations": j["iterations"], "instructions": j["instructions"], "seconds": round(time.monotonic() - t, 2),
            "summary": f"one rank, {j['iterations']} iterations, {j['instructions']} instructions in "
                       f"{time.monotonic() - t:.1f} s (NCCL init included)"}


def step_torch(ctx: Context, step: Step):
    out = os.path.join(ctx.art, "torch.json")
    model = TORCH_MODEL[ctx.mode]
    argv = [ctx.python, os.path.join(ROOT, "scripts", "device_check_torch.py"), "--device",
            "cpu" if ctx.dry else "cuda", "--out", out, "--workdir", os.path.join(ctx.art, "torch"),
            "--hidden", str(model["hidden"]), "--layers", str(model["layers"]), "--heads", str(model["heads"]),
            "--vocab", str(model["vocab"]), "--dtype", model["dtype"], *ctx.size("torch")]
    rc, _ = run(ctx, step, argv)
    try:
        with open(out) as f:
            res = json.load(f)
    except (OSError, ValueError) as e:
        check(rc, "scripts/device_check_torch.py", step)
        raise StepFailed(f"scripts/device_check_torch.py wrote no result ({e})") from None
    figures = torch_figures(res)
    m = res.get("measure", {})
    if res.get("throughput", {}).get("cost_device"):
        ctx.artifacts["cost_device"] = res["throughput"]["cost_device"]  # the device the plans were made for
    if m.get("status") == "passed":
        ctx.artifacts.update(measurements_fit=m["fit"], measurements_check=m["check"], model_file=m["model_file"])
    if rc != 0 or res.get("status") != "passed":
        if res.get("error"):
            raise StepFailed(f"scripts/device_check_torch.py: {res['error']}", figures)
        failed = [k for k in ("grad", "throughput", "measure") if res.get(k, {}).get("status") != "passed"]
        raise StepFailed(f"scripts/device_check_torch.py (exit {rc}): "
                         + "; ".join(f"{k}: {res.get(k, {}).get('error', 'not run')}" for k in failed), figures)
    return figures


def torch_figures(res: Dict[str, Any]) -> Dict[str, Any]:
    """The report's figures of the torch step (the whole result is in the logs' artifacts)."""
    fig: Dict[str, Any] = {k: res.get(k) for k in ("device", "device_name", "torch", "torch_cuda")}
    g = res.get("grad", {})
    fig["grad"] = {k: g.get(k) for k in ("status", "tolerance", "max_rel_diff", "error")}
    fig["grad"]["configs"] = [{k: c.get(k) for k in ("stages", "schedule", "plan_schedule", "microbatches",
                                                      "max_rel_diff", "global_rel_diff", "loss_rel_diff")}
                              for c in g.get("configs", [])]
    t = res.get("throughput", {})
    fig["throughput"] = {k: t.get(k) for k in ("status", "error", "stages", "workload", "global_batch_tokens",
                                               "iterations", "rounds", "cost_device", "methods", "ratios",
                                               "failed_configs")}
    fig["throughput"]["configs"] = {n: {k: c.get(k) for k in ("tokens_per_s", "simulated_tokens_per_s", "median_ms",
                                                              "measured_over_predicted", "padding_efficiency",
                                                              "error")}
                                    for n, c in t.get("configs", {}).items()}
    m = res.get("measure", {})
    fig["measure"] = {k: m.get(k) for k in ("status", "error", "iterations", "ops", "median_measured_over_predicted")}
    parts = []
    if g.get("max_rel_diff") is not None:
        parts.append(f"gradients {res.get('device')} vs cpu: max rel diff {g['max_rel_diff']:.2e} over "
                     f"{len(g.get('configs', []))} pipelines")
    ratios = t.get("ratios") or {}
    if ratios:
        parts.append("packpipe / best " + ", ".join(f"{k} {v['measured']:.3f}x (simulated {v['simulated']:.3f}x)"
                                                    for k, v in ratios.items() if v.get("measured")))
    if m.get("median_measured_over_predicted") is not None:
        parts.append(f"measured / analytic iteration {m['median_measured_over_predicted']:.3f}")
    fig["summary"] = "; ".join(parts)
    return fig


def profile_summary(j: Dict[str, Any]) -> Dict[str, Any]:
    loo = j.get("leave_one_out") or {}
    return {"points": j.get("points"), "profile_s": round(j.get("seconds", 0), 1), "device": j.get("device"),
            "dtype": j.get("dtype"), "loo_time_mape": loo.get("time_mape"),
            "loo_linear_time_mape": loo.get("linear_time_mape"), "loo_memory_mape": loo.get("memory_mape"),
            "loo_points": loo.get("points")}


def step_profile(ctx: Context, step: Step):
    out = os.path.join(ctx.art, "gpt_grid.profile.json")
    model = os.path.join(ctx.art, "gpt_grid.model.json")
    t = time.monotonic()
    j = run_json(ctx, step, [ctx.cli(), "profile", *ctx.size("profile"), "--out", out, "--model-out", model, "--json"],
                 "packpipe profile")
    fig = step.figures
    fig.update(profile_summary(j))
    fig["wall_s"] = round(time.monotonic() - t, 1)
    fig["grid"] = " ".join(ctx.size("profile"))
    mem = f", stored memory {fig['loo_memory_mape']:.2f}%" if fig["loo_memory_mape"] is not None else ""
    fig["summary"] = (f"{fig['points']} points in {fig['profile_s']} s ({fig['wall_s']} s with start-up and the "
                      f"check); leave-one-out time {fig['loo_time_mape']:.2f}% "
                      f"(linear {fig['loo_linear_time_mape']:.2f}%){mem}")
    device = ctx.artifacts.get("cost_device")
    if not device:
        fig["analytic_vs_profile"] = "not compared: the torch step named no cost-model device"
        return fig
    # The analytic model against the profiled layers: every point an F and a B measurement of a
    # one-layer (or embedding- or head-only) stage; calibrated on half the points, both models
    # validated on the other half.
    fit, held = (os.path.join(ctx.art, f"gpt_grid.{k}.measurements.jsonl") for k in ("fit", "check"))
    counts = profile_as_measurements(out, fit, held)
    base = ["--model", model, "--device", device]
    cal = os.path.join(ctx.art, "gpt_grid.calibration.json")
    run_json(ctx, step, [ctx.cli(), "costmodel", "calibrate", "--measured", fit, "-o", cal, *base, "--json"],
             "costmodel calibrate (on profile points)")
    cmp: Dict[str, Any] = {"device": device, "points_fit": counts[0], "points_check": counts[1]}
    for name, extra in (("analytic", []), ("calibrated", ["--calibration", cal])):
        v = run_json(ctx, step, [ctx.cli(), "costmodel", "validate", "--measured", held, *base, *extra, "--json"],
                     f"costmodel validate ({name}, on profile points)")
        cmp[name] = validation_figures(v)["ops"]
    fig["analytic_vs_profile"] = cmp
    fig["summary"] += "; layer time against the profile (held-out points), analytic -> calibrated: " + ", ".join(
        f"{op} {100 * cmp['analytic'][op]['median_abs']:.1f}% -> {100 * cmp['calibrated'][op]['median_abs']:.1f}%"
        for op in cmp["analytic"] if op in cmp["calibrated"])
    return fig


def profile_as_measurements(profile: str, fit: str, held: str) -> Tuple[int, int]:
    """A packpipe profile's points as packpipe-measurements (one "iteration" per point: its forward
    F and backward B on a stage of that one layer kind), alternate points into `fit` and `held`.
    Returns the points in each."""
    with open(profile) as f:
        p = json.load(f)
    header = json.dumps({"format": "packpipe-measurements", "version": 1, "model": p.get("model", ""),
                         "device": p.get("device", ""), "source": f"packpipe profile points of {profile}"})
    files: Tuple[List[str], List[str]] = ([header], [header])
    cols = p["point_columns"]
    for k, row in enumerate(p["points"]):
        d = dict(zip(cols, row))
        for i, (op, ms) in enumerate((("F", d["fwd_ms"]), ("B", d["bwd_ms"]))):
            files[k % 2].append(json.dumps({
                "op": op, "encoder_layers": int(d["kind"] == "encoder"), "decoder_layers": int(d["kind"] == "decoder"),
                "embedding": d["kind"] == "embedding", "postprocess": d["kind"] == "postprocess", "tp": d["tp"],
                "rows": d["mbs"], "seq": d["seq"], "dec_seq": d["dec_seq"], "recompute": d["rc"], "bytes": 0, "ms": ms,
                "iteration": k, "replica": 0, "rank": 0, "stage": 0, "mb": 0, "index": i, "start_ms": 0.0,
                "peer": -1}))
    for path, lines in zip((fit, held), files):
        write_atomic(path, "\n".join(lines) + "\n")
    return len(files[0]) // 2, len(files[1]) // 2


def validation_figures(j: Dict[str, Any]) -> Dict[str, Any]:
    return {"cost_model": j.get("cost_model"), "iteration_median_abs": j.get("iteration_median_abs"),
            "iteration_bias": j.get("iteration_bias"), "iterations": j.get("iterations_compared"),
            "ops": {o["op"]: {"median_abs": o["median_abs"], "bias": o["bias"], "count": o["count"]}
                    for o in j.get("ops", [])}}


def pow2_upto(lo: int, hi: int) -> List[int]:
    """lo, 2 lo, 4 lo, ... up to the first at or above hi."""
    out = [lo]
    while out[-1] < hi:
        out.append(out[-1] * 2)
    return out


def measured_shapes(paths: List[str]) -> Tuple[int, int]:
    """The largest rows and sequence length of the compute ops in packpipe-measurements files."""
    rows = seq = 1
    for path in paths:
        with open(path) as f:
            for line in f:
                op = json.loads(line)
                if op.get("op") in ("F", "B", "I", "W"):
                    rows, seq = max(rows, int(op["rows"])), max(seq, int(op["seq"]))
    return rows, seq


def calibration_grids(ctx: Context, rows: int, seq: int) -> List[Tuple[List[int], List[int]]]:
    """(mbs, seq) grids that cover the measured shapes within the profiled model's reach (twice its
    largest size) without the cross product's largest corner: many short rows up to the split
    length, a few long ones above it (one profile file each; the model reads them together)."""
    c = ctx.size("calibration_grid")
    short = [s for s in pow2_upto(c["min_seq"], c["split_seq"]) if s <= c["split_seq"]]
    grids = [(pow2_upto(1, max((rows + 1) // 2, 1)), short)]
    if seq > c["split_seq"]:
        long_seq = pow2_upto(2 * c["split_seq"], max((seq + 1) // 2, 4 * c["split_seq"]))
        grids.append((pow2_upto(1, c["long_mbs"]), long_seq))
    return grids


def step_calibration(ctx: Context, step: Step):
    model = TORCH_MODEL[ctx.mode]
    fit, held = ctx.artifacts["measurements_fit"], ctx.artifacts["measurements_check"]
    rows, seq = measured_shapes([fit, held])
    fig = step.figures
    fig.update(measured_max_rows=rows, measured_max_seq=seq, profiles=[])
    profiles = []
    for k, (mbs, seqs) in enumerate(calibration_grids(ctx, rows, seq)):
        prof = os.path.join(ctx.art, f"torch_gpt.{k}.profile.json")
        t = time.monotonic()
        j = run_json(ctx, step, [ctx.cli(), "profile", "--model", "gpt", "--hidden", str(model["hidden"]), "--heads",
                                 str(model["heads"]), "--vocab", str(model["vocab"]), "--layers", str(model["layers"]),
                                 "--dtype", model["dtype"], "--mbs", ",".join(map(str, mbs)), "--seq",
                                 ",".join(map(str, seqs)), *ctx.size("calibration_profile"), "--out", prof,
                                 "--no-check", "--json"],
                     f"packpipe profile (the torch GPT, grid {k})")
        p = profile_summary(j)
        p.update(wall_s=round(time.monotonic() - t, 1), mbs=mbs, seq=seqs)
        fig["profiles"].append(p)
        profiles.append(prof)
    base = ["--model", ctx.artifacts["model_file"], "--device", ctx.artifacts["cost_device"]]
    cal = os.path.join(ctx.art, "calibration.json")
    c = run_json(ctx, step, [ctx.cli(), "costmodel", "calibrate", "--measured", fit, "-o", cal, *base, "--json"],
                 "costmodel calibrate")
    fig["calibrate"] = {k: c.get(k) for k in ("measurements", "iteration_error_before", "iteration_error_after")
                        if k in c}
    models = {"analytic": [], "profiled": ["--profile", *profiles], "calibrated": ["--calibration", cal]}
    for name, extra in models.items():
        v = run_json(ctx, step, [ctx.cli(), "costmodel", "validate", "--measured", held, *base, *extra, "--json"],
                     f"costmodel validate ({name})")
        fig[name] = validation_figures(v)
    fig["held_out"] = fit != held
    fig["summary"] = ("iteration error on held-out iterations: " if fig["held_out"] else "iteration error: ") + \
        ", ".join(f"{k} {100 * fig[k]['iteration_median_abs']:.1f}%" for k in models
                  if fig[k]["iteration_median_abs"] is not None) + \
        f"; the torch GPT profiled: {sum(p['points'] for p in fig['profiles'])} points in " \
        f"{sum(p['profile_s'] for p in fig['profiles']):.1f} s"
    return fig


STEPS = [
    Step("environment", "versions", step_environment, 90, 5),
    Step("build", "build with CUDA and NCCL", step_build, 330, 60),
    Step("gpu_tests", "ctest -L gpu", step_gpu_tests, 120, 20, needs_cuda=True, requires=("gpu_test_exe",)),
    Step("plans", "demo plans", step_plans, 60, 5, requires=("cli",)),
    Step("replay_cuda", "replay on the CUDA transport", step_replay_cuda, 120, 20, needs_cuda=True,
         requires=("plan_demo4", "plan_demo8")),
    Step("nccl_replay", "replay on NCCL, one rank", step_nccl_replay, 60, 10, needs_cuda=True,
         requires=("plan_demo1",)),
    Step("torch", "packpipe.torch on the device", step_torch, 180, 45, requires=("core",)),
    Step("profile", "packpipe profile, GPT-1.3B grid", step_profile, 120, 30, requires=("cli", "core")),
    Step("calibration", "analytic, profiled, calibrated", step_calibration, 120, 30,
         requires=("cli", "measurements_fit", "model_file")),
    Step("replay_threads", "replay on threads", step_replay_threads, 90, 15, requires=("plan_demo4", "plan_demo8")),
]
REPORT_RESERVE_S = 15  # the report and its tarball, and a stopped command's 10 s to die


def discover(ctx: Context) -> None:
    """What an earlier run left (a rerun on a warm machine with --steps): the build's files."""
    for k, v in built(ctx).items():
        if v:
            ctx.artifacts[k] = v


def run_steps(ctx: Context, selected: List[str]) -> None:
    ctx.report["steps"] = []
    discover(ctx)
    for step in STEPS:
        rec: Dict[str, Any] = {"name": step.name, "title": step.title, "needs_cuda": step.needs_cuda}
        ctx.report["steps"].append(rec)
        left = ctx.budget - ctx.elapsed() - REPORT_RESERVE_S
        missing = [r for r in step.requires if r not in ctx.artifacts]
        if step.name not in selected:
            rec.update(status="skipped: not selected (--steps)", seconds=0)
        elif ctx.dry and step.needs_cuda:
            rec.update(status=SKIP_CUDA, seconds=0)
        elif missing:
            rec.update(status=f"skipped: needs {', '.join(missing)}, which an earlier step did not make", seconds=0)
        elif left < step.min_s:
            rec.update(status=f"skipped: over budget ({left:.0f} s left of {ctx.budget:.0f}, needs {step.min_s:.0f})",
                       seconds=0)
        else:
            limit = min(step.timeout_s, left)
            step.deadline = time.monotonic() + limit
            step.log = os.path.join(ctx.logs, f"{step.name}.log")
            rec.update(timeout_s=round(limit), log=f"logs/{step.name}.log")
            ctx.say(f"{step.name}: {step.title} (limit {limit:.0f} s) ...")
            t = time.monotonic()
            try:
                rec["figures"] = step.fn(ctx, step)
                rec["status"] = "passed"
            except StepTimeout as e:
                rec.update(status="timed out", error=str(e), figures=e.figures or step.figures)
            except StepFailed as e:
                rec.update(status="failed", error=str(e), figures=e.figures or step.figures)
            except Exception as e:  # a bug in this script: recorded, and the next step runs
                rec.update(status="failed", error=f"{type(e).__name__}: {e}", figures=step.figures)
            rec["seconds"] = round(time.monotonic() - t, 1)
        summary = (rec.get("figures") or {}).get("summary", "")
        ctx.say(f"{step.name}: {rec['status']} ({rec['seconds']} s)" + (f" -- {summary}" if summary else "")
                + (f"\n    error: {rec['error']}" if rec.get("error") else ""))
        write_report(ctx)


# ---- the report -------------------------------------------------------------------------------------

def write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_report(ctx: Context, final: bool = False) -> None:
    r = ctx.report
    steps = r.get("steps", [])
    r["wall_s"] = round(ctx.elapsed(), 1)
    r["finished"] = final
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for s in steps:
        st = s.get("status", "")
        counts["passed" if st == "passed" else "skipped" if st.startswith("skipped") else "failed"] += 1
    r["counts"] = counts
    write_atomic(os.path.join(ctx.out, "device-report.json"), json.dumps(r, indent=1, default=str) + "\n")
    write_atomic(os.path.join(ctx.out, "device-report.md"), markdown(r))
    tmp = os.path.join(ctx.out, "device-logs.tar.gz.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(ctx.work, arcname="device-check")
    os.replace(tmp, os.path.join(ctx.out, "device-logs.tar.gz"))


def markdown(r: Dict[str, Any]) -> str:
    env = r.get("environment", {})
    gpu = env.get("gpu", {})
    lines = [f"# packpipe device check ({r['mode']})", "",
             f"- when: {r['started']}; wall {r['wall_s']} s of a {r['budget_s']} s budget"
             + ("" if r.get("finished") else " (unfinished: the run stopped here)"),
             f"- GPU: {gpu.get('name') or env.get('device_name') or 'none'}; driver {gpu.get('driver', '-')}; "
             f"CUDA toolkit {env.get('cuda_toolkit') or '-'}; NCCL {(env.get('nccl') or {}).get('version') or '-'} "
             f"(torch's {env.get('torch_nccl') or '-'})",
             f"- torch {env.get('torch', '-')} (CUDA {env.get('torch_cuda') or '-'}); Python {env.get('python', '-')}; "
             f"numpy {env.get('numpy', '-')}; pybind11 {env.get('pybind11') or '-'}; {env.get('cmake') or 'no cmake'}; "
             f"{env.get('cxx') or 'no c++'}; {env.get('cores', '-')} cores",
             f"- source: {r.get('source', {}).get('commit') or 'unknown commit'}",
             f"- steps: {r['counts']['passed']} passed, {r['counts']['failed']} failed, "
             f"{r['counts']['skipped']} skipped",
             "", "| step | status | s | figures |", "|---|---|---|---|"]
    for s in r.get("steps", []):
        fig = (s.get("figures") or {}).get("summary", "")
        cell = (fig + (f" **error:** {s['error']}" if s.get("error") else "")).replace("|", "/").replace("\n", " ")
        lines.append(f"| {s['name']} | {s.get('status', '')} | {s.get('seconds', '')} | {cell} |")
    lines += ["", "Figures in full: device-report.json; every step's log and the files it made: device-logs.tar.gz "
              "(logs/STEP.log, artifacts/). DEVICE.md says how to read them.", ""]
    return "\n".join(lines)


def source_info() -> Dict[str, Any]:
    """The commit checked: git's, or .device/commit (the GPU machine's copy of the tree has no .git)."""
    commit = probe(["git", "-C", ROOT, "rev-parse", "HEAD"])
    if commit:
        dirty = probe(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"])
        return {"commit": commit, "modified_files": len(dirty.splitlines()) if dirty else 0, "from": "git"}
    try:
        with open(os.path.join(ROOT, ".device", "commit")) as f:
            return {"commit": f.read().strip() or None, "from": ".device/commit"}
    except OSError:
        return {"commit": None, "from": None}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/device-check.sh", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="the same steps on the CPU; skip only what needs CUDA")
    ap.add_argument("--out", default=os.environ.get("OUT") or "", help="report folder (default: $OUT, else a new "
                                                                         "temporary folder)")
    ap.add_argument("--build-dir", default="", help="build folder (default: build-device; a dry run: build)")
    ap.add_argument("--budget", type=float, default=0, help="seconds for the whole run (default: 450; a dry run: 600)")
    ap.add_argument("--steps", default="", help="comma-separated steps to run (default: all): "
                                                + ",".join(s.name for s in STEPS))
    ap.add_argument("--jobs", type=int, default=0, help="build jobs (default: every core)")
    ap.add_argument("--cuda-arch", default="90", help="CMAKE_CUDA_ARCHITECTURES (90: Hopper)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter with torch the build and steps use")
    ap.add_argument("--keep-work", action="store_true", help="keep the work folder (logs, artifacts) besides its "
                                                             "tarball in the report folder")
    ap.add_argument("--timeout-scale", type=float, default=1.0,
                    help="multiplies every step's time limit and minimum (a machine slower than the GPU machine)")
    a = ap.parse_args(argv)
    names = [s.name for s in STEPS]
    selected = [x for x in a.steps.split(",") if x] or names
    bad = [x for x in selected if x not in names]
    if bad:
        ap.error(f"--steps: unknown {', '.join(bad)} (steps: {', '.join(names)})")
    if a.budget < 0 or a.jobs < 0 or not a.timeout_scale > 0:
        ap.error("--budget and --jobs must not be negative, --timeout-scale must be positive")
    for s in STEPS:
        s.timeout_s *= a.timeout_scale
        s.min_s *= a.timeout_scale
    a.build_dir = a.build_dir or os.path.join(ROOT, "build" if a.dry_run else "build-device")
    a.budget = a.budget or (600.0 if a.dry_run else 450.0)
    a.out = a.out or tempfile.mkdtemp(prefix="packpipe-device-report-")
    where = "$OUT" if a.out == os.environ.get("OUT") else "--out"
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        ap.error(f"{where} {a.out}: expected a report folder (or a path to create), found a file")
    try:
        os.makedirs(a.out, exist_ok=True)
    except OSError as e:
        ap.error(f"{where} {a.out}: cannot create the report folder: {e.strerror}")
    if any(os.path.exists(os.path.join(a.build_dir, f)) and os.path.samefile(a.out, a.build_dir) for f in ("",)):
        ap.error("--out must not be the build folder")
    ctx = Context(a)
    ctx.report = {"format": REPORT_FORMAT, "version": REPORT_VERSION, "mode": "dry-run" if ctx.dry else "device",
                  "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "budget_s": ctx.budget, "build_dir": ctx.build, "out": ctx.out, "work": ctx.work,
                  "python": ctx.python, "source": source_info(), "steps": []}

    def stop(signum, frame):  # the device tool's limit, or a ctest timeout: leave the report as it stands
        ctx.say(f"stopped by signal {signum}; the report is as of the last step")
        write_report(ctx)
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    ctx.say(f"{ctx.report['mode']}: budget {ctx.budget:.0f} s, build {ctx.build}, report {ctx.out}")
    try:
        run_steps(ctx, selected)
    finally:
        write_report(ctx, final=True)
        ctx.console.close()
        if not a.keep_work:
            shutil.rmtree(ctx.work, ignore_errors=True)
    c = ctx.report["counts"]
    print(f"\n{markdown(ctx.report)}", flush=True)
    print(f"device-check: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped in "
          f"{ctx.report['wall_s']} s; report in {ctx.out}", flush=True)
    return 1 if c["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
