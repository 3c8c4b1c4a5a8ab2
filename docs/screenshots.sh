#!/usr/bin/env bash
# The manual's dashboard picture, made again by the project's own commands: a small 2-stage search of a
# 6-block DeiT-Tiny, a real optuna-dashboard serving its study on 127.0.0.1, and headless Chromium's screenshot of
# a measured trial (its note and timeline). Needs chromium (apt-get install chromium).
# usage: bash docs/screenshots.sh            (writes docs/images/dashboard.png)
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
port=${PORT:-8093}
tmp=$(mktemp -d)
dash=
trap '[ -n "$dash" ] && kill "$dash" 2>/dev/null; rm -rf "$tmp"' EXIT
$py -m search.optimize --model deit_tiny_patch16_224 --model-kwargs '{"depth": 6}' --batch-size 16 --stages 2 \
    --chunks 4,8 --trials 4 --no-progress \
    --storage "sqlite:///$tmp/optuna.db" --study-name tiny-deit-s2 --results-dir "$tmp/results" \
    --profile-dir "$tmp/profiles" --artifact-dir "$tmp/artifacts" >"$tmp/search.log"
.venv/bin/optuna-dashboard "sqlite:///$tmp/optuna.db" --artifact-dir "$tmp/artifacts" --host 127.0.0.1 \
    --port "$port" >"$tmp/dashboard.log" 2>&1 &
dash=$!
for _ in $(seq 60); do curl -sf "http://127.0.0.1:$port/" >/dev/null && break; sleep 0.5; done
best=$($py -c "import json,sys; print(json.load(open(sys.argv[1]))['provenance']['trial'])" "$tmp/results/tiny-deit-s2/best_split.json")
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1050 \
    --virtual-time-budget=20000 --screenshot=docs/images/dashboard.png \
    "http://127.0.0.1:$port/dashboard/studies/1/trials?numbers=$best" 2>/dev/null
echo "wrote docs/images/dashboard.png (trial $best of the study)"
