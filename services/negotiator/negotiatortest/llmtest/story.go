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
//   - natural-language reply prompts: with a tool on offer and no tool
//     result yet it asks for the first tool with
//     {"date":"2024-05-01","location":"Paris"}; with a tool result it
//     replies in words quoting it; otherwise "I do not know.";
//   - reply prompts under a PD answer as WeatherReceiverRoutine does: the
//     first tool with the query's date and location, then the PD's reply
//     object (as a JSON string) built from the tool's result, so an
//     LLM-written routine in shadow agrees with it;
//   - query prompts get a sentence quoting the task input (natural
//     language), or under a PD the JSON object of the task's date and
//     location, as WeatherSenderRoutine's send writes it;
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
		if strings.Contains(c.System, "exactly as the protocol document prescribes") {
			var q weatherQuery
			_ = json.Unmarshal([]byte(input), &q)
			b, _ := json.Marshal(q)
			return Reply{Text: string(b)}
		}
		return Reply{Text: "Could you tell me the weather forecast for " + input + "?"}
	case !strings.Contains(c.System, `"action":"reply"`):
		return Reply{Status: http.StatusBadRequest, Text: "the weather story does not know this prompt"}
	case strings.Contains(c.System, "Reply exactly as the protocol document prescribes"):
		return weatherPDReply(c, t, reply)
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

// weatherQuery is the weather PD's query.
type weatherQuery struct {
	Date     string `json:"date"`
	Location string `json:"location"`
}

// quotedAfter returns the JSON string quoted on the line after prefix in
// text, unquoted ("" when there is none).
func quotedAfter(text, prefix string) string {
	i := strings.Index(text, prefix)
	if i < 0 {
		return ""
	}
	line := strings.SplitN(text[i+len(prefix):], "\n", 2)[0]
	var s string
	if json.Unmarshal([]byte(strings.TrimSpace(line)), &s) != nil {
		return ""
	}
	return s
}

// weatherPDReply answers a reply prompt under the weather PD the way
// WeatherReceiverRoutine does.
func weatherPDReply(c Call, t string, reply func(string) Reply) Reply {
	if !strings.Contains(t, "Result of tool ") {
		var q weatherQuery
		body := quotedAfter(t, "Untrusted query body: ")
		if json.Unmarshal([]byte(body), &q) != nil {
			// A query body sent as a JSON string holding the object.
			var inner string
			if json.Unmarshal([]byte(body), &inner) == nil {
				_ = json.Unmarshal([]byte(inner), &q)
			}
		}
		if !strings.Contains(c.System, "call_tool") {
			return reply(`{"error":"Unsupported location"}`)
		}
		b, _ := json.Marshal(map[string]any{"action": "call_tool", "tool": firstTool(t), "arguments": q})
		return Reply{Text: string(b)}
	}
	var r map[string]any
	_ = json.Unmarshal([]byte(quotedAfter(t, "(untrusted): ")), &r)
	if r == nil || r["error"] != nil || r["temperature"] == nil {
		return reply(`{"error":"Unsupported location"}`)
	}
	cond, ok := r["weatherCondition"]
	if !ok {
		cond = r["weather_condition"]
	}
	precip, ok := r["precipitation"]
	if !ok {
		precip = 0
	}
	b, _ := json.Marshal(map[string]any{"temperature": r["temperature"], "precipitation": precip, "weatherCondition": cond})
	return reply(string(b))
}
