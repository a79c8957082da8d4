package pdschema

import "testing"

func TestParse(t *testing.T) {
	tests := []struct {
		name             string
		pd               string
		body             string
		reqOK, respOK    bool
		wantErr, anySchm bool
	}{
		{"layout A mapping", "---\nname: x\nrequest_schema:\n  type: object\n  required: [a]\n---\ntext", `{"a":1}`, true, true, false, true},
		{"layout A mapping, bad body", "---\nname: x\nrequest_schema:\n  type: object\n  required: [a]\n---\ntext", `{"b":1}`, false, true, false, true},
		{"layout B JSON string", "name: x\nresponseSchema: '{\"type\":\"string\"}'\n---\ntext", `5`, true, false, false, true},
		{"no metadata", "just text", `5`, true, true, false, false},
		{"no schemas", "---\nname: x\n---\ntext", `5`, true, true, false, false},
		{"broken schema", "---\nrequest_schema: '{\"type\": 5}'\n---\n", `5`, true, true, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse([]byte(tt.pd))
			if (err != nil) != tt.wantErr {
				t.Fatalf("Parse = %v, want error %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if (s.Request != nil || s.Response != nil) != tt.anySchm {
				t.Errorf("Parse schemas = %+v, want any %v", s, tt.anySchm)
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
