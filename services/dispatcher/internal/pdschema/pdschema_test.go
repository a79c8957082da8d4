package pdschema

import "testing"

func TestCompile(t *testing.T) {
	const obj = `{"type":"object","required":["a"]}`
	tests := []struct {
		name          string
		req, resp     string
		body          string
		reqOK, respOK bool
		wantErr       bool
	}{
		{"request schema, body matches", obj, "", `{"a":1}`, true, true, false},
		{"request schema, body does not match", obj, "", `{"b":1}`, false, true, false},
		{"response schema", "", `{"type":"string"}`, `5`, true, false, false},
		{"no schemas", "", "", `5`, true, true, false},
		{"draft 2020-12 by default", `{"prefixItems":[{"type":"integer"}]}`, "", `["x"]`, false, true, false},
		{"not JSON", `{"type":`, "", `5`, false, false, true},
		{"not a schema", `{"type":5}`, "", `5`, false, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Compile(tt.req, tt.resp)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Compile = %v, want error %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if got := Validate(s.Request, []byte(tt.body)) == nil; got != tt.reqOK {
				t.Errorf("Validate(request, %s) ok = %v, want %v", tt.body, got, tt.reqOK)
			}
			if got := Validate(s.Response, []byte(tt.body)) == nil; got != tt.respOK {
				t.Errorf("Validate(response, %s) ok = %v, want %v", tt.body, got, tt.respOK)
			}
		})
	}
}

func TestCache_compilesOncePerHash(t *testing.T) {
	c := NewCache(2)
	a1, err := c.Compile("h1", `{"type":"integer"}`, "")
	if err != nil {
		t.Fatal(err)
	}
	// The same hash is never recompiled, whatever JSON comes with it.
	a2, _ := c.Compile("h1", `{"type":"string"}`, "")
	if a1.Request != a2.Request {
		t.Errorf("Compile(h1) twice gave two schemas, want the cached one")
	}
	if _, err := c.Compile("h2", `{"type":5}`, ""); err == nil {
		t.Errorf("Compile(h2, broken) = nil error, want one")
	}
	if _, err := c.Compile("h2", `{"type":"string"}`, ""); err == nil {
		t.Errorf("Compile(h2) again = nil error, want the cached error")
	}
	_, _ = c.Compile("h3", "", "") // over the bound: the cache starts over
	if got, _ := c.Compile("h1", `{"type":"string"}`, ""); got.Request == a1.Request {
		t.Errorf("Compile(h1) after eviction = the old schema, want a fresh compile")
	}
}
