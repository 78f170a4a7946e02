"""The shipped library as a C++ server or a wheel user gets it: one file that needs no CUDA
runtime of its own (it is linked in statically), exports only snapmla_* symbols, and carries
sm_90a machine code."""

from __future__ import annotations

import collections
import functools
import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import NoReturn

import pytest

import snapmla


def _library() -> Path:
    path = Path(snapmla.paths.library())
    if not path.is_file():
        pytest.skip(f"the shared library is not installed here: {path}")
    return path


def _missing(what: str) -> NoReturn:
    """Skips for want of a tool, except under CI (CI=true), where every tool the test extra and
    the machine provide must be there: a skip there would hide a missing install step."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"needs {what}, which CI must provide")
    pytest.skip(f"needs {what}")


def _run(*cmd: str, env: dict[str, str] | None = None, hint: str = "binutils") -> str:
    if shutil.which(cmd[0], path=(env or os.environ).get("PATH")) is None:
        _missing(f"{cmd[0]} ({hint})")
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def test_exports_only_snapmla_symbols() -> None:
    out = _run("nm", "-D", "--defined-only", str(_library()))
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert names, "no exported symbols"
    assert all(n.startswith("snapmla_") for n in names), [n for n in names if "snapmla_" not in n]
    for fn in ("snapmla_decode", "snapmla_append", "snapmla_fetch_dequant", "snapmla_quantize_q"):
        assert fn in names


def test_needs_no_cuda_runtime_or_cxx_runtime() -> None:
    out = _run("readelf", "-d", str(_library()))
    needed = re.findall(r"\(NEEDED\).*\[(.+)\]", out)
    assert not [n for n in needed if "cudart" in n or "libcuda" in n], needed
    assert not [n for n in needed if "libstdc++" in n], needed


# glibc's own libraries: what a manylinux wheel may need without bundling (auditwheel's policy
# lists these and a few more; libcuda.so.1 is opened at run time by the CUDA runtime, never
# needed at link time, and tools/manylinux_wheel.sh excludes it from the wheel all the same).
GLIBC_LIBRARIES = {
    "libc.so.6",
    "ld-linux-x86-64.so.2",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "libm.so.6",
}


def test_needs_only_glibc() -> None:
    """What makes the wheel a manylinux one with nothing grafted into it (auditwheel repair
    leaves the library as it is); the glibc symbol versions decide which manylinux tag."""
    out = _run("readelf", "-d", str(_library()))
    needed = set(re.findall(r"\(NEEDED\).*\[(.+)\]", out))
    assert needed <= GLIBC_LIBRARIES, sorted(needed - GLIBC_LIBRARIES)
    versions = set(re.findall(r"\(GLIBC_(\d+)\.(\d+)", _run("objdump", "-T", str(_library()))))
    newest = max((int(a), int(b)) for a, b in versions)
    print(f"needs {sorted(needed)}; newest glibc symbol version {newest[0]}.{newest[1]}")


def test_carries_sm90a_code() -> None:
    data = _library().read_bytes()
    assert b"sm_90a" in data


def _cuda_tool(name: str) -> Path | None:
    """A CUDA binary tool from PATH, the CUDA toolkit, or an nvidia-cuda-* wheel (test extra),
    whose files sit in site-packages/nvidia/cu13/bin, not on PATH."""
    found = shutil.which(name) or shutil.which(name, path="/usr/local/cuda/bin")
    if found:
        return Path(found)
    for key in ("purelib", "platlib"):
        for tool in sorted(Path(sysconfig.get_paths()[key], "nvidia").glob(f"*/bin/{name}")):
            return tool
    return None


def _sass_command() -> tuple[list[str], dict[str, str]]:
    """``cuobjdump --dump-sass`` of the library, with an environment whose PATH leads to the
    nvdisasm it runs: the one beside it, else any other (nvidia-cuda-nvdisasm, test extra)."""
    cuobjdump = _cuda_tool("cuobjdump")
    if cuobjdump is None:
        _missing("cuobjdump (pip install nvidia-cuda-cuobjdump)")
    nvdisasm = cuobjdump.with_name("nvdisasm")
    if not nvdisasm.is_file():
        nvdisasm = _cuda_tool("nvdisasm")
    if nvdisasm is None:
        _missing("nvdisasm, which cuobjdump --dump-sass runs (pip install nvidia-cuda-nvdisasm)")
    path = os.pathsep.join([str(nvdisasm.parent), os.environ.get("PATH", "")])
    return [str(cuobjdump), "--dump-sass", str(_library())], dict(os.environ, PATH=path)


@functools.lru_cache(maxsize=1)  # one cuobjdump run serves every SASS test
def _sass_by_kernel() -> dict[str, list[str]]:
    cmd, env = _sass_command()
    out = _run(*cmd, env=env)
    kernels: dict[str, list[str]] = {}
    name = None
    for line in out.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = m.group(1)
            kernels[name] = []
        elif name and re.match(r"\s+/\*[0-9a-f]{4,}\*/", line):  # addresses pass 0xffff
            kernels[name].append(line)
    return kernels


def _kernel(kernels: dict[str, list[str]], part: str) -> list[str]:
    names = [k for k in kernels if part in k]
    assert len(names) == 1, f"expected one kernel named *{part}*, found {names}"
    return kernels[names[0]]


# The sm90 decode kernel's variants (cpp/decode/sm90/traits.h, KernelTraits<n, scaled>): the PV
# width N, and at N = 64 the long-chain kernel whose promotion scales O^T by gamma once a block
# then adds each m-tile (kScaledPv). N = 16 and 32 carry one query row a thread (both query forms).
SM90_VARIANTS = [(16, False), (32, False), (64, False), (64, True)]
# The PV of a block: every m-tile in flight as whole-N wgmmas (N = 32); whole-N groups in the
# blocks every row sees whole and half-N groups in edge blocks (N = 64); half-N groups (N = 16).
SM90_PV_ALL_TILES = {16: False, 32: True, 64: False}
SM90_PV_WHOLE_TILES = {16: False, 32: False, 64: True}


def _sm90_name(n: int, scaled: bool = False) -> str:
    """The mangled-name part of decode_kernel<KernelTraits<n, scaled>>."""
    return f"KernelTraitsILi{n}ELb{int(scaled)}EE"


def _sm90(n: int, scaled: bool = False) -> list[str]:
    return _kernel(_sass_by_kernel(), _sm90_name(n, scaled))


def _label(n: int, scaled: bool) -> str:
    return f"sm90 N={n}{' scaled' if scaled else ''}"


# A wgmma instruction: its shape, and its A operand (a register, or a shared-memory descriptor)
_WGMMA = re.compile(r"\b([QH]GMMA\.[0-9x]+)\S*\s+R\d+,\s+(\S+)")


def _wgmma(sass: list[str]) -> collections.Counter[tuple[str, str]]:
    """(shape, where its A operand comes from: "smem" or "reg") of each wgmma instruction."""
    found: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in sass:
        m = _WGMMA.search(line)
        if m:
            found[(m.group(1), "reg" if m.group(2).startswith("R") else "smem")] += 1
    return found


def test_sm90_kernel_variants_are_the_shipped_set() -> None:
    """The library holds exactly the four sm90 decode variants decode::select_kernel can pick."""
    names = [k for k in _sass_by_kernel() if "decode_kernelIN" in k and "KernelTraits" in k]
    assert sorted(names) == sorted(
        k for n, scaled in SM90_VARIANTS for k in names if _sm90_name(n, scaled) in k
    )
    assert len(names) == len(SM90_VARIANTS), names


@pytest.mark.parametrize(("n", "scaled"), SM90_VARIANTS)
def test_fast_kernel_sass_is_the_kernel_we_think_it_is(n: int, scaled: bool) -> None:
    """The sm90 kernel (kernel="fast") as cpp/decode/sm90/traits.h lays it out: QK from shared
    memory, 16 FP8 QGMMA m64n64k32 over the content and 4 BF16 HGMMA m64n64k16 over the RoPE,
    emitted once; PV with V^T in registers, FP8 QGMMA with N/2 or N columns, a whole block
    being 4 m-tiles x 2 k-steps (x 2 halves for half-N groups; each copy the compiler inlines is
    a whole block); nothing else on the tensor cores. This catches ptxas dropping a whole QK
    round without a GPU. Prints the kernel's size in instructions."""
    sass = _sm90(n, scaled)
    gmma = _wgmma(sass)
    whole = gmma.pop((f"QGMMA.64x{n}x32", "reg"), 0)
    half = gmma.pop((f"QGMMA.64x{n // 2}x32", "reg"), 0)
    assert gmma == {("QGMMA.64x64x32", "smem"): 16, ("HGMMA.64x64x16", "smem"): 4}, gmma
    if SM90_PV_ALL_TILES[n]:
        assert whole > 0 and whole % 8 == 0 and half == 0, (whole, half)
    elif SM90_PV_WHOLE_TILES[n]:
        assert whole > 0 and whole % 8 == 0 and half > 0 and half % 16 == 0, (whole, half)
    else:
        assert whole == 0 and half > 0 and half % 16 == 0, (whole, half)
    print(f"{_label(n, scaled)}: {len(sass)} SASS instructions, {half} half-N, {whole} whole-N PV")


