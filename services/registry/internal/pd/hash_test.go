package pd

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

// weatherPD is the canonical weather PD of specs/agora.md, section 3: 464
// bytes, LF line ends, no final newline.
const weatherPD = `---
name: Weather Forecast Query Protocol
description: Query the weather forecast for a given date and location.
multiround: false
---

The sender sends a JSON object {"date": "YYYY-MM-DD", "location": string}.
The receiver replies with a JSON object {"temperature": number (degrees C), "precipitation": number (mm), "weatherCondition": one of "sunny", "cloudy", "rainy", "snowy"}.
If the location is unknown the receiver replies {"error": "Unsupported location"}.`

func TestSum_specVectors(t *testing.T) {
	tests := []struct {
		name, input, hex, base64, sha256 string
	}{
		{"empty", "", "da39a3ee5e6b4b0d3255bfef95601890afd80709", "2jmj7l5rSw0yVb/vlWAYkK/YBwk=", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"hello", "hello", "aaf4c61ddcc5e8a2dabede0f3b482cd9aea9434d", "qvTGHdzF6KLavt4PO0gs2a6pQ00=", "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"},
		{"weather", weatherPD, "3a732bde0e63d2e838d1a722feebf3d67b52b211", "OnMr3g5j0ug40aci/uvz1ntSshE=", "e3b1014f13cdc7f7e7a51ec6585d7c2a972ed35a3af51d9808fb4d9fe9f2ca6d"},
	}
	if len(weatherPD) != 464 {
		t.Fatalf("weather PD is %d bytes, want 464", len(weatherPD))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := Sum([]byte(tt.input))
			if got := h.Hex(); got != tt.hex {
				t.Errorf("Sum(%q).Hex() = %s, want %s", tt.name, got, tt.hex)
			}
			if got := h.Base64(); got != tt.base64 {
				t.Errorf("Sum(%q).Base64() = %s, want %s", tt.name, got, tt.base64)
			}
			s256 := Sum256([]byte(tt.input))
			if got := hex.EncodeToString(s256[:]); got != tt.sha256 {
				t.Errorf("Sum256(%q) = %s, want %s", tt.name, got, tt.sha256)
			}
			for _, form := range []string{tt.hex, strings.ToUpper(tt.hex), tt.base64, strings.NewReplacer("+", "%2B", "/", "%2F", "=", "%3D").Replace(tt.base64)} {
				got, err := ParseHash(form)
				if err != nil || got != h {
					t.Errorf("ParseHash(%q) = %v, %v; want %v", form, got, err, h)
				}
			}
		})
	}
}

func TestParseHash_rejectsMalformed(t *testing.T) {
	for _, s := range []string{
		"",
		"negotiation",
		"3a732bde0e63d2e838d1a722feebf3d67b52b21",   // 39
		"3a732bde0e63d2e838d1a722feebf3d67b52b2111", // 41
		"3a732bde0e63d2e838d1a722feebf3d67b52b21g",  // not hex
		"OnMr3g5j0ug40aci_uvz1ntSshE=",              // URL-safe alphabet
		"OnMr3g5j0ug40aci/uvz1ntSshE",               // unpadded
		"OnMr3g5j0ug40aci/uvz1ntSsh==",              // 19 bytes
		"%zz",
	} {
		if h, err := ParseHash(s); !errors.Is(err, ErrMalformedHash) {
			t.Errorf("ParseHash(%q) = %v, %v; want ErrMalformedHash", s, h, err)
		}
	}
}
