package routine

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	starjson "go.starlark.net/lib/json"
	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"
	"go.starlark.net/syntax"
)

// go.starlark.net has a step budget and cancellation but no allocation
// budget, and one step can allocate without bound ("x" * (1 << 29) is a
// single instruction). So a run has an allocation budget (Limits.MaxAllocBytes)
// charged, before the allocation happens, by every operation that can build
// a large value in one step:
//
//   - the operators +, * and % and their augmented forms (+=, *=, %=): the
//     compiler cannot be hooked, so Compile rewrites them in the syntax tree
//     into calls of guard builtins, named so no routine can spell them;
//   - the methods join, replace, format and extend, however reached
//     (x.join, getattr(x, "join")): attribute reads of those names are
//     rewritten too, and getattr is guarded;
//   - the builtins that materialise an iterable (list, tuple, set, dict,
//     sorted, reversed, enumerate, zip) and those that render a value (str,
//     repr, json.encode, json.indent).
//
// Charges are estimates of the bytes the result needs and add up over the
// run, so a doubling loop runs out after a few rounds. What is not bounded:
// values grown one element per step (list.append, dict updates,
// comprehensions), which the step budget bounds instead; Go's own overheads;
// and the total across concurrent runs, which the worker pool bounds.

// guard builtins' names are not valid identifiers, so source cannot use them.
const (
	guardAdd    = "$add"
	guardMul    = "$mul"
	guardMod    = "$mod"
	guardAugAdd = "$add="
	guardAugMul = "$mul="
	guardAugMod = "$mod="
	guardAttr   = "$attr"
)

// guardedMethods allocate in proportion to their arguments, not the step.
var guardedMethods = map[string]bool{"join": true, "replace": true, "format": true, "extend": true}

// elemBytes is the estimated cost of one list, tuple or dict slot.
const elemBytes = 16

// rewrite replaces, in f, the operators and attribute reads the allocation
// budget guards with calls of the guard builtins.
func rewrite(f *syntax.File) error {
	var err error
	syntax.Walk(f, func(n syntax.Node) bool {
		if err != nil || n == nil { // Walk ends each node with f(nil)
			return false
		}
		if a, ok := n.(*syntax.AssignStmt); ok && a.Op != syntax.EQ {
			name := map[syntax.Token]string{syntax.PLUS_EQ: guardAugAdd, syntax.STAR_EQ: guardAugMul, syntax.PERCENT_EQ: guardAugMod}[a.Op]
			if name != "" {
				if hasCall(a.LHS) {
					start, _ := a.Span()
					err = fmt.Errorf("%s: the target of %s must not call a function", start, a.Op)
					return false
				}
				// The target is evaluated twice, which is safe without calls.
				a.RHS = guardCall(name, a.OpPos, a.LHS, a.RHS)
			}
		}
		v := reflect.ValueOf(n).Elem()
		for i := range v.NumField() {
			fv := v.Field(i)
			if !fv.CanSet() {
				continue
			}
			if _, isAssign := n.(*syntax.AssignStmt); isAssign && v.Type().Field(i).Name == "LHS" {
				continue // x.f = … and x[i] = … stay assignable
			}
			switch fv.Type() {
			case reflect.TypeFor[syntax.Expr]():
				if e, ok := fv.Interface().(syntax.Expr); ok && e != nil {
					fv.Set(reflect.ValueOf(rewriteExpr(e)))
				}
			case reflect.TypeFor[[]syntax.Expr]():
				es := fv.Interface().([]syntax.Expr)
				for j, e := range es {
					es[j] = rewriteExpr(e)
				}
			}
		}
		return true
	})
	return err
}

func rewriteExpr(e syntax.Expr) syntax.Expr {
	switch x := e.(type) {
	case *syntax.BinaryExpr:
		name := map[syntax.Token]string{syntax.PLUS: guardAdd, syntax.STAR: guardMul, syntax.PERCENT: guardMod}[x.Op]
		if name != "" {
			return guardCall(name, x.OpPos, x.X, x.Y)
		}
	case *syntax.DotExpr:
		if guardedMethods[x.Name.Name] {
			return guardCall(guardAttr, x.Dot, x.X, &syntax.Literal{Token: syntax.STRING, TokenPos: x.Name.NamePos, Raw: fmt.Sprintf("%q", x.Name.Name), Value: x.Name.Name})
		}
	}
	return e
}

func guardCall(name string, pos syntax.Position, args ...syntax.Expr) *syntax.CallExpr {
	return &syntax.CallExpr{Fn: &syntax.Ident{NamePos: pos, Name: name}, Lparen: pos, Args: args, Rparen: pos}
}

func hasCall(e syntax.Expr) bool {
	found := false
	syntax.Walk(e, func(n syntax.Node) bool {
		if _, ok := n.(*syntax.CallExpr); ok {
			found = true
		}
		return !found
	})
	return found
}

// charge spends n bytes of the run's allocation budget.
func charge(thread *starlark.Thread, what string, n int64) error {
	st, _ := thread.Local(localCall).(*callState)
	if st == nil {
		return nil
	}
	st.alloc = satAdd(st.alloc, n)
	if st.alloc > st.maxAlloc {
		return fmt.Errorf("%w: %s would exceed the allocation budget of %d bytes", ErrBudget, what, st.maxAlloc)
	}
	return nil
}

