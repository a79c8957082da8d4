package schema_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/parleyhq/parley/platform/jsondepth"
	"github.com/parleyhq/parley/services/negotiator/internal/schema"
)

func TestCanonical(t *testing.T) {
	tests := []struct {
		name, in, want string
		wantErr        bool
	}{
		{name: "sorted keys, no spaces", in: `{ "b": 1.50, "a": ["<x>", {"d": true, "c": null}] }`, want: `{"a":["<x>",{"c":null,"d":true}],"b":1.50}`},
		{name: "trailing data", in: `{} {}`, wantErr: true},
		{name: "not JSON", in: `{`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := schema.Canonical([]byte(tt.in))
			if (err != nil) != tt.wantErr || (err != nil && !errors.Is(err, schema.ErrInvalid)) {
				t.Fatalf("Canonical(%s) error = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if string(got) != tt.want {
				t.Errorf("Canonical(%s) = %s, want %s", tt.in, got, tt.want)
			}
		})
	}
}

func TestExamples_validAgainstTheirSchema(t *testing.T) {
	for _, raw := range []string{
		`{"type":"object","required":["date"],"properties":{"date":{"type":"string","format":"date"},"n":{"type":"integer","minimum":3},"tags":{"type":"array","items":{"enum":["a","b"]}},"ok":{"type":"boolean"}}}`,
		`{"anyOf":[{"type":"object","required":["x"],"properties":{"x":{"type":"number"}}},{"type":"string"}]}`,
	} {
		s, err := schema.Compile([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		exs := s.Examples()
		if len(exs) == 0 {
			t.Fatalf("no examples for %s", raw)
		}
		for _, ex := range exs {
			if err := s.Validate(ex); err != nil {
				t.Errorf("example %s of %s is invalid: %v", ex, raw, err)
			}
		}
	}
	if _, err := schema.Compile([]byte(`[1]`)); !errors.Is(err, schema.ErrInvalid) {
		t.Errorf("Compile(array) = %v, want ErrInvalid", err)
	}
}

// Schemas and instances nested past jsondepth.Max are refused before the
// recursive decoder and compiler see them.
func TestNesting_refusedPastTheLimit(t *testing.T) {
	deep := []byte(strings.Repeat(`{"not":`, 65) + `{}` + strings.Repeat(`}`, 65))
	if _, err := schema.Compile(deep); !errors.Is(err, schema.ErrInvalid) || !errors.Is(err, jsondepth.ErrTooDeep) {
		t.Errorf("Compile(65 levels) = %v, want ErrInvalid and ErrTooDeep", err)
	}
	if _, err := schema.Canonical(deep); !errors.Is(err, jsondepth.ErrTooDeep) {
		t.Errorf("Canonical(65 levels) = %v, want ErrTooDeep", err)
	}
	s, err := schema.Compile([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Validate([]byte(strings.Repeat(`[`, 65) + strings.Repeat(`]`, 65))); !errors.Is(err, jsondepth.ErrTooDeep) {
		t.Errorf("Validate(65 levels) = %v, want ErrTooDeep", err)
	}
	if err := s.Validate([]byte(strings.Repeat(`[`, 64) + strings.Repeat(`]`, 64))); err != nil {
		t.Errorf("Validate(64 levels) = %v, want nil", err)
	}
}
