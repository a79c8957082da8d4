package e2e

import (
	"bufio"
	"bytes"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const modulePrefix = "github.com/parleyhq/parley/"

// goListDeps returns, for every package in the dependency closure of
// patterns (run from the repository root, so go.work applies), its direct
// imports.
func goListDeps(t *testing.T, patterns ...string) map[string][]string {
	t.Helper()
	return goList(t, append([]string{"-test"}, patterns...)...)
}

// goListProdDeps is goListDeps without the test packages.
func goListProdDeps(t *testing.T, patterns ...string) map[string][]string {
	t.Helper()
	return goList(t, patterns...)
}

func goList(t *testing.T, patterns ...string) map[string][]string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}"}, patterns...)
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
	concepts := []string{"inbound", "outbound", "hub", "shadow", "hosted", "negotiation", "directory", "llm", "cache", "metrics", "notify",
		"mailbox", "dialogue", "protocolcontrol", "deadline", "order", "routine", "agora", "fault", "pdschema", "serviceprotocol", "carddata",
		"approval", "payment"}
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

// TestArch_noRuntimeCallCycle: the services' production code calls other
// services only through their generated clients, so the gen/parley/<svc>
// packages it depends on are the services it can call. That call graph has
// no cycle (issue 9: the negotiator once verified routines on the
// dispatcher, which calls the negotiator for all LLM work).
func TestArch_noRuntimeCallCycle(t *testing.T) {
	services := []string{"registry", "negotiator", "dispatcher", "tasks"}
	calls := map[string][]string{}
	for _, svc := range services {
		graph := goListProdDeps(t, modulePrefix+"services/"+svc+"/...")
		for _, peer := range services {
			if _, ok := graph[modulePrefix+"gen/parley/"+peer+"/v1"]; ok && peer != svc {
				calls[svc] = append(calls[svc], peer)
			}
		}
	}
	// Depth-first search from every service; a service met again on the
	// current path closes a cycle.
	var path []string
	onPath := map[string]bool{}
	var visit func(svc string)
	visit = func(svc string) {
		if onPath[svc] {
			t.Errorf("runtime call cycle: %s -> %s", strings.Join(path, " -> "), svc)
			return
		}
		onPath[svc] = true
		path = append(path, svc)
		for _, peer := range calls[svc] {
			visit(peer)
		}
		path = path[:len(path)-1]
		onPath[svc] = false
	}
	for _, svc := range services {
		visit(svc)
	}
	if !slices.Contains(calls["dispatcher"], "negotiator") {
		t.Errorf("the dispatcher no longer calls the negotiator (calls: %v): the test reads the wrong graph", calls)
	}
}

// TestArch_binariesCarryNoTestSupport: the product's binaries link none of
// the negotiator's test support (the in-process negotiator, the scripted
// LLM fixture, the routine runtime stand-in), the dispatcher's routine test
// budgets (routinetest) nor the benchmark harness.
func TestArch_binariesCarryNoTestSupport(t *testing.T) {
	binaries := []string{modulePrefix + "cmd/parley"}
	for _, svc := range []string{"registry", "negotiator", "dispatcher", "tasks"} {
		binaries = append(binaries, modulePrefix+"services/"+svc+"/cmd/"+svc)
	}
	graph := goListProdDeps(t, binaries...)
	for _, b := range binaries {
		if _, ok := graph[b]; !ok {
			t.Errorf("binary %s is missing", b)
		}
	}
	for pkg := range graph {
		if strings.HasPrefix(pkg, modulePrefix+"services/negotiator/negotiatortest") || strings.HasPrefix(pkg, modulePrefix+"bench/") ||
			strings.HasPrefix(pkg, modulePrefix+"services/dispatcher/internal/routine/routinetest") {
			t.Errorf("a binary links %s, which is test support", pkg)
		}
	}
}