func satAdd(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}

// seqBytes estimates the memory of a string, bytes, list or tuple value,
// or returns -1 for other values.
func seqBytes(v starlark.Value) int64 {
	switch x := v.(type) {
	case starlark.String:
		return int64(len(x))
	case starlark.Bytes:
		return int64(len(x))
	case *starlark.List:
		return int64(x.Len()) * elemBytes
	case starlark.Tuple:
		return int64(x.Len()) * elemBytes
	}
	return -1
}

func toInt64(v starlark.Value) (int64, bool) {
	i, ok := v.(starlark.Int)
	if !ok {
		return 0, false
	}
	n, ok := i.Int64()
	return n, ok
}

// sizeOf is a lower bound of the size of v rendered as JSON (and close to
// its str), stopping once it passes limit. Shared values count every time
// they appear, as they do when rendered.
func sizeOf(v starlark.Value, limit int64) int64 {
	var n int64
	var walk func(v starlark.Value, depth int)
	walk = func(v starlark.Value, depth int) {
		if n > limit {
			return
		}
		switch x := v.(type) {
		case starlark.String:
			n += int64(len(x)) + 2
		case starlark.Bytes:
			n += int64(len(x)) + 3
		case starlark.Int:
			if i, ok := x.Int64(); ok {
				n += int64(len(strconv.FormatInt(i, 10)))
			} else {
				n += int64(x.BigInt().BitLen()*3/10 + 1) // log10(2) > 0.3
			}
		case starlark.NoneType, starlark.Bool:
			n += 4
		case starlark.Float:
			n += 3
		case starlark.Indexable: // lists, tuples, ranges
			n += 2
			if depth > maxFastDepth {
				return
			}
			for i := range x.Len() {
				if n > limit {
					return
				}
				if i > 0 {
					n++
				}
				walk(x.Index(i), depth+1)
			}
		case *starlark.Dict:
			n += 2
			if depth > maxFastDepth {
				return
			}
			for i, it := range x.Items() {
				if n > limit {
					return
				}
				if i > 0 {
					n++
				}
				walk(it[0], depth+1)
				walk(it[1], depth+1)
				n++
			}
		default:
			n++
		}
	}
	walk(v, 0)
	return n
}

// binopCost estimates the result of x op y for the guarded operators.
func binopCost(op syntax.Token, x, y starlark.Value, limit int64) int64 {
	switch op {
	case syntax.PLUS:
		a, b := seqBytes(x), seqBytes(y)
		if a >= 0 && b >= 0 {
			return satAdd(a, b)
		}
	case syntax.STAR:
		if n, ok := toInt64(y); ok {
			return satMul(seqBytes(x), n)
		}
		if n, ok := toInt64(x); ok {
			return satMul(seqBytes(y), n)
		}
		if _, ok := x.(starlark.Int); ok && seqBytes(y) > 0 {
			return math.MaxInt64 // a repetition count too big for int64
		}
		if _, ok := y.(starlark.Int); ok && seqBytes(x) > 0 {
			return math.MaxInt64
		}
	case syntax.PERCENT:
		if s, ok := x.(starlark.String); ok {
			return satAdd(int64(len(s)), sizeOf(y, limit))
		}
	}
	return 0
}

func binopBuiltin(name string, op syntax.Token) *starlark.Builtin {
	return starlark.NewBuiltin(name, func(thread *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		x, y := args[0], args[1]
		if err := charge(thread, op.String(), binopCost(op, x, y, budgetLeft(thread))); err != nil {
			return nil, err
		}
		return starlark.Binary(op, x, y)
	})
}

// augBuiltin charges x op= y and returns y for the assignment to apply.
func augBuiltin(name string, op syntax.Token) *starlark.Builtin {
	return starlark.NewBuiltin(name, func(thread *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		if err := charge(thread, op.String()+"=", binopCost(op, args[0], args[1], budgetLeft(thread))); err != nil {
			return nil, err
		}
		return args[1], nil
	})
}

func budgetLeft(thread *starlark.Thread) int64 {
	st, _ := thread.Local(localCall).(*callState)
	if st == nil {
		return math.MaxInt64
	}
	return st.maxAlloc - st.alloc
}

// attrBuiltin reads x.name, wrapping the guarded methods.
func attrBuiltin() *starlark.Builtin {
	return starlark.NewBuiltin(guardAttr, func(thread *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		name := string(args[1].(starlark.String))
		return guardedAttr(args[0], name)
	})
}

func guardedAttr(x starlark.Value, name string) (starlark.Value, error) {
	v, err := getAttr(x, name)
	if err != nil || !guardedMethods[name] {
		return v, err
	}
	m, ok := v.(*starlark.Builtin)
	if !ok {
		return v, nil
	}
	return starlark.NewBuiltin(name, func(thread *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		if err := charge(thread, "."+name+"()", methodCost(x, name, args, budgetLeft(thread))); err != nil {
			return nil, err
		}
		return starlark.Call(thread, m, args, kwargs)
	}), nil
}

