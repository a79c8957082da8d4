// Command fakellm is a test fixture, not a product: it runs llmtest's
// scripted FakeServer as a process, for end-to-end tests that start
// `parley serve --llm-provider openai --llm-base-url <url>/v1`. It logs one
// JSON line {"msg":"listening","http":"127.0.0.1:port"} on stderr, then
// serves until killed.
//
// Its one script answers reply prompts: with a tool on offer and no tool
// result yet it asks for the first tool with {"date":"2024-05-01",
// "location":"Paris"}; with a tool result it replies in words quoting it;
// otherwise it replies "I do not know.". Any other prompt gets an error.
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
	switch {
	case !strings.Contains(c.System, `"action":"reply"`):
		return llmtest.Reply{Status: 400, Text: "fakellm only answers reply prompts"}
	case strings.Contains(t, "Result of tool "):
		i := strings.Index(t, "Result of tool ")
		return reply("Here is what my tool says: " + strings.TrimSpace(t[i:]))
	case strings.Contains(c.System, "call_tool"):
		name := "tool"
		if m := toolName.FindStringSubmatch(t); m != nil {
			name = m[1]
		}
		b, _ := json.Marshal(map[string]any{"action": "call_tool", "tool": name, "arguments": map[string]string{"date": "2024-05-01", "location": "Paris"}})
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
