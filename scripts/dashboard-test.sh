#!/usr/bin/env bash
# The Grafana dashboard against a real Prometheus: start specd in front of the test
# upstream, drive a short load, and require every PromQL expression of
# dashboards/specd.json to return data.
set -euo pipefail
cd "$(dirname "$0")/.."
export SPECD_LOCAL_STATE=$(mktemp -d)/state
trap 'deploy/local/down.sh >/dev/null 2>&1 || true' EXIT
deploy/local/up.sh --upstream "${SPECD_TEST_UPSTREAM:?start the vLLM test upstream first}" --no-prometheus -- --speculation auto
SPECD_URL=$(sed -n 's/^SPECD_URL=//p' "$SPECD_LOCAL_STATE/env")
scripts/prometheus-check.sh --specd "$SPECD_URL" --load "deploy/local/load.sh $SPECD_URL 3"
