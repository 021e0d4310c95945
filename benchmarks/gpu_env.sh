# Sourced by benchmarks/gpu.sh and benchmarks/gpu_suite.sh: the Python to use and an import path for a bare GPU
# machine (torch, timm, tensorboard, pyyaml, scikit-learn and pytest there; neither yacs nor this project).
#   benchmarks/gpu_suite.sh --prepare    here, where pip reaches PyPI: yacs's wheel into .whl/ (git ignores it)
# On the device machine, name .whl in the run's `carry`; this file installs it into a temporary folder.
PY=${PYTHON:-$(command -v python3 || command -v python)}
_site=""
if ! "$PY" -c "import yacs" 2>/dev/null; then
    if ! ls .whl/yacs-*.whl >/dev/null 2>&1; then
        echo "yacs is not importable and .whl/ holds no yacs wheel: run benchmarks/gpu_suite.sh --prepare where" \
             "pip reaches PyPI, and carry .whl to this machine" >&2
        exit 2
    fi
    _site=$(mktemp -d -t runner-site-XXXXXX)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$_site" .whl/yacs-*.whl
fi
# the project is not pip-installed there: import it from this checkout
export PYTHONPATH="$PWD${_site:+:$_site}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
