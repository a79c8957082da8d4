package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// inProcessRoutines is the dispatcher's test-only way to run routines in
// process, with no worker boundary (routine.InProcessForTests).
const inProcessRoutines = "InProcessForTests"

// TestArch_noInProcessRoutines: no product code runs a routine in process.
// routine.Compile refuses Limits with no pool (ErrNoPool), and the only
// other way, routine.InProcessForTests, is named in no non-test Go file of
// the repository but its own declaration.
func TestArch_noInProcessRoutines(t *testing.T) {
	uses, decls := inProcessUses(t, "..")
	if decls != 1 {
		t.Fatalf("found %d declarations of %s, want 1: the test reads the wrong tree", decls, inProcessRoutines)
	}
	for _, u := range uses {
		t.Errorf("%s uses routine.%s: product code runs routines only in a worker pool", u, inProcessRoutines)
	}
}

// TestArch_inProcessRuleCatchesAUse keeps the check above able to fail.
func TestArch_inProcessRuleCatchesAUse(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"app/app.go":       "package app\n\nfunc limits() any { return routine.InProcessForTests() }\n",
		"app/app_test.go":  "package app\n\nvar _ = routine.InProcessForTests()\n",
		"routine/pool.go":  "package routine\n\nfunc InProcessForTests() *Pool { return nil }\n",
		"routine/other.go": "package routine\n\nvar p = InProcessForTests\n",
	}
	for name, src := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	uses, decls := inProcessUses(t, dir)
	if decls != 1 || len(uses) != 2 || !strings.Contains(uses[0], "app.go") || !strings.Contains(uses[1], "other.go") {
		t.Errorf("inProcessUses = %q, %d declarations; want app/app.go and routine/other.go, 1", uses, decls)
	}
}

// inProcessUses parses every non-test Go file under root (bar tools/ and
// hidden or third-party directories) and returns the positions naming
// inProcessRoutines other than as a function's declared name, and how many
// such declarations it found.
func inProcessUses(t *testing.T, root string) (uses []string, decls int) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "third_party" || name == "node_modules" || name == "testdata" || name == "tools") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !strings.Contains(string(src), inProcessRoutines) {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			return err
		}
		declared := map[*ast.Ident]bool{}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && fn.Name.Name == inProcessRoutines {
				declared[fn.Name] = true
				decls++
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && id.Name == inProcessRoutines && !declared[id] {
				uses = append(uses, fset.Position(id.Pos()).String())
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return uses, decls
}
