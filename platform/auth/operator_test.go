package auth

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
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
		{"group writable", good, 0o660},
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
}

// TestLoadOperatorToken_sharedFileWrittenOnce: --operator-token-file
// naming a missing file (a volume the services of a deployment share)
// writes it once; the next process reads the same token. A Secret mounted
// group-readable (0440) is accepted.
func TestLoadOperatorToken_sharedFileWrittenOnce(t *testing.T) {
	file := filepath.Join(t.TempDir(), "operator.token")
	tok, got, created, err := LoadOperatorToken(file, "")
	if err != nil || !created || got != file || !validOperatorToken(tok) {
		t.Fatalf("LoadOperatorToken(missing shared file) = %q, %q, %v, %v", tok, got, created, err)
	}
	again, _, created, err := LoadOperatorToken(file, "")
	if err != nil || created || again != tok {
		t.Errorf("LoadOperatorToken(shared file, second process) = %q, created %v, %v; want the same token", again, created, err)
	}
	if err := os.Chmod(file, 0o440); err != nil {
		t.Fatal(err)
	}
	if again, _, _, err := LoadOperatorToken(file, ""); err != nil || again != tok {
		t.Errorf("LoadOperatorToken(0440, a Secret mounted for fsGroup) = %v; want it read", err)
	}
}

// TestLoadOperatorToken_concurrentStartsShareOneToken: services started
// together on one shared file all read one token, and none reads a
// half-written file.
func TestLoadOperatorToken_concurrentStartsShareOneToken(t *testing.T) {
	for range 20 {
		file := filepath.Join(t.TempDir(), "operator.token")
		const n = 8
		tokens, errs := make([]string, n), make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { tokens[i], _, _, errs[i] = LoadOperatorToken(file, "") })
		}
		wg.Wait()
		for i := range n {
			if errs[i] != nil || tokens[i] != tokens[0] {
				t.Fatalf("start %d = %v (same token as start 0: %v)", i, errs[i], tokens[i] == tokens[0])
			}
		}
	}
}
