package sdk_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestExample_buildsOutsideTheRepo builds example/weather as a user would
// outside this repository: a fresh module in a temporary directory, with
// the go.mod that README.md shows (its /path/to/parley replaced by this
// clone), no go.work, and the SDK's go.sum. GOPROXY and the module cache
// are the caller's, so the test runs offline once the cache holds the
// SDK's dependencies.
func TestExample_buildsOutsideTheRepo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build in a temporary module")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "```go.mod\n")
	if !ok {
		t.Fatal("README.md has no ```go.mod block")
	}
	gomod, _, _ := strings.Cut(block, "```")
	if !strings.Contains(gomod, "/path/to/parley/sdk") || !strings.Contains(gomod, "/path/to/parley/gen") {
		t.Fatalf("the README's go.mod lacks replace lines for sdk and gen:\n%s", gomod)
	}
	gomod = strings.ReplaceAll(gomod, "/path/to/parley", root)

	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join("example", "weather", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"go.mod": []byte(gomod), "go.sum": sum, "main.go": src} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "myagent")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = dir
	// GOWORK=off: outside the repo there is no workspace. -mod=mod lets go
	// record what go.sum lacks, as `go mod tidy` would for the user.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build of the example outside the repo: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "-server") {
		t.Errorf("myagent --help = %v\n%s; want exit 0 and the --server flag", err, out)
	}
}
