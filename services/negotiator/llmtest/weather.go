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
