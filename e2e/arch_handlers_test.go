package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestArch_noCallIntoOwnHandlers: no code in a service's internal/server
// calls one of the same server's gRPC handlers (an exported method taking
// a generated *…Request): shared work is a plain function both call, so it
// does not pass through request decoding and validation twice (issue 9).
func TestArch_noCallIntoOwnHandlers(t *testing.T) {
	dirs, err := filepath.Glob("../services/*/internal/server")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no server packages found: %v", err)
	}
	for _, dir := range dirs {
		fset := token.NewFileSet()
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		var parsed []*ast.File
		handlers := map[string]map[string]bool{} // receiver type -> handler names
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			parsed = append(parsed, f)
			for _, d := range f.Decls {
				if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv != nil && fn.Name.IsExported() && takesRequest(fn) {
					recv := recvType(fn)
					if handlers[recv] == nil {
						handlers[recv] = map[string]bool{}
					}
					handlers[recv][fn.Name.Name] = true
				}
			}
		}
		for _, f := range parsed {
			for _, d := range f.Decls {
				fn, ok := d.(*ast.FuncDecl)
				if !ok || fn.Recv == nil || len(fn.Recv.List[0].Names) == 0 || fn.Body == nil {
					continue
				}
				self, own := fn.Recv.List[0].Names[0].Name, handlers[recvType(fn)]
				ast.Inspect(fn.Body, func(n ast.Node) bool {
					call, ok := n.(*ast.CallExpr)
					if !ok {
						return true
					}
					sel, ok := call.Fun.(*ast.SelectorExpr)
					if !ok {
						return true
					}
					if x, ok := sel.X.(*ast.Ident); ok && x.Name == self && own[sel.Sel.Name] {
						t.Errorf("%s: %s calls its own gRPC handler %s", fset.Position(call.Pos()), fn.Name.Name, sel.Sel.Name)
					}
					return true
				})
			}
		}
	}
}

// takesRequest reports whether fn has a parameter of type *pkg.SomethingRequest.
func takesRequest(fn *ast.FuncDecl) bool {
	for _, p := range fn.Type.Params.List {
		star, ok := p.Type.(*ast.StarExpr)
		if !ok {
			continue
		}
		if sel, ok := star.X.(*ast.SelectorExpr); ok && strings.HasSuffix(sel.Sel.Name, "Request") {
			return true
		}
	}
	return false
}

func recvType(fn *ast.FuncDecl) string {
	t := fn.Recv.List[0].Type
	if star, ok := t.(*ast.StarExpr); ok {
		t = star.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}
