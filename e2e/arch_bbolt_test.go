package e2e

import (
	"errors"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// allowedBbolt matches the packages that may import go.etcd.io/bbolt: the
// shared skeleton and each service's bbolt backend. Everything else goes
// through a store.Store.
var allowedBbolt = regexp.MustCompile(`^github\.com/parleyhq/parley/(platform/boltdb|services/[a-z]+/internal/store/boltstore)$`)

// TestArch_onlyBoltstoresImportBbolt reads the workspace's import graph,
// test files included, and fails on any other package that imports bbolt.
func TestArch_onlyBoltstoresImportBbolt(t *testing.T) {
	checkImports(t, allowedBbolt, "go.etcd.io/bbolt", "only platform/boltdb and boltstore packages may import bbolt")
}

// checkImports fails t for each workspace package not matched by allowed
// that imports module, saying why.
func checkImports(t *testing.T, allowed *regexp.Regexp, module, why string) {
	t.Helper()
	violations, checked := importViolations(importGraph(t), allowed, module)
	if checked < 10 {
		t.Fatalf("go list returned %d of our packages; want the whole workspace", checked)
	}
	for _, v := range violations {
		t.Errorf("%s; %s", v, why)
	}
}

// TestArch_bboltRuleCatchesAViolation keeps the check above able to fail.
func TestArch_bboltRuleCatchesAViolation(t *testing.T) {
	graph := strings.Join([]string{
		"github.com/parleyhq/parley/platform/boltdb|go.etcd.io/bbolt go.etcd.io/bbolt/errors",
		"github.com/parleyhq/parley/services/tasks/internal/store/boltstore|go.etcd.io/bbolt  ",
		"github.com/parleyhq/parley/services/tasks/internal/server|context  go.etcd.io/bbolt",
		"github.com/parleyhq/parley/services/registry/app|go.etcd.io/bbolt/errors  ",
		"go.etcd.io/bbolt/errors|errors  ",
	}, "\n")
	got, _ := bboltViolations(graph)
	want := []string{
		"github.com/parleyhq/parley/services/tasks/internal/server imports go.etcd.io/bbolt",
		"github.com/parleyhq/parley/services/registry/app imports go.etcd.io/bbolt/errors",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("violations = %q, want %q", got, want)
	}
}

// bboltViolations reads lines of "package|imports..." and returns each of
// our packages that imports bbolt without being allowed to, and how many of
// our packages it saw.
func bboltViolations(graph string) (violations []string, ours int) {
	return importViolations(graph, allowedBbolt, "go.etcd.io/bbolt")
}

// importViolations reads lines of "package|imports..." and returns each of
// our packages not matched by allowed that imports module (or a package
// under it), and how many of our packages it saw.
func importViolations(graph string, allowed *regexp.Regexp, module string) (violations []string, ours int) {
	for line := range strings.Lines(graph) {
		pkg, imports, _ := strings.Cut(strings.TrimSpace(line), "|")
		if !strings.HasPrefix(pkg, "github.com/parleyhq/parley/") {
			continue
		}
		ours++
		if allowed.MatchString(pkg) {
			continue
		}
		for imp := range strings.FieldsSeq(imports) {
			if imp == module || strings.HasPrefix(imp, module+"/") {
				violations = append(violations, pkg+" imports "+imp)
			}
		}
	}
	return violations, ours
}

// importGraph lists every workspace package with its imports, test files'
// included, one "package|imports..." line each.
func importGraph(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f",
		`{{.ImportPath}}|{{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, "work").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	return string(out)
}