@pytest.mark.parametrize(("n", "scaled"), SM90_VARIANTS)
def test_fast_kernel_wgmmas_are_not_serialized(n: int, scaled: bool) -> None:
    """ptxas serializes every wgmma of a kernel when it cannot prove the accumulator registers
    safe (its C7510-C7520 warnings: a wgmma in flight across a spin loop, a divergent path, a
    join of paths with different groups in flight): each wgmma then gets its own
    WARPGROUP.ARRIVE and a WARPGROUP.DEPBAR that waits for it, which costs a fifth of the
    kernel's speed with every test passing. The kernels wait on about a third of their wgmmas."""
    sass = _sm90(n, scaled)
    gmma = sum(_wgmma(sass).values())
    depbar = sum("WARPGROUP.DEPBAR" in line for line in sass)
    assert gmma > 0 and depbar <= gmma // 2, (
        f"{_label(n, scaled)}: {depbar} WARPGROUP.DEPBAR for {gmma} wgmmas: ptxas serialized "
        "them (look for C75xx in the build log)"
    )


@pytest.mark.parametrize(("n", "scaled"), SM90_VARIANTS)
def test_fast_kernel_qk_descriptors_stay_uniform(n: int, scaled: bool) -> None:
    """The QK's shared-memory descriptors are built in uniform registers (UIADD3 and the like),
    not in ordinary ones moved over by R2UR before each wgmma (~8 instructions a QK wgmma on the
    consumers' latency-bound chain, which a store in the producer's copy of the request loop
    once caused by making ptxas keep the shared base in an ordinary register across the role
    split). At most one R2UR a wgmma on average (loop-carried stage indices); printed."""
    sass = _sm90(n, scaled)
    pending = before_ss = ss = 0
    for line in sass:
        if re.search(r"\bR2UR\b", line):
            pending += 1
        m = _WGMMA.search(line)
        if m:
            if not m.group(2).startswith("R"):  # A from shared memory: a QK wgmma
                ss += 1
                before_ss += pending
            pending = 0
    total = sum(bool(re.search(r"\bR2UR\b", line)) for line in sass)
    print(f"{_label(n, scaled)}: {before_ss} R2UR before its {ss} QK wgmmas, {total} in all")
    assert ss == 20 and before_ss <= ss, (before_ss, ss)


