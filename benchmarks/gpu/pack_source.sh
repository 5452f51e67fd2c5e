#!/usr/bin/env bash
# Packs a trimmed copy of the patched pinned llama.cpp tree (what llama_cffi's build_ffi
# builds) into llama.cpp-src.tar.gz beside this script: what CMake needs for libllama,
# ggml (CPU, CUDA, RPC backends), common, the tools (llama-bench, llama-batched-bench) and
# the examples (llama-batched).
# usage: bash pack_source.sh SRC_TREE   (the cached <cache>/src/llama.cpp-<commit>-pinned-patched-<digest>)
set -euo pipefail
SRC=${1:?patched llama.cpp tree}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir "$TMP/llama.cpp"
cd "$SRC"
keep=(CMakeLists.txt CMakePresets.json LICENSE cmake common examples ggml include licenses src tools vendor)
cp -a "${keep[@]}" "$TMP/llama.cpp/"
cd "$TMP/llama.cpp"
# the examples build also adds pocs/, which the registry's sdist does not carry: an empty one
if [ ! -d pocs ]; then mkdir pocs && echo "# not in the pinned sdist; nothing to build" > pocs/CMakeLists.txt; fi
# other backends (only add_subdirectory'd when their GGML_<NAME> option is on)
for b in vulkan sycl opencl hexagon metal et webgpu openvino cann virtgpu zdnn zendnn musa hip blas; do
  rm -rf "ggml/src/ggml-$b"
done
# tools only configured with LLAMA_BUILD_SERVER=ON
rm -rf tools/ui tools/server tools/cli
find . -name '*.pyc' -delete
cd "$TMP"
tar -czf "$HERE/llama.cpp-src.tar.gz" llama.cpp
du -sh "$TMP/llama.cpp" "$HERE/llama.cpp-src.tar.gz"
