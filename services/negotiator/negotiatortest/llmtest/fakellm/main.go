// Command fakellm is a test fixture, not a product: it runs llmtest's
// scripted FakeServer as a process, for end-to-end tests that start
// `parley serve --llm-provider openai --llm-base-url <url>/v1`. It logs one
// JSON line {"msg":"listening","http":"127.0.0.1:port"} on stderr, then
// serves until killed. GET /fake/stats answers the successful calls and
// their tokens (llmtest.Stats), to compare with a ledger; run one per
// server so that each ledger has its own fake to match.
//
// Its script is llmtest.WeatherStory: natural-language replies with a tool
// call, the paper's three-turn weather negotiation (either side), and the
// routines the programming LLM writes for the agreed PD.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/parleyhq/parley/services/negotiator/negotiatortest/llmtest"
)

func main() {
	f, err := llmtest.NewFakeServer(llmtest.WeatherStory)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	line, _ := json.Marshal(map[string]string{"msg": "listening", "http": strings.TrimPrefix(f.URL, "http://")})
	fmt.Fprintln(os.Stderr, string(line))
	select {}
}
