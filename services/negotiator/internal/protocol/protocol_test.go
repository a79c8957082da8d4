package protocol_test

import (
	"testing"

	"github.com/parleyhq/parley/services/negotiator/internal/protocol"
	"github.com/parleyhq/parley/services/negotiator/negotiatortest/llmtest"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		wantName string
		wantMeta bool
		wantText string
		wantReq  string
		wantErr  bool
	}{
		{name: "layout A", in: "---\nname: A\nmultiround: true\n---\nbody", wantName: "A", wantMeta: true, wantText: "body"},
		{name: "layout B", in: "name: B\n---\nbody", wantName: "B", wantMeta: true, wantText: "body"},
		{name: "no metadata", in: "just text", wantName: "Unnamed protocol", wantText: "just text"},
		{name: "schemas", in: "---\nname: S\nrequestSchema: {\"type\":\"object\"}\n---\n", wantName: "S", wantMeta: true, wantReq: `{"type":"object"}`},
		{name: "schema not an object", in: "---\nrequestSchema: 3\n---\n", wantErr: true},
		{name: "bad yaml", in: "---\nname: [\n---\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := protocol.Parse([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("Parse(%q) error = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if d.Name != tt.wantName || d.HasMetadata != tt.wantMeta || d.Text != tt.wantText || string(d.RequestSchema) != tt.wantReq {
				t.Errorf("Parse(%q) = %+v", tt.in, d)
			}
		})
	}
}

func TestHashes_weatherPD(t *testing.T) {
	pd := []byte(llmtest.WeatherPD)
	if len(pd) != 464 {
		t.Fatalf("weather PD is %d bytes, want 464", len(pd))
	}
	if got := protocol.SHA1Hex(pd); got != "3a732bde0e63d2e838d1a722feebf3d67b52b211" {
		t.Errorf("SHA1Hex = %s", got)
	}
	if got := protocol.SHA256Hex(pd); got != "e3b1014f13cdc7f7e7a51ec6585d7c2a972ed35a3af51d9808fb4d9fe9f2ca6d" {
		t.Errorf("SHA256Hex = %s", got)
	}
	d, err := protocol.Parse(pd)
	if err != nil || d.Name != "Weather Forecast Query Protocol" || d.Multiround {
		t.Errorf("Parse(weather) = %+v, %v", d, err)
	}
}
