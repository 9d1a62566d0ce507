#!/usr/bin/env bash
# A short, bounded mixed load against specd, so every dashboard panel gets data:
# streamed completions and chat with speculation forced on and left to the controller,
# passthrough requests (speculation off, n > 1), one malformed request (rejected), and
# model listings. Two requests run at a time.
#
#   deploy/local/load.sh [SPECD_URL] [ROUNDS]     (default SPECD_URL from the environment,
#                                                  ROUNDS 3; each round sends 8 requests)
# Environment: SPECD_API_KEY (sent as a bearer token when set), SPECD_LOAD_MAX_TOKENS (64).
set -euo pipefail

URL=${1:-${SPECD_URL:-}}
ROUNDS=${2:-3}
MAX_TOKENS=${SPECD_LOAD_MAX_TOKENS:-64}
[[ -n $URL ]] || { echo "usage: $0 SPECD_URL [ROUNDS]" >&2; exit 2; }
URL=${URL%/}

AUTH=()
[[ -n ${SPECD_API_KEY:-} ]] && AUTH=(-H "authorization: Bearer $SPECD_API_KEY")

MODEL=$(curl -sf --max-time 10 "${AUTH[@]}" "$URL/v1/models" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')

# post PATH JSON [HEADER...]: prints the HTTP status.
post() {
    local path=$1 body=$2
    shift 2
    local h=()
    for x in "$@"; do h+=(-H "$x"); done
    curl -s -o /dev/null -w '%{http_code}\n' --max-time 120 "${AUTH[@]}" "${h[@]}" \
        -H 'content-type: application/json' "$URL$path" -d "$body"
}

# Repetitive prompts give the n-gram and suffix drafters something to match.
PROMPTS=(
    "1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7 8 9 10 1 2 3 4 5"
    "the cat sat on the mat. the cat sat on the mat. the cat sat on the"
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"
    "Once upon a time there was a model that"
)

one_round() {
    local r=$1
    local p=${PROMPTS[$((r % ${#PROMPTS[@]}))]}
    {
        post /v1/completions "{\"model\":\"$MODEL\",\"prompt\":\"$p\",\"max_tokens\":$MAX_TOKENS,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" "x-speculation: on" &
        post /v1/chat/completions "{\"model\":\"$MODEL\",\"messages\":[{\"role\":\"user\",\"content\":\"$p\"}],\"max_tokens\":$MAX_TOKENS,\"stream\":true}" &
        wait
        post /v1/completions "{\"model\":\"$MODEL\",\"prompt\":\"$p\",\"max_tokens\":$MAX_TOKENS,\"stream\":true}" "x-speculation: auto" &
        post /v1/completions "{\"model\":\"$MODEL\",\"prompt\":\"$p\",\"max_tokens\":16}" "x-speculation: off" &
        wait
        post /v1/completions "{\"model\":\"$MODEL\",\"prompt\":\"$p\",\"max_tokens\":8,\"n\":2}" &
        post /v1/completions "{\"model\":\"$MODEL\",\"prompt\":\"$p\",\"max_tokens\":$MAX_TOKENS,\"temperature\":0.8,\"seed\":$r}" "x-speculation: on" &
        wait
        post /v1/completions '{"model": "broken' &
        curl -s -o /dev/null -w '%{http_code}\n' --max-time 10 "${AUTH[@]}" "$URL/v1/models" &
        wait
    } | sort | uniq -c | sed "s/^/round $r: /"
}

for ((r = 0; r < ROUNDS; r++)); do
    one_round "$r"
done
