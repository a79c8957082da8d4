package agora

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

func TestParse_tolerantReader(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		hash      string
		form      HashForm
		sources   int
		body      string
		multi     bool
		malformed bool
	}{
		{"no keys", `{"body":"hi"}`, "", HashNone, 0, `"hi"`, false, false},
		{"null hash and sources", `{"protocolHash":null,"protocolSources":null,"body":"hi"}`, "", HashNone, 0, `"hi"`, false, false},
		{"empty sources", `{"protocolHash":null,"protocolSources":[],"body":{}}`, "", HashNone, 0, `{}`, false, false},
		{"[null] sources", `{"protocolHash":null,"protocolSources":[null],"body":1}`, "", HashNone, 0, `1`, false, false},
		{"hex upper case", `{"protocolHash":"3A732BDE0E63D2E838D1A722FEEBF3D67B52B211","protocolSources":["https://x",null,"",5]}`, "3a732bde0e63d2e838d1a722feebf3d67b52b211", HashHex, 1, `null`, false, false},
		{"base64", `{"protocolHash":"OnMr3g5j0ug40aci/uvz1ntSshE=","body":"x","multiround":true,"queryId":"q"}`, "3a732bde0e63d2e838d1a722feebf3d67b52b211", HashBase64, 0, `"x"`, true, false},
		{"negotiation", `{"protocolHash":"negotiation","protocolSources":null,"body":"x"}`, "", HashNegotiation, 0, `"x"`, false, false},
		{"bad hash", `{"protocolHash":"abc"}`, "", HashNone, 0, "", false, true},
		{"hash not a string", `{"protocolHash":1}`, "", HashNone, 0, "", false, true},
		{"sources not a list", `{"protocolSources":"x"}`, "", HashNone, 0, "", false, true},
		{"not an object", `"x"`, "", HashNone, 0, "", false, true},
		{"not JSON", `{`, "", HashNone, 0, "", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := Parse([]byte(tt.in))
			if tt.malformed {
				if !errors.Is(err, ErrMalformed) {
					t.Errorf("Parse(%s) = %v, want ErrMalformed", tt.in, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%s) = %v", tt.in, err)
			}
			if e.HexHash() != tt.hash || e.Form != tt.form || len(e.Sources) != tt.sources || string(e.Body) != tt.body || e.Multiround != tt.multi {
				t.Errorf("Parse(%s) = hash %q form %v sources %v body %s multi %v; want %q %v %d %s %v",
					tt.in, e.HexHash(), e.Form, e.Sources, e.Body, e.Multiround, tt.hash, tt.form, tt.sources, tt.body, tt.multi)
			}
		})
	}
}

func TestQueryAndBodyAs(t *testing.T) {
	q, wasString := Query([]byte(`"{\"a\": 1}"`))
	if string(q) != `{"a": 1}` || !wasString {
		t.Errorf("Query(string holding JSON) = %s %v", q, wasString)
	}
	if q, wasString := Query([]byte(`"plain text"`)); string(q) != `"plain text"` || wasString {
		t.Errorf("Query(plain string) = %s %v", q, wasString)
	}
	if got := string(BodyAs([]byte(`{"a":1}`), true)); got != `"{\"a\":1}"` {
		t.Errorf("BodyAs(object, string) = %s", got)
	}
	if got := string(BodyAs([]byte(`{"a":1}`), false)); got != `{"a":1}` {
		t.Errorf("BodyAs(object, raw) = %s", got)
	}
}

func TestDialectReplies(t *testing.T) {
	conv := &Conversation{ID: "abc", Expires: 42}
	tests := []struct {
		name string
		got  Reply
		code int
		want string
	}{
		{"spec2024 success", Spec2024.Success([]byte(`"x"`), nil), 200, `{"status":"success","body":"x"}`},
		{"success in conversation", Std.Success([]byte(`1`), conv), 200, `{"status":"success","body":1,"conversationId":"abc","conversationExpires":42}`},
		{"spec2024 rejected", Spec2024.Unsupported("h"), 200, `{"status":"rejected"}`},
		{"std unsupported", Std.Unsupported("h"), 200, `{"status":"failure","error":"Unsupported protocol"}`},
		{"spec2024 failure", Spec2024.Failure("m", nil), 200, `{"status":"failure","body":"m","error":"m"}`},
		{"pylib failure", Pylib.Failure("m", nil), 200, `{"status":"failure","body":null,"error":"m","message":"m"}`},
		{"std malformed", Std.Malformed("m"), 400, `{"status":"failure","body":"m","error":"m"}`},
		{"pylib malformed", Pylib.Malformed("m"), 200, `{"status":"error","body":null,"error":"m","message":"m"}`},
		{"unknown conversation", Spec2024.UnknownConversation(), 404, `{"status":"failure","body":"Conversation not found","error":"Conversation not found"}`},
		{"pylib ended", Pylib.Ended(), 200, `{"status":"success","body":null}`},
		{"std fault", Std.Fault("m", false), 500, `{"status":"failure","error":"m"}`},
		{"std fault in a follow-up", Std.Fault("m", true), 500, `{"status":"failure","error":"m"}`},
		{"spec2024 fault", Spec2024.Fault("m", false), 503, `{"status":"failure","body":"m","error":"m"}`},
		{"pylib fault on POST /", Pylib.Fault("m", false), 200, `{"status":"error","body":null,"error":"m","message":"m"}`},
		{"pylib fault in a follow-up", Pylib.Fault("m", true), 500, `{"status":"error","body":null,"error":"m","message":"m"}`},
	}
	for _, tt := range tests {
		if tt.got.Status != tt.code || string(tt.got.Body) != tt.want {
			t.Errorf("%s = %d %s, want %d %s", tt.name, tt.got.Status, tt.got.Body, tt.code, tt.want)
		}
	}
}

// The member scanner must read exactly what json.Unmarshal reads.
var scanCorpus = []string{
	`{}`, ` { } `, `{"body":"hi"}`, `{"body" : { "a" : [1, "}", {"b": "]"}] } , "x": 1}`,
	`{"protocolHash":"3a73","protocolSources":["a","b\"c"],"body":"{\"q\": 1}","multiround":true}`,
	`{"PROTOCOLHASH":"x","Body":1}`, `{"protocolHash":"x","protocolhash":"y"}`, `{"body":1,"body":2}`,
	`{"bod\u0079":"escaped key"}`, `{"\u017fomething":1,"mult\u0130round":true}`, `{"body":null,"multiround":false}`,
	`{"body":-1.5e+3,"other":[[],{}],"multiround":true}`, `{"body":"caf\u00e9 ☕","protocolSources":[null]}`,
	`{"a":{"b":{"c":{"d":[1,2,[3,"\\"]]}}},"body":true}`, "{\"body\":\t\"x\"\n}",
}

func TestScan_matchesEncodingJSON(t *testing.T) {
	for _, doc := range scanCorpus {
		checkScan(t, doc)
	}
}

func FuzzScan(f *testing.F) {
	for _, doc := range scanCorpus {
		f.Add(doc)
	}
	f.Fuzz(func(t *testing.T, doc string) { checkScan(t, doc) })
}

func checkScan(t *testing.T, doc string) {
	t.Helper()
	data := bytes.TrimSpace([]byte(doc))
	var want wireEnvelope
	if len(data) == 0 || data[0] != '{' || json.Unmarshal(data, &want) != nil {
		return // Parse never scans these
	}
	var got wireEnvelope
	if !got.scan(data) {
		t.Fatalf("scan(%s) = false, want it to read a valid object", doc)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("scan(%s) = %+v, want %+v", doc, got, want)
	}
}
