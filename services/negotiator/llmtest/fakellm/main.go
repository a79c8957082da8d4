// Command fakellm is a test fixture, not a product: it runs llmtest's
// scripted FakeServer as a process, for end-to-end tests that start
// `parley serve --llm-provider openai --llm-base-url <url>/v1`. It logs one
// JSON line {"msg":"listening","http":"127.0.0.1:port"} on stderr, then
// serves until killed. GET /fake/stats answers the successful calls and
// their tokens (llmtest.Stats), to compare with a ledger. Run one per
// server so that each ledger has its own fake to match.
//
// It never reasons: it recognises which prompt the negotiator wrote (by
// its instructions) and answers from a script, statelessly, so one script
// serves both sides of the paper's weather story:
//
//   - reply prompts: with a tool on offer and no tool result yet it asks
//     for the first tool with {"date":"2024-05-01","location":"Paris"};
//     with a tool result it replies in words quoting it; otherwise "I do
//     not know.";
//   - query prompts (natural language) get a sentence quoting the task
//     input;
//   - negotiation turns replay llmtest.WeatherNegotiation: the sender's
//     first turn proposes the draft, the receiver counters with the
//     canonical weather PD, the sender's later turns accept it;
//   - routine prompts answer llmtest.WeatherSenderRoutine or
//     llmtest.WeatherReceiverRoutine for the first tool listed.
//
// Any other prompt gets HTTP 400.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/parleyhq/parley/services/negotiator/llmtest"
)

var toolName = regexp.MustCompile(`(?m)^- ([A-Za-z_][A-Za-z0-9_]*)\b`)

func firstTool(text string) string {
	if m := toolName.FindStringSubmatch(text); m != nil {
		return m[1]
	}
	return "tool"
}

func respond(c llmtest.Call) llmtest.Reply {
	var text strings.Builder
	for _, m := range c.Messages {
		text.WriteString(m.Content)
	}
	t := text.String()
	reply := func(body string) llmtest.Reply {
		b, _ := json.Marshal(map[string]any{"action": "reply", "body": body})
		return llmtest.Reply{Text: string(b)}
	}
	turns := llmtest.WeatherNegotiation()
	switch {
	case strings.Contains(c.System, "You negotiate a protocol document"):
		switch {
		case strings.Contains(c.System, "You are the receiver"):
			return turns[1]
		case strings.Contains(c.System, "Draft the first PD"):
			return turns[0]
		}
		return turns[2]
	case strings.Contains(c.System, "You write routines"):
		routines := llmtest.WeatherRoutines(firstTool(t))
		if strings.Contains(c.System, "Define reply(query, memory)") {
			return routines[1]
		}
		return routines[0]
	case strings.Contains(c.System, "You write the query an agent sends"):
		input := t
		if i := strings.Index(t, "Task input: "); i >= 0 {
			input = strings.TrimSpace(strings.SplitN(t[i+len("Task input: "):], "\n", 2)[0])
		}
		return llmtest.Reply{Text: "Could you tell me the weather forecast for " + input + "?"}
	case !strings.Contains(c.System, `"action":"reply"`):
		return llmtest.Reply{Status: 400, Text: "fakellm does not know this prompt"}
	case strings.Contains(t, "Result of tool "):
		i := strings.Index(t, "Result of tool ")
		return reply("Here is what my tool says: " + strings.TrimSpace(t[i:]))
	case strings.Contains(c.System, "call_tool"):
		b, _ := json.Marshal(map[string]any{"action": "call_tool", "tool": firstTool(t), "arguments": map[string]string{"date": "2024-05-01", "location": "Paris"}})
		return llmtest.Reply{Text: string(b)}
	}
	return reply("I do not know.")
}

func main() {
	f, err := llmtest.NewFakeServer(respond)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	line, _ := json.Marshal(map[string]string{"msg": "listening", "http": strings.TrimPrefix(f.URL, "http://")})
	fmt.Fprintln(os.Stderr, string(line))
	select {}
}