def _consumer_code(sass: list[str]) -> list[str]:
    """The consumer warpgroups' code: from their setmaxnreg (USETMAXREG.TRY_ALLOC) to the
    producer's (USETMAXREG.DEALLOC), the layout ptxas gives today (consumer code placed past the
    producer's would escape this check). The producer's region runs under 24 registers, where a
    few spilled scalars cost nothing on the tensor-core path."""
    start = [i for i, line in enumerate(sass) if "USETMAXREG.TRY_ALLOC" in line]
    dealloc = [i for i, line in enumerate(sass) if "USETMAXREG.DEALLOC" in line]
    assert len(start) == 1 and len(dealloc) == 1 and start[0] < dealloc[0], (start, dealloc)
    return sass[start[0] : dealloc[0]]


# Local memory on the consumers' path, bytes of stack (cuobjdump's STACK) at most: O^T alone is
# 128 of the N = 64 consumers' 240 registers, and they spill a few scalars; the N = 16 and 32
# consumers keep a scalar or two there (the IEEE division's slow path, the warp index).
SM90_MAX_STACK = {(16, False): 24, (32, False): 24, (64, False): 40, (64, True): 72}


@pytest.mark.parametrize(("n", "scaled"), SM90_VARIANTS)
def test_fast_kernel_local_memory_is_bounded(n: int, scaled: bool) -> None:
    """Local memory on the consumer warpgroups' path of the fast kernel (spills or local arrays)
    stays within the few scalars it has: a change that spills O^T or the wgmma temporaries
    fails here without a GPU. Prints the count of local loads and stores."""
    code = _consumer_code(_sm90(n, scaled))
    local = [line for line in code if re.search(r"\b(LDL|STL)\b", line)]
    stack = _resource(_sm90_name(n, scaled), "STACK")
    print(f"{_label(n, scaled)}: {len(local)} local memory instructions, stack {stack} B")
    assert stack <= SM90_MAX_STACK[(n, scaled)], stack


