package pagetoken

import (
	"errors"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	tok := Encode("protocols/abc", "filter=x")
	got, err := Decode(tok, "filter=x")
	if err != nil || got != "protocols/abc" {
		t.Fatalf("Decode(Encode(k)) = %q, %v; want protocols/abc, nil", got, err)
	}
}

func TestDecode_rejects(t *testing.T) {
	tests := []struct {
		name, token string
		params      []string
	}{
		{"garbage", "!!!", nil},
		{"changed parameters", Encode("k", "a"), []string{"b"}},
		{"short", "AQ", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Decode(tt.token, tt.params...); !errors.Is(err, ErrInvalid) {
				t.Errorf("Decode(%q) error = %v, want ErrInvalid", tt.token, err)
			}
		})
	}
}

func TestSize(t *testing.T) {
	tests := []struct {
		in     int32
		want   int
		wantOK bool
	}{{0, 50, true}, {5, 5, true}, {5000, 1000, true}, {-1, 0, false}}
	for _, tt := range tests {
		got, ok := Size(tt.in, 50, 1000)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("Size(%d) = %d, %v; want %d, %v", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}
