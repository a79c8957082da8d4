#!/usr/bin/env bash
# postman.sh SUITE — run the official Agent Protocol Postman collection with
# newman against a fresh `parley serve`.
#
# It builds ./cmd/parley, starts `parley serve` on 127.0.0.1:0 with a
# temporary data directory, reads the bound HTTP address from the JSON
# "listening" log line, points the collection's first request (an outside
# echo service, kept for its cleanup pre-request script) at the server's
# /healthz, and runs tools/node_modules/.bin/newman with {{url}} set. The
# collection uploads "test_output.txt", which is created in newman's working
# directory. The server is stopped on exit; newman's exit code is ours.
set -euo pipefail

suite=${1:?usage: scripts/postman.sh path/to/agent-protocol-testing-suite-v1.postman_collection.json}
suite=$(cd "$(dirname "$suite")" && pwd)/$(basename "$suite")
root=$(cd "$(dirname "$0")/.." && pwd)
newman=$root/tools/node_modules/.bin/newman
[[ -x $newman ]] || { echo "postman.sh: $newman missing; run 'make tools'" >&2; exit 1; }

work=$(mktemp -d)
pid=
cleanup() {
	if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
		kill "$pid"
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

(cd "$root" && go build -o "$work/parley" ./cmd/parley)
mkdir -p "$work/data" "$work/newman"
"$work/parley" serve --data "$work/data" --http 127.0.0.1:0 --grpc 127.0.0.1:0 2>"$work/server.log" &
pid=$!

addr=
for _ in $(seq 1 100); do
	addr=$(node -e '
		const lines = require("fs").readFileSync(process.argv[1], "utf8").split("\n");
		for (const l of lines) {
			try { const j = JSON.parse(l); if (j.msg === "listening" && j.http) { console.log(j.http); break; } } catch (e) {}
		}' "$work/server.log")
	[[ -n $addr ]] && break
	kill -0 "$pid" 2>/dev/null || { echo "postman.sh: parley serve exited:" >&2; cat "$work/server.log" >&2; exit 1; }
	sleep 0.1
done
[[ -n $addr ]] || { echo "postman.sh: no listening line from parley serve" >&2; cat "$work/server.log" >&2; exit 1; }

node -e '
	const fs = require("fs");
	const c = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
	// The first request calls postman-echo.com only to run its cleanup
	// pre-request script; keep the script, call our own /healthz instead.
	const first = c.item[0].item[0];
	const raw = typeof first.request.url === "string" ? first.request.url : first.request.url.raw;
	if (!/postman-echo\.com/.test(raw)) throw new Error("unexpected first request: " + raw);
	first.request.url = "{{url}}/healthz";
	fs.writeFileSync(process.argv[2], JSON.stringify(c));
' "$suite" "$work/collection.json"
printf 'Washington\n' >"$work/newman/test_output.txt"

"$newman" run "$work/collection.json" \
	--env-var "url=http://$addr" \
	--working-dir "$work/newman" \
	--reporters cli \
	--color off
