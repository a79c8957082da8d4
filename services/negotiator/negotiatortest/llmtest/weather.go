package llmtest

import "encoding/json"

// WeatherPD is the canonical weather protocol document of the Agora paper
// and specs/agora.md section 3 (464 bytes, SHA-1 3a732bde…b211).
const WeatherPD = "---\nname: Weather Forecast Query Protocol\ndescription: Query the weather forecast for a given date and location.\nmultiround: false\n---\n\nThe sender sends a JSON object {\"date\": \"YYYY-MM-DD\", \"location\": string}.\nThe receiver replies with a JSON object {\"temperature\": number (degrees C), \"precipitation\": number (mm), \"weatherCondition\": one of \"sunny\", \"cloudy\", \"rainy\", \"snowy\"}.\nIf the location is unknown the receiver replies {\"error\": \"Unsupported location\"}."

// weatherDraft is the sender's first proposal: the canonical PD without the
// error rule, which the receiver adds in its counter.
const weatherDraft = "---\nname: Weather Forecast Query Protocol\ndescription: Query the weather forecast for a given date and location.\nmultiround: false\n---\n\nThe sender sends a JSON object {\"date\": \"YYYY-MM-DD\", \"location\": string}.\nThe receiver replies with a JSON object {\"temperature\": number (degrees C), \"precipitation\": number (mm), \"weatherCondition\": one of \"sunny\", \"cloudy\", \"rainy\", \"snowy\"}."

func turn(action, protocol, reason string) Reply {
	b, _ := json.Marshal(map[string]string{"action": action, "protocol": protocol, "reason": reason})
	return Reply{Text: string(b)}
}

// WeatherNegotiation is the paper's three-turn weather negotiation, as the
// structured turns the negotiator's LLM path expects: the sender proposes a
// draft, the receiver counters with the canonical PD (adding the error
// case), the sender accepts it.
func WeatherNegotiation() []Reply {
	return []Reply{
		turn("propose", weatherDraft, "I need tomorrow's weather for tour planning."),
		turn("counter", WeatherPD, "Added a reply for unknown locations."),
		turn("accept", WeatherPD, "The counter-proposal fits the task."),
	}
}

// WeatherSenderRoutine is the sender's routine the programming LLM writes
// for WeatherPD in the fixture: send(task) encodes the date and location,
// parse(reply) decodes the reply and fails on an error reply.
const WeatherSenderRoutine = `def send(task):
    t = task if type(task) == "dict" else {}
    return json.encode({"date": t.get("date", ""), "location": t.get("location", "")})

def parse(reply):
    r = json.decode(reply) if type(reply) == "string" else reply
    if type(r) == "dict" and "error" in r:
        fail(r["error"])
    return r
`

// WeatherReceiverRoutine is the receiver's routine the programming LLM
// writes for WeatherPD in the fixture, calling tool (a forecast lookup
// taking date and location, answering temperature, precipitation and
// weather_condition or weatherCondition).
func WeatherReceiverRoutine(tool string) string {
	return `def reply(query, memory):
    q = json.decode(query) if type(query) == "string" else query
    if type(q) != "dict":
        q = {}
    r = call_tool("` + tool + `", {"date": q.get("date", ""), "location": q.get("location", "")})
    if type(r) != "dict" or "error" in r or r.get("temperature") == None:
        return json.encode({"error": "Unsupported location"})
    cond = r.get("weatherCondition", r.get("weather_condition"))
    return json.encode({"temperature": r["temperature"], "precipitation": r.get("precipitation", 0), "weatherCondition": cond})
`
}

func source(src string) Reply {
	b, _ := json.Marshal(map[string]string{"source": src})
	return Reply{Text: string(b)}
}

// WeatherRoutines are the programming LLM's answers after WeatherNegotiation
// is accepted, in the order the negotiator asks when one fake serves both
// sides: the sender's routine (asked when the sender accepts), then the
// receiver's (asked when the accept reaches it).
func WeatherRoutines(tool string) []Reply {
	return []Reply{source(WeatherSenderRoutine), source(WeatherReceiverRoutine(tool))}
}
