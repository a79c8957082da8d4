package schema

import (
	"os"
	"path/filepath"
	"testing"
)

// TestCompile_refusesExternalRefs proves a schema cannot make the
// negotiator read a local file through $ref.
func TestCompile_refusesExternalRefs(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(secret, []byte(`{"type":"string"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"file://" + secret, secret} {
		if _, err := Compile([]byte(`{"$ref":"` + ref + `"}`)); err == nil {
			t.Errorf("Compile($ref %q) succeeded, want it refused", ref)
		}
	}
}
