#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The device build: molmoact cross-compiled for aarch64 Linux (the IQ-9075's Cortex-A78AE cores)
# with Debian's gcc-aarch64-linux-gnu, packed with what it needs to run on an older glibc:
#   dist/molmoact-<version>-aarch64-linux.tar.gz
#     bin/molmoact            the program (RUNPATH $ORIGIN/../lib)
#     lib/*.so*               the third-party libraries it loads (from Debian's arm64 packages)
#     share/molmoact/         the demo model and golden, README-device.md
# Only glibc is taken from the device; every symbol must exist in glibc 2.35 (checked).
#   scripts/build_device.sh [--tests]   (--tests: also run the demo and the kernel tests under qemu)
# It needs the network and root the first time: it adds the arm64 architecture to dpkg
# (dpkg --add-architecture, apt-get update) and downloads Debian's arm64 packages of the
# libraries into out/sysroot-aarch64 (apt-get download); later runs reuse them. The cross
# compiler and qemu-user come from scripts/install_test_deps.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
run_tests=0
[ "${1:-}" = "--tests" ] && run_tests=1
sysroot=$root/out/sysroot-aarch64
build=$root/build-aarch64
version=$(sed -n 's/^project(molmoact VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
pkgs=(libcjson1 libcjson-dev zlib1g zlib1g-dev libpng16-16 libpng-dev libjpeg62-turbo libjpeg62-turbo-dev libutf8proc2
      libutf8proc-dev libmsgpackc2 libmsgpack-dev libcmocka0 libcmocka-dev libssl3 libssl-dev
      libcap2 libcap-dev libmicrohttpd12 libmicrohttpd-dev libwslay1 libwslay-dev libnghttp2-14 libnghttp2-dev
      libgnutls30 libnettle8 libhogweed6 libgmp10 libidn2-0 libp11-kit0 libtasn1-6 libunistring2 libffi8)

# 1. the arm64 libraries, unpacked into a sysroot (no arm64 package is installed on the host)
# (unpacked again when the list of packages changes: .complete holds the list it was made from)
if [ "$(cat "$sysroot/.complete" 2> /dev/null)" != "${pkgs[*]}" ]; then
  command -v aarch64-linux-gnu-gcc > /dev/null || { echo "build_device.sh: gcc-aarch64-linux-gnu is missing (scripts/install_test_deps.sh)"; exit 1; }
  dpkg --print-foreign-architectures | grep -qx arm64 || { dpkg --add-architecture arm64; apt-get update -qq; }
  apt-cache show libcjson1:arm64 > /dev/null 2>&1 || apt-get update -qq
  debs=$(mktemp -d)
  chmod 777 "$debs"
  (cd "$debs" && apt-get download -qq $(printf '%s:arm64 ' "${pkgs[@]}") 2> /dev/null)
  rm -rf "$sysroot"
  mkdir -p "$sysroot"
  for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$sysroot"; done
  rm -rf "$debs"
  echo "${pkgs[*]}" > "$sysroot/.complete"
fi

# 2. the cross build (portable kernels for now)
MA_AARCH64_SYSROOT=$sysroot cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
  -DMA_TESTS=OFF "-DCMAKE_INSTALL_RPATH=\$ORIGIN/../lib" -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON > /dev/null
cmake --build "$build" -j"$(nproc)" --target molmoact > /dev/null

# 3. the tarball: the binary, the libraries it needs (transitively, glibc's own excepted)
stage=$(mktemp -d)
name=molmoact-$version-aarch64-linux
mkdir -p "$stage/$name/bin" "$stage/$name/lib" "$stage/$name/share/molmoact"
cp "$build/molmoact" "$stage/$name/bin/"
aarch64-linux-gnu-strip "$stage/$name/bin/molmoact"
glibc_libs=" libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 ld-linux-aarch64.so.1 "
todo=("$stage/$name/bin/molmoact")
while [ ${#todo[@]} -gt 0 ]; do
  f=${todo[0]}
  todo=("${todo[@]:1}")
  for lib in $(aarch64-linux-gnu-readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    case "$glibc_libs" in *" $lib "*) continue ;; esac
    [ -e "$stage/$name/lib/$lib" ] && continue
    src=""
    for cand in "$sysroot/usr/lib/aarch64-linux-gnu/$lib" "$sysroot/lib/aarch64-linux-gnu/$lib"; do
      [ -e "$cand" ] && { src=$cand; break; }
    done
    [ -n "$src" ] || { echo "build_device.sh: $lib (needed by $(basename "$f")) is not in the sysroot"; exit 1; }
    cp -L "$src" "$stage/$name/lib/$lib"
    todo+=("$stage/$name/lib/$lib")
  done
done
cp -r assets/tiny-grid "$stage/$name/share/molmoact/"
# the demo observation in one file (the golden's pixels, prompt and noise)
/usr/bin/python3 -c "
import numpy as np, sys
g = sys.argv[1]
v, s = np.load(g + '/vision_io.npz'), np.load(g + '/step0_boundary.npz')
np.savez(g + '/demo_inputs.npz', pixels=v['pixels'], input_ids=s['input_ids'], noise=s['noise'])" "$stage/$name/share/molmoact/tiny-grid/golden"
cp docs/DEVICE.md "$stage/$name/share/molmoact/README-device.md"
# 4. nothing may need a glibc newer than the device's (Qualcomm Linux: glibc 2.35)
newest=$(for f in "$stage/$name"/bin/* "$stage/$name"/lib/*; do aarch64-linux-gnu-objdump -T "$f"; done | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
echo "newest glibc symbol version needed: $newest"
if [ "$(printf '%s\n%s\n' "$newest" GLIBC_2.35 | sort -V | tail -1)" != GLIBC_2.35 ]; then
  echo "build_device.sh: $newest is newer than the device's glibc 2.35:"
  for f in "$stage/$name"/bin/* "$stage/$name"/lib/*; do
    aarch64-linux-gnu-objdump -T "$f" | grep -E "GLIBC_2\.(3[6-9]|[4-9][0-9])" | sed "s|^|  $(basename "$f"): |"
  done
  exit 1
fi
mkdir -p dist
tar -C "$stage" -czf "dist/$name.tar.gz" "$name"
rm -rf "$stage"
echo "dist/$name.tar.gz ($(du -h "dist/$name.tar.gz" | cut -f1))"

# 5. under emulation: the demo through the parity gate (QEMU_CPU=cortex-a76: fp16 + dotprod as
#    the A78AE; cortex-a72: neither)
if [ $run_tests = 1 ]; then
  command -v qemu-aarch64 > /dev/null || { echo "build_device.sh: qemu-user is missing"; exit 1; }
  t=$(mktemp -d)
  tar -C "$t" -xzf "dist/$name.tar.gz"
  for cpu in cortex-a76 cortex-a72; do
    echo "== demo under qemu, -cpu $cpu (in process)"
    QEMU_CPU=$cpu QEMU_LD_PREFIX=/usr/aarch64-linux-gnu qemu-aarch64 "$t/$name/bin/molmoact" run \
      --model "$t/$name/share/molmoact/tiny-grid/model" --golden "$t/$name/share/molmoact/tiny-grid/golden" \
      --inputs "$t/$name/share/molmoact/tiny-grid/golden/demo_inputs.npz" --runs 1 --inproc --json > "$t/out.json" 2> "$t/err.txt" || true
    /usr/bin/python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['parity']['pass'], r['parity']; print('parity PASS, end-to-end cosine', r['parity']['action_cosine'])" "$t/out.json" \
      || { cat "$t/err.txt"; exit 1; }
  done
  rm -rf "$t"
fi
