package llmtest

import (
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
)

var storyTool = regexp.MustCompile(`(?m)^- ([A-Za-z_][A-Za-z0-9_]*)\b`)

func firstTool(text string) string {
	if m := storyTool.FindStringSubmatch(text); m != nil {
		return m[1]
	}
	return "tool"
}

// WeatherStory answers every prompt of the paper's weather story on both
// sides, statelessly, by recognising which prompt the negotiator wrote (by
// its instructions). It is a fixture and never reasons:
//
//   - reply prompts: with a tool on offer and no tool result yet it asks
//     for the first tool with {"date":"2024-05-01","location":"Paris"};
//     with a tool result it replies in words quoting it; otherwise "I do
//     not know.";
//   - query prompts (natural language) get a sentence quoting the task
//     input;
//   - negotiation turns replay WeatherNegotiation: the sender's first turn
//     proposes the draft, the receiver counters with WeatherPD, the
//     sender's later turns accept it;
//   - routine prompts answer WeatherSenderRoutine or
//     WeatherReceiverRoutine for the first tool listed.
//
// Any other prompt gets HTTP 400.
func WeatherStory(c Call) Reply {
	var text strings.Builder
	for _, m := range c.Messages {
		text.WriteString(m.Content)
	}
	t := text.String()
	reply := func(body string) Reply {
		b, _ := json.Marshal(map[string]any{"action": "reply", "body": body})
		return Reply{Text: string(b)}
	}
	turns := WeatherNegotiation()
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
		routines := WeatherRoutines(firstTool(t))
		if strings.Contains(c.System, "Define reply(query, memory)") {
			return routines[1]
		}
		return routines[0]
	case strings.Contains(c.System, "You write the query an agent sends"):
		input := t
		if i := strings.Index(t, "Task input: "); i >= 0 {
			input = strings.TrimSpace(strings.SplitN(t[i+len("Task input: "):], "\n", 2)[0])
		}
		return Reply{Text: "Could you tell me the weather forecast for " + input + "?"}
	case !strings.Contains(c.System, `"action":"reply"`):
		return Reply{Status: http.StatusBadRequest, Text: "the weather story does not know this prompt"}
	case strings.Contains(t, "Result of tool "):
		i := strings.Index(t, "Result of tool ")
		return reply("Here is what my tool says: " + strings.TrimSpace(t[i:]))
	case strings.Contains(c.System, "call_tool"):
		b, _ := json.Marshal(map[string]any{"action": "call_tool", "tool": firstTool(t), "arguments": map[string]string{"date": "2024-05-01", "location": "Paris"}})
		return Reply{Text: string(b)}
	}
	return reply("I do not know.")
}

// StoryKind names the kind of prompt c is in WeatherStory's terms:
// "negotiation", "programming" or "conversation".
func StoryKind(c Call) string {
	switch {
	case strings.Contains(c.System, "You negotiate a protocol document"):
		return "negotiation"
	case strings.Contains(c.System, "You write routines"):
		return "programming"
	}
	return "conversation"
}
