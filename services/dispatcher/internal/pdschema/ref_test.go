package pdschema

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCompile_refusesExternalRefs proves a PD's schema cannot make the
// dispatcher read a local file through $ref.
func TestCompile_refusesExternalRefs(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(secret, []byte(`{"type":"string","title":"TOPSECRET"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"file://" + secret, secret, "https://example.invalid/s.json"} {
		_, err := Compile(`{"$ref":"`+ref+`"}`, "")
		if err == nil {
			t.Errorf("Compile($ref %q) succeeded, want it refused", ref)
			continue
		}
		if strings.Contains(err.Error(), "TOPSECRET") {
			t.Errorf("Compile($ref %q) error leaks the file: %v", ref, err)
		}
	}
}
