package auth

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadOperatorToken_createsOnceThenReads(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	tok, file, created, err := LoadOperatorToken("", dir)
	if err != nil || !created || !validOperatorToken(tok) || file != filepath.Join(dir, OperatorTokenFile) {
		t.Fatalf("LoadOperatorToken(first start) = %q, %q, %v, %v", tok, file, created, err)
	}
	info, err := os.Stat(file)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("token file mode = %v, %v; want 0600", info.Mode().Perm(), err)
	}
	again, _, created, err := LoadOperatorToken("", dir)
	if err != nil || created || again != tok {
		t.Errorf("LoadOperatorToken(second start) = %q, created %v, %v; want the same token, not created", again, created, err)
	}
	viaFlag, _, _, err := LoadOperatorToken(file, t.TempDir())
	if err != nil || viaFlag != tok {
		t.Errorf("LoadOperatorToken(--operator-token-file) = %q, %v; want the file's token", viaFlag, err)
	}
}

func TestLoadOperatorToken_refusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	good, _ := NewOperatorToken()
	tests := []struct {
		name    string
		content string
		mode    os.FileMode
	}{
		{"world readable", good, 0o644},
		{"not a token", "hunter2", 0o600},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-"))
			if err := os.WriteFile(p, []byte(tt.content), tt.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, tt.mode); err != nil {
				t.Fatal(err)
			}
			_, _, _, err := LoadOperatorToken(p, dir)
			if err == nil {
				t.Fatalf("LoadOperatorToken(%s) succeeded, want refused", tt.name)
			}
			if strings.Contains(err.Error(), good) {
				t.Errorf("error holds the token: %v", err)
			}
		})
	}
	if _, _, _, err := LoadOperatorToken(filepath.Join(dir, "missing"), dir); err == nil {
		t.Errorf("LoadOperatorToken(missing --operator-token-file) succeeded, want an error")
	}
}