func getAttr(x starlark.Value, name string) (starlark.Value, error) {
	h, ok := x.(starlark.HasAttrs)
	if !ok {
		return nil, fmt.Errorf("%s has no .%s field or method", x.Type(), name)
	}
	v, err := h.Attr(name)
	if err != nil {
		return nil, err
	}
	if v == nil {
		return nil, fmt.Errorf("%s has no .%s field or method", x.Type(), name)
	}
	return v, nil
}

func methodCost(recv starlark.Value, name string, args starlark.Tuple, limit int64) int64 {
	switch name {
	case "join":
		if len(args) == 0 {
			return 0
		}
		sep := seqBytes(recv)
		seq, ok := args[0].(starlark.Indexable)
		if !ok {
			return sizeOf(args[0], limit)
		}
		var n int64
		for i := range seq.Len() {
			if n > limit {
				break
			}
			n = satAdd(n, sep+max(seqBytes(seq.Index(i)), 0))
		}
		return n
	case "replace":
		s, ok1 := recv.(starlark.String)
		if len(args) < 2 || !ok1 {
			return 0
		}
		old, ok2 := args[0].(starlark.String)
		repl, ok3 := args[1].(starlark.String)
		if !ok2 || !ok3 {
			return 0
		}
		count := int64(strings.Count(string(s), string(old)))
		if len(args) > 2 {
			if c, ok := toInt64(args[2]); ok && c >= 0 && c < count {
				count = c
			}
		}
		return satAdd(int64(len(s)), satMul(count, int64(max(len(repl)-len(old), 0))))
	case "format":
		s, ok := recv.(starlark.String)
		if !ok {
			return 0
		}
		var biggest int64
		for _, a := range args {
			biggest = max(biggest, sizeOf(a, limit))
		}
		return satAdd(int64(len(s)), satMul(int64(strings.Count(string(s), "{")), biggest))
	case "extend":
		if len(args) == 1 {
			if l := starlark.Len(args[0]); l > 0 {
				return int64(l) * elemBytes
			}
		}
	}
	return 0
}

// universeGuards wrap the builtins that materialise or render a value in
// one step.
func universeGuards() starlark.StringDict {
	lenCost := func(per int64) func(args starlark.Tuple, limit int64) int64 {
		return func(args starlark.Tuple, _ int64) int64 {
			var n int64
			for _, a := range args {
				if l := starlark.Len(a); l > 0 {
					n = satAdd(n, int64(l)*per)
				}
			}
			return n
		}
	}
	render := func(args starlark.Tuple, limit int64) int64 {
		if len(args) == 0 {
			return 0
		}
		return sizeOf(args[0], limit)
	}
	wrap := func(name string, fn starlark.Value, cost func(starlark.Tuple, int64) int64) *starlark.Builtin {
		return starlark.NewBuiltin(name, func(thread *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			if err := charge(thread, name+"()", cost(args, budgetLeft(thread))); err != nil {
				return nil, err
			}
			return starlark.Call(thread, fn, args, kwargs)
		})
	}
	d := starlark.StringDict{}
	for _, name := range []string{"list", "tuple", "set", "sorted", "reversed", "zip"} {
		d[name] = wrap(name, starlark.Universe[name], lenCost(elemBytes))
	}
	d["dict"] = wrap("dict", starlark.Universe["dict"], lenCost(2*elemBytes))
	d["enumerate"] = wrap("enumerate", starlark.Universe["enumerate"], lenCost(3*elemBytes))
	d["str"] = wrap("str", starlark.Universe["str"], render)
	d["repr"] = wrap("repr", starlark.Universe["repr"], render)
	d["getattr"] = starlark.NewBuiltin("getattr", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		if len(args) >= 2 {
			if name, ok := args[1].(starlark.String); ok && guardedMethods[string(name)] {
				if v, err := guardedAttr(args[0], string(name)); err == nil || len(args) == 2 {
					return v, err
				}
			}
		}
		return starlark.Call(thread, starlark.Universe["getattr"], args, kwargs)
	})
	members := starlark.StringDict{}
	for k, v := range starjson.Module.Members {
		members[k] = v
	}
	members["encode"] = wrap("encode", jsonEncode, render)
	members["indent"] = wrap("indent", starjson.Module.Members["indent"], func(args starlark.Tuple, limit int64) int64 {
		if len(args) == 0 {
			return 0
		}
		return satMul(sizeOf(args[0], limit), 4)
	})
	d["json"] = &starlarkstruct.Module{Name: "json", Members: members}
	d[guardAdd] = binopBuiltin(guardAdd, syntax.PLUS)
	d[guardMul] = binopBuiltin(guardMul, syntax.STAR)
	d[guardMod] = binopBuiltin(guardMod, syntax.PERCENT)
	d[guardAugAdd] = augBuiltin(guardAugAdd, syntax.PLUS)
	d[guardAugMul] = augBuiltin(guardAugMul, syntax.STAR)
	d[guardAugMod] = augBuiltin(guardAugMod, syntax.PERCENT)
	d[guardAttr] = attrBuiltin()
	return d
}
