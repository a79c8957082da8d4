package routine

import (
	"encoding/json"
	"testing"
)

// BenchmarkCall runs a reply routine typical of derived ones: string
// concatenation, a dict built from the query, a tool call and a format,
// through the allocation guards.
func BenchmarkCall(b *testing.B) {
	table, err := TableTool(`{"Paris": {"t": 7}}`)
	if err != nil {
		b.Fatal(err)
	}
	p, err := Compile(b.Context(), "r", `
def reply(query, memory):
    out = {}
    for k in ["a", "b", "c", "d"]:
        out[k + "_x"] = "v-" + k * 2
    out["w"] = weather(query["city"])
    out["s"] = "%s/%d" % (query["city"], len(out))
    return json.encode(out)
`, map[string]Tool{"weather": table}, Limits{Pool: NewPool(4)})
	if err != nil {
		b.Fatal(err)
	}
	args := []json.RawMessage{json.RawMessage(`{"city":"Paris"}`)}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := p.Call(b.Context(), "reply", args, json.RawMessage(`{}`)); err != nil {
			b.Fatal(err)
		}
	}
}
