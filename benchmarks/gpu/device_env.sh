# Sourced at the start of every device call: map packages like setup.py, install carried wheels
# (.whl/, filled by benchmarks/gpu/fetch_wheels.sh on the networked machine).
export PYTHONUNBUFFERED=1
for d in runtime backends templates; do [ -e sgdsl/$d ] || ln -s ../$d sgdsl/$d; done
# Once per call: a script that sources this again (run_issue30_x4.sh runs run_router_suite.sh)
# must not reinstall into /tmp/site while a job started before it imports from there.
if [ -z "$SGDSL_WHEELS_DONE" ] && ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site SGDSL_WHEELS_DONE=1
fi
export PYTHONPATH=$PWD:$PWD/benchmarks/gpu:$PYTHONPATH
export COMMIT=$(git rev-parse --short HEAD 2>/dev/null)
