package llmtest

import (
	"encoding/json"
	"regexp"
	"strings"

	"github.com/parleyhq/parley/services/negotiator/internal/schema"
)

var toolLine = regexp.MustCompile(`(?m)^- ([A-Za-z0-9_.-]+): `)

// Conversational answers like a cooperative agent model, well enough to
// drive the negotiator's natural-language paths in tests and benchmarks:
//
//   - a reply request that may call tools and has no tool result yet asks
//     for the first listed tool with empty arguments (the caller's tool
//     knows what to answer);
//   - a reply request with results (or without tools) replies: a sentence
//     when the body is text, else an example of the body schema;
//   - any other structured request gets the first example of its schema
//     (suitability verdicts come out {"fit":true,...});
//   - an unstructured request gets a sentence.
//
// It is a fixture: it reads the prompts the negotiator writes and has no
// other intelligence.
func Conversational(c Call) Reply {
	if !c.Structured || len(c.Schema) == 0 {
		return Reply{Text: "Could you tell me the weather forecast for Paris on 2024-10-15? I need the temperature in degrees Celsius, the precipitation in millimetres and whether it will be sunny, cloudy, rainy or snowy."}
	}
	var s struct {
		Properties struct {
			Action struct {
				Enum []string `json:"enum"`
			} `json:"action"`
			Body json.RawMessage `json:"body"`
		} `json:"properties"`
	}
	_ = json.Unmarshal(c.Schema, &s)
	if len(s.Properties.Action.Enum) > 0 && s.Properties.Action.Enum[0] == "reply" {
		var user strings.Builder
		for _, m := range c.Messages {
			user.WriteString(m.Content)
		}
		tool := toolLine.FindStringSubmatch(user.String())
		canCall := len(s.Properties.Action.Enum) > 1 && tool != nil
		if canCall && !strings.Contains(user.String(), "Result of tool") {
			b, _ := json.Marshal(map[string]any{"action": "call_tool", "tool": tool[1], "arguments": map[string]any{}})
			return Reply{Text: string(b)}
		}
		var body any = "Tomorrow in Paris it will be sunny, 22 degrees Celsius, with no precipitation."
		if typ := string(s.Properties.Body); typ != "" && !strings.Contains(typ, `"type":"string"`) {
			body = json.RawMessage(example(s.Properties.Body))
		}
		b, _ := json.Marshal(map[string]any{"action": "reply", "body": body})
		return Reply{Text: string(b)}
	}
	return Reply{Text: example(c.Schema)}
}

func example(raw json.RawMessage) string {
	sch, err := schema.Compile(raw)
	if err != nil {
		return "{}"
	}
	return string(sch.Examples()[0])
}
