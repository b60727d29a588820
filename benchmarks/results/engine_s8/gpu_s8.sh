set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
echo "== gpu suite"; timeout 300 python3 -m pytest -q -m gpu tests/ -n 8 -p no:cacheprovider > $OUT/gpu_s8.log 2>&1; echo rc=$?; tail -3 $OUT/gpu_s8.log
