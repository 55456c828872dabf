# SPDX-License-Identifier: Apache-2.0
# Cross-compiling for the device's CPU (aarch64 Linux) with Debian's gcc-aarch64-linux-gnu.
# The third-party libraries come from an arm64 sysroot that scripts/build_device.sh unpacks from
# Debian's arm64 packages (MA_AARCH64_SYSROOT); glibc is the cross toolchain's own.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
if(NOT MA_AARCH64_SYSROOT)
  set(MA_AARCH64_SYSROOT "$ENV{MA_AARCH64_SYSROOT}")
endif()
set(MA_AARCH64_SYSROOT "${MA_AARCH64_SYSROOT}" CACHE PATH "arm64 libraries unpacked from Debian packages")
set(CMAKE_FIND_ROOT_PATH "${MA_AARCH64_SYSROOT}" /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# the unpacked libraries' own dependencies (libssl, libcap, ...) are found there at link time
# (DT_RPATH rather than RUNPATH: a tarball's $ORIGIN/../lib is then also searched for the
# bundled libraries' own dependencies)
set(CMAKE_EXE_LINKER_FLAGS_INIT "-Wl,--disable-new-dtags -Wl,-rpath-link,${MA_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu -Wl,-rpath-link,${MA_AARCH64_SYSROOT}/lib/aarch64-linux-gnu")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "${CMAKE_EXE_LINKER_FLAGS_INIT}")
# multiarch headers of those libraries (jconfig.h, ...)
set(CMAKE_C_FLAGS_INIT "-isystem ${MA_AARCH64_SYSROOT}/usr/include/aarch64-linux-gnu")
# run the cross-built tests under qemu-user (QEMU_CPU picks the CPU model)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)
