package e2e

import (
	"bufio"
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const modulePrefix = "github.com/parleyhq/parley/"

// goListDeps returns, for every package in the dependency closure of
// patterns (run from the repository root, so go.work applies), its direct
// imports.
func goListDeps(t *testing.T, patterns ...string) map[string][]string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"list", "-deps", "-test", "-f", "{{.ImportPath}} {{join .Imports \" \"}}"}, patterns...)
	cmd := exec.CommandContext(t.Context(), "go", args...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	graph := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 0 {
			graph[fields[0]] = fields[1:]
		}
	}
	return graph
}

// TestArch_dispatcherCoreHasNoGRPC: the dispatcher's concept packages
// (issue 9: the core apart from its transport) and every package of ours
// they depend on import no google.golang.org/grpc package; only
// internal/server, the adapter, does. (Generated message packages in gen/
// are types, not transport, and are outside this rule.)
func TestArch_dispatcherCoreHasNoGRPC(t *testing.T) {
	const base = modulePrefix + "services/dispatcher/internal/"
	concepts := []string{"inbound", "outbound", "hub", "shadow", "hosted", "negotiation", "directory", "llm", "cache", "metrics", "notify"}
	var patterns []string
	for _, c := range concepts {
		patterns = append(patterns, base+c)
	}
	graph := goListDeps(t, patterns...)
	for _, p := range patterns {
		if _, ok := graph[p]; !ok {
			t.Errorf("concept package %s is missing", p)
		}
	}
	for pkg, imports := range graph {
		if !strings.HasPrefix(pkg, modulePrefix+"services/") && !strings.HasPrefix(pkg, modulePrefix+"platform/") {
			continue
		}
		if strings.HasPrefix(pkg, base+"server") {
			t.Errorf("%s: a concept package depends on the adapter", pkg)
		}
		for _, imp := range imports {
			if imp == "google.golang.org/grpc" || strings.HasPrefix(imp, "google.golang.org/grpc/") {
				t.Errorf("%s imports %s: the dispatcher's core must not know gRPC", pkg, imp)
			}
		}
	}
}

// TestArch_servicesNeverImportEachOther: no package of one service depends,
// directly or not, on a package of another; they talk through generated
// clients.
func TestArch_servicesNeverImportEachOther(t *testing.T) {
	for _, svc := range []string{"registry", "negotiator", "dispatcher", "tasks"} {
		t.Run(svc, func(t *testing.T) {
			own := modulePrefix + "services/" + svc + "/"
			graph := goListDeps(t, own+"...")
			for pkg := range graph {
				if strings.HasPrefix(pkg, modulePrefix+"services/") && !strings.HasPrefix(pkg, own) {
					t.Errorf("service %s depends on %s", svc, pkg)
				}
			}
		})
	}
}