@pytest.mark.parametrize(("n", "scaled"), SM90_VARIANTS)
def test_fast_kernel_producer_split(n: int, scaled: bool) -> None:
    """setmaxnreg gives the consumers 240 registers and the producer 24 (one each), out of the
    168 a thread that the 384-thread launch holds: 128 x 24 + 256 x 240 = 384 x 168. Were ptxas
    to allocate fewer at entry, the consumers' TRY_ALLOC could never succeed and the kernel
    would hang, so the entry count is checked too."""
    sass = _sm90(n, scaled)
    alloc = [line for line in sass if "USETMAXREG" in line]
    assert len(alloc) == 2, alloc
    assert any("TRY_ALLOC" in x and "0xf0" in x for x in alloc), alloc
    assert any("DEALLOC" in x and "0x18" in x for x in alloc), alloc
    assert _resource(_sm90_name(n, scaled), "REG") == 168


@pytest.mark.parametrize(("n", "scaled"), SM90_VARIANTS)
def test_fast_kernel_consumers_compile_no_loader(n: int, scaled: bool) -> None:
    """Every TMA load is the producer's, so the consumers' copy of the request loop compiles
    none (loader code in the other role's copy changes ptxas's registers for the consumers)."""
    code = _consumer_code(_sm90(n, scaled))
    loads = [line for line in code if re.search(r"\bUTMALDG\b", line)]
    assert not loads, f"{len(loads)} TMA loads in the consumers' code"


def _resource(part: str, field: str) -> int:
    """`field` (REG, STACK, ...) of the one kernel named *part* in cuobjdump's resource usage."""
    cmd, env = _sass_command()
    out = _run(cmd[0], "--dump-resource-usage", cmd[-1], env=env)
    found = re.findall(
        r"Function (\S*" + re.escape(part) + r"\S*):\s*\n[^\n]*\b" + field + r":(\d+)", out
    )
    assert len(found) == 1, found
    return int(found[0][1])


@pytest.mark.parametrize("two_term", [0, 1])
@pytest.mark.parametrize("strided", [0, 1])
def test_reference_kernel_sass_uses_tensor_cores(strided: int, two_term: int) -> None:
    """The reference kernel's FP8 mma.sync becomes FP16 HMMA with fp32 accumulation (which is
    why it matches the model to ~1e-5), and its BF16 PV is BF16 HMMA; in every instantiation
    (packed pages or a caller's page stride; the contract's query or the two-term one)."""
    sass = _kernel(_sass_by_kernel(), f"reference_decode_kernelILb{strided}ELb{two_term}E")
    hmma = collections.Counter(
        m.group(1) for line in sass if (m := re.search(r"\b(HMMA\.16816\.F32(?:\.BF16)?)", line))
    )
    assert hmma["HMMA.16816.F32"] > 0 and hmma["HMMA.16816.F32.BF16"] > 0, hmma
    assert not [line for line in sass if re.search(r"\b[QH]GMMA\b", line)]
