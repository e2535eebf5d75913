#!/usr/bin/env bash
# Is the suite green every time?  On a fresh clone of this checkout's HEAD, installed as .ci/run
# installs it, run the multi-process tests (torchrun, DeepSpeed, Ray: `-m multiprocess`) N times
# and the whole suite M times; print one line per run and the counts with median wall times.
#
#   bash tests/repeat_runs.sh [N] [M]        (default 20 and 5; about 2 min per multi-process run,
#                                             5 min per suite run on 2 cores)
# Exit status 0 only when every run passed.  Logs stay in the printed folder.
set -uo pipefail

runs_multi=${1:-20}
runs_suite=${2:-5}
repo=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)
work=$(mktemp -d "${TMPDIR:-/tmp}/planner-repeat.XXXXXX")
echo "fresh clone of $(git -C "$repo" rev-parse --short HEAD) in $work"
git clone -q "$repo" "$work/clone"
cd "$work/clone" || exit 2

python3 -m venv .venv
# shellcheck disable=SC1091
source .venv/bin/activate
export DS_BUILD_OPS=0
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e '.[test,torchrec]' && python -m pip install --quiet --no-deps torchrec==1.8.0 || { echo "install failed"; exit 2; }

# run KIND INDEX PYTEST-ARGS...: one pytest run, its line, its wall time appended to $work/KIND.times
run() {
    local kind=$1 index=$2
    shift 2
    local log="$work/$kind-$index.log" start end status
    start=$(date +%s.%N)
    python -m pytest -q -p no:cacheprovider "$@" >"$log" 2>&1
    status=$?
    end=$(date +%s.%N)
    local wall
    wall=$(python3 -c "print(f'{$end - $start:.1f}')")
    echo "$wall $status" >>"$work/$kind.times"
    printf '%-6s %3d  exit %d  %6s s  %s\n' "$kind" "$index" "$status" "$wall" "$(tail -n 1 "$log")"
}

for i in $(seq 1 "$runs_multi"); do run multi "$i" -m multiprocess; done
for i in $(seq 1 "$runs_suite"); do run suite "$i"; done

summary() {
    local kind=$1 total=$2
    [ "$total" -gt 0 ] || return 0
    python3 - "$work/$kind.times" "$kind" "$total" <<'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
walls = [float(w) for w, _ in rows]
green = sum(1 for _, status in rows if status == "0")
print(f"{sys.argv[2]}: {green} of {sys.argv[3]} green; wall s median {statistics.median(walls):.1f} "
      f"(min {min(walls):.1f}, max {max(walls):.1f})")
EOF
}
summary multi "$runs_multi"
summary suite "$runs_suite"
failed=$(awk '$2 != 0' "$work"/*.times 2>/dev/null | wc -l)
echo "logs: $work"
[ "$failed" -eq 0 ]
