#!/usr/bin/env bash
# postman.sh [SUITE] — run the official Agent Protocol Postman collection
# with newman against a fresh `parley serve`.
#
# It builds ./cmd/parley, starts `parley serve` on 127.0.0.1:0 with a
# temporary data directory, reads the bound HTTP address from the JSON
# "listening" log line, points the collection's first request (an outside
# echo service, kept for its cleanup pre-request script) at the server's
# /healthz, and runs tools/node_modules/.bin/newman with {{url}} set. The
# collection uploads "test_output.txt", which is created in newman's working
# directory. The server is stopped on exit.
#
# The suite cannot pass silently: newman also writes its JSON report, and
# the run fails unless newman exited 0, the report counts more than zero
# assertions, and none of them (nor any request or script) failed.
#
# With AP_ACCESS=token the default agent is switched to `token` access
# first (`parley agent update default:agent --ap-access token`, as the
# operator), and the suite runs twice: without a credential every Agent
# Protocol request must get 401, then with a fresh key of the agent (the
# collection given bearer auth) every assertion must pass.
#
# With no SUITE (AP_SUITE unset in `make postman`): under CI (CI set to
# anything but "" or "false") that is a failure; elsewhere the skip is
# announced loudly on stderr and the script exits 0. A SUITE that names no
# file always fails.
set -euo pipefail

ci=false
case "${CI:-}" in "" | false | 0) ;; *) ci=true ;; esac

suite=${1:-}
if [[ -z $suite ]]; then
	if $ci; then
		echo "postman.sh: FAIL: no Agent Protocol Postman collection given (AP_SUITE is empty) and CI=$CI:" >&2
		echo "postman.sh:   CI must run the official suite; set AP_SUITE=path/to/agent-protocol-testing-suite-v1.postman_collection.json" >&2
		exit 1
	fi
	{
		echo "################################################################################"
		echo "# postman: SKIPPED. The official Agent Protocol suite did NOT run."
		echo "# Why: AP_SUITE is not set. Run it with"
		echo "#   make postman AP_SUITE=path/to/agent-protocol-testing-suite-v1.postman_collection.json"
		echo "# Under CI (CI=true) a missing suite fails the run."
		echo "################################################################################"
	} >&2
	exit 0
fi
[[ -f $suite ]] || { echo "postman.sh: FAIL: the Postman collection $suite does not exist" >&2; exit 1; }
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
"$work/parley" serve --data "$work/data" --http-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 2>"$work/server.log" &
pid=$!

addr=
for _ in $(seq 1 100); do
	read -r addr grpc_addr < <(node -e '
		const lines = require("fs").readFileSync(process.argv[1], "utf8").split("\n");
		for (const l of lines) {
			try { const j = JSON.parse(l); if (j.msg === "listening" && j.http) { console.log(j.http + " " + j.grpc); break; } } catch (e) {}
		}' "$work/server.log") || true
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

auth_args=()
if [[ ${AP_ACCESS:-public} == token ]]; then
	cli() { PARLEY_SERVER=$grpc_addr PARLEY_TOKEN=$(cat "$work/data/operator.token") "$work/parley" "$@"; }
	# The server creates the default agent once it serves; wait for it.
	for _ in $(seq 1 100); do
		cli agent update default:agent --ap-access token >/dev/null 2>&1 && break
		sleep 0.1
	done
	cli agent get default:agent | grep -q AGENT_PROTOCOL_ACCESS_TOKEN ||
		{ echo "postman.sh: FAIL: could not switch default:agent to token access" >&2; exit 1; }
	key=$(cli agent key create default:agent)
	"$newman" run "$work/collection.json" --env-var "url=http://$addr" --working-dir "$work/newman" \
		--reporters json --reporter-json-export "$work/anonymous.json" >/dev/null 2>&1 || true
	node -e '
		const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
		const ap = r.run.executions.filter(e => /\/ap\/v1\//.test(e.request.url.path ? "/" + e.request.url.path.join("/") : ""));
		const open = ap.filter(e => !e.response || e.response.code !== 401);
		if (ap.length === 0 || open.length > 0) {
			console.error("postman.sh: FAIL: without a key, " + open.length + " of " + ap.length + " Agent Protocol requests were not refused with 401");
			process.exit(1);
		}
		console.log("postman.sh: token access: all " + ap.length + " Agent Protocol requests without a key got 401");
	' "$work/anonymous.json"
	node -e '
		const fs = require("fs");
		const c = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
		c.auth = { type: "bearer", bearer: [{ key: "token", value: "{{token}}", type: "string" }] };
		fs.writeFileSync(process.argv[1], JSON.stringify(c));
	' "$work/collection.json"
	auth_args=(--env-var "token=$key")
fi

rc=0
"$newman" run "$work/collection.json" "${auth_args[@]}" \
	--env-var "url=http://$addr" \
	--working-dir "$work/newman" \
	--reporters cli,json \
	--reporter-json-export "$work/report.json" \
	--color off || rc=$?

# newman's exit code alone is not enough: a collection that ran no
# assertion (emptied, or every test skipped) also exits 0.
node -e '
	const fs = require("fs");
	let r;
	try { r = JSON.parse(fs.readFileSync(process.argv[1], "utf8")); }
	catch (e) { console.error("postman.sh: FAIL: no newman JSON report: " + e.message); process.exit(1); }
	const s = r.run.stats, bad = [];
	if (!(s.assertions.total > 0)) bad.push("the suite ran " + s.assertions.total + " assertions, want more than 0");
	if (s.assertions.failed > 0) bad.push(s.assertions.failed + " of " + s.assertions.total + " assertions failed");
	if (s.requests.failed > 0) bad.push(s.requests.failed + " requests failed");
	if (s.testScripts.failed > 0 || s.prerequestScripts.failed > 0) bad.push("scripts failed: " + s.testScripts.failed + " test, " + s.prerequestScripts.failed + " pre-request");
	if (r.run.failures.length > 0) bad.push(r.run.failures.length + " failures reported");
	if (bad.length) { console.error("postman.sh: FAIL: " + bad.join("; ")); process.exit(1); }
	console.log("postman.sh: " + s.assertions.total + " assertions in " + s.requests.total + " requests, all passed");
' "$work/report.json" || rc=1
exit "$rc"
