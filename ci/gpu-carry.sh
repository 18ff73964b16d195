#!/bin/bash
# Packs what the GPU machine lacks for a build of worker-orcd and its tests (it has nvcc,
# cuBLAS, CMake and ninja, but none of the Debian development packages): the headers, static
# test libraries, cpp-httplib's shared library and its brotli dependencies, and the CMake
# package files, into .carry/deps.tar.gz (ignored by git; name `.carry` in the device call's
# carry list). ci/gpu-build.sh unpacks and uses it there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.carry"
lib=usr/lib/x86_64-linux-gnu
cd /
tar czf "$root/.carry/deps.tar.gz" \
  usr/include/nlohmann usr/include/gtest usr/include/gmock usr/include/httplib.h \
  usr/include/openssl usr/include/x86_64-linux-gnu/openssl usr/include/zlib.h usr/include/zconf.h \
  usr/include/brotli usr/share/cmake/nlohmann_json $lib/cmake/GTest \
  $lib/libgtest.a $lib/libgtest_main.a $lib/libgmock.a $lib/libgmock_main.a \
  $lib/libcpp-httplib.so* $lib/libbrotlicommon.so.1* $lib/libbrotlidec.so.1* $lib/libbrotlienc.so.1*
echo "gpu-carry: $(du -h "$root/.carry/deps.tar.gz" | cut -f1) in .carry/deps.tar.gz"
