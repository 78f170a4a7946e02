#!/usr/bin/env bash
# CMake's link launcher for SNAPMLA_GLIBC_2_28=ON (CMakeLists.txt): runs the shared library's
# link, given as "$@" (the host compiler, then its arguments), with zig's linker against glibc
# 2.28's symbol versions instead of this system's, so that the library runs on glibc 2.28 and
# up (manylinux_2_28) when built on a newer distribution, without PyPA's build image.
#
# What changes from the host compiler's link: zig cc -target x86_64-linux-gnu.2.28 links
# (lld, and stub libc / libpthread / libdl / librt of glibc 2.28, so every glibc symbol binds
# to its 2.28-or-older version); the host compiler's static C++ runtime and unwinder
# (libstdc++.a, libgcc_eh.a, libgcc.a) and its crtbeginS.o / crtendS.o (whose __dso_handle and
# __cxa_finalize call unregister the library's destructors when it is unloaded) go in by path;
# tools/glibc_compat.c supplies the three newer glibc symbols those runtimes reference.
#
# SNAPMLA_ZIG: the zig command (default: python3 -m ziglang, the ziglang wheel; inside pip's
# isolated build give the zig binary's path, tools/manylinux_wheel.sh does).
set -euo pipefail
[ $# -ge 2 ] || { echo "glibc_2_28_link.sh: expected a link command" >&2; exit 2; }
cxx=$1
shift
read -r -a zig <<<"${SNAPMLA_ZIG:-python3 -m ziglang}"
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/snapmla-link.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# zig's caches in the temporary folder (a read-only or shared home is fine)
export ZIG_GLOBAL_CACHE_DIR=$tmp/zig-cache ZIG_LOCAL_CACHE_DIR=$tmp/zig-cache
file_of() { "$cxx" -print-file-name="$1"; }
"${zig[@]}" cc -target x86_64-linux-gnu.2.28 -O2 -fPIC -c "$here/glibc_compat.c" -o "$tmp/compat.o"
args=()
for a in "$@"; do
  case "$a" in
    -static-libstdc++ | -static-libgcc) ;;  # the archives go in by path below
    -Wl,--exclude-libs,ALL) ;;  # not a zig cc flag; the version script keeps them local anyway
    *) args+=("$a") ;;
  esac
done
"${zig[@]}" cc -target x86_64-linux-gnu.2.28 -nostdlib++ "$(file_of crtbeginS.o)" \
  "${args[@]}" "$tmp/compat.o" "$(file_of libstdc++.a)" "$(file_of libgcc_eh.a)" \
  "$("$cxx" -print-libgcc-file-name)" "$(file_of crtendS.o)"
