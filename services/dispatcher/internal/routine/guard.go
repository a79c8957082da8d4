package routine

import (
	"fmt"
	"math"
	"math/bits"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode"

	starjson "go.starlark.net/lib/json"
	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"
	"go.starlark.net/syntax"

	"github.com/parleyhq/parley/platform/jsondepth"
)

// go.starlark.net has a step budget and cancellation but no allocation
// budget, and one step can allocate without bound ("x" * (1 << 29) is a
// single instruction). So a run has an allocation budget (Limits.MaxAllocBytes)
// charged, before the allocation happens, by every operation that can build
// a large value in one step:
//
//   - the operators +, *, %, |, &, ^ and << and their augmented forms, and
//     slicing (x[a:b:c]): the compiler cannot be hooked, so Compile rewrites
//     them in the syntax tree into calls of guard builtins, named so no
//     routine can spell them (an augmented target that calls a function is
//     first evaluated once into hidden temporaries, see hoistTargets);
//   - the methods in guardedMethods, however reached (x.join,
//     getattr(x, "join")): attribute reads of those names are rewritten
//     too, and getattr is guarded;
//   - the builtins that materialise an iterable (list, tuple, set, dict,
//     sorted, reversed, enumerate, zip, bytes), those that render a value
//     (str, repr, json.encode, json.indent) and json.decode.
//
// Charges are estimates of the bytes the result needs and add up over the
// run, so a doubling loop runs out after a few rounds; a list += or dict |=
// is charged only what it adds. Rendering data nested deeper than
// maxFastDepth is refused. What is not bounded: values grown one element per
// step (list.append, dict updates, comprehensions) and the copies made by
// unguarded methods that return at most their input's size (strip,
// lstrip, rstrip, elems and the like share or stream it), which the step
// budget bounds instead; Go's own overheads; and the total across
// concurrent runs, which the worker pool bounds.

// guard builtins' names are not valid identifiers, so source cannot use them.
const (
	guardAttr  = "$attr"
	guardSlice = "$slice"
	guardNone  = "$none"
	guardTemp  = "$t" // prefix of the temporaries of augmented targets
)

// guardedOps maps the guarded binary operators to their guard builtins,
// and augOps the augmented assignments.
var (
	guardedOps = map[syntax.Token]string{
		syntax.PLUS: "$add", syntax.STAR: "$mul", syntax.PERCENT: "$mod",
		syntax.PIPE: "$or", syntax.AMP: "$and", syntax.CIRCUMFLEX: "$xor", syntax.LTLT: "$lsh",
	}
	augOps = map[syntax.Token]syntax.Token{
		syntax.PLUS_EQ: syntax.PLUS, syntax.STAR_EQ: syntax.STAR, syntax.PERCENT_EQ: syntax.PERCENT,
		syntax.PIPE_EQ: syntax.PIPE, syntax.AMP_EQ: syntax.AMP, syntax.CIRCUMFLEX_EQ: syntax.CIRCUMFLEX, syntax.LTLT_EQ: syntax.LTLT,
	}
)

// guardedMethods allocate in proportion to their arguments, not the step.
var guardedMethods = map[string]bool{
	"join": true, "replace": true, "format": true, "extend": true,
	"upper": true, "lower": true, "title": true, "capitalize": true, "swapcase": true,
	"split": true, "rsplit": true, "splitlines": true, "partition": true, "rpartition": true,
	"items": true, "keys": true, "values": true,
	"union": true, "intersection": true, "difference": true, "symmetric_difference": true, "update": true,
}

// elemBytes is the estimated cost of one list, tuple or dict slot.
const elemBytes = 16

// rewrite replaces, in f, the operators, slices and attribute reads the
// allocation budget guards with calls of the guard builtins.
func rewrite(f *syntax.File) error {
	var temps int
	f.Stmts = hoistTargets(f.Stmts, &temps)
	var err error
	syntax.Walk(f, func(n syntax.Node) bool {
		if err != nil || n == nil { // Walk ends each node with f(nil)
			return false
		}
		if a, ok := n.(*syntax.AssignStmt); ok && a.Op != syntax.EQ {
			if op, ok := augOps[a.Op]; ok {
				if hasCall(a.LHS) {
					start, _ := a.Span()
					err = fmt.Errorf("%s: the target of %s must not call a function", start, a.Op)
					return false
				}
				// The target is evaluated twice, which is safe without calls
				// (hoistTargets moved them out).
				a.RHS = guardCall(guardedOps[op]+"=", a.OpPos, a.LHS, a.RHS)
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

// hoistTargets rewrites each augmented assignment whose target calls a
// function, a[f()] += y or f().x += y, so the calls run once, into hidden
// temporaries: $t0 = a; $t1 = f(); $t0[$t1] += y. The order of evaluation
// is unchanged.
func hoistTargets(stmts []syntax.Stmt, n *int) []syntax.Stmt {
	out := make([]syntax.Stmt, 0, len(stmts))
	temp := func(pos syntax.Position, e syntax.Expr) (*syntax.AssignStmt, func() *syntax.Ident) {
		name := fmt.Sprintf("%s%d", guardTemp, *n)
		*n++
		id := func() *syntax.Ident { return &syntax.Ident{NamePos: pos, Name: name} }
		return &syntax.AssignStmt{OpPos: pos, Op: syntax.EQ, LHS: id(), RHS: e}, id
	}
	for _, st := range stmts {
		switch x := st.(type) {
		case *syntax.DefStmt:
			x.Body = hoistTargets(x.Body, n)
		case *syntax.ForStmt:
			x.Body = hoistTargets(x.Body, n)
		case *syntax.WhileStmt:
			x.Body = hoistTargets(x.Body, n)
		case *syntax.IfStmt:
			x.True = hoistTargets(x.True, n)
			x.False = hoistTargets(x.False, n)
		case *syntax.AssignStmt:
			if _, ok := augOps[x.Op]; !ok || !hasCall(x.LHS) {
				break
			}
			switch t := x.LHS.(type) {
			case *syntax.IndexExpr:
				a, obj := temp(x.OpPos, t.X)
				b, idx := temp(x.OpPos, t.Y)
				out = append(out, a, b)
				x.LHS = &syntax.IndexExpr{X: obj(), Lbrack: t.Lbrack, Y: idx(), Rbrack: t.Rbrack}
			case *syntax.DotExpr:
				a, obj := temp(x.OpPos, t.X)
				out = append(out, a)
				x.LHS = &syntax.DotExpr{X: obj(), Dot: t.Dot, NamePos: t.NamePos, Name: t.Name}
			}
		}
		out = append(out, st)
	}
	return out
}

func rewriteExpr(e syntax.Expr) syntax.Expr {
	switch x := e.(type) {
	case *syntax.BinaryExpr:
		if name := guardedOps[x.Op]; name != "" {
			return guardCall(name, x.OpPos, x.X, x.Y)
		}
	case *syntax.SliceExpr:
		none := func(e syntax.Expr) syntax.Expr {
			if e == nil {
				return &syntax.Ident{NamePos: x.Lbrack, Name: guardNone}
			}
			return e
		}
		return guardCall(guardSlice, x.Lbrack, x.X, none(x.Lo), none(x.Hi), none(x.Step))
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
		return &failure{kind: KindMemory, err: fmt.Errorf("%w: %s would exceed the allocation budget of %d bytes", ErrBudget, what, st.maxAlloc)}
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
// they appear, as they do when rendered. Values nested deeper than
// maxFastDepth are not measured.
func sizeOf(v starlark.Value, limit int64) int64 { return sizeWalk(v, limit, false) }

// renderSize is sizeOf for the guards, which must not underestimate: data
// nested deeper than maxFastDepth counts as more than limit, and a value
// containing itself (rendered as [...]) counts 5 bytes where it recurs.
func renderSize(v starlark.Value, limit int64) int64 { return sizeWalk(v, limit, true) }

func sizeWalk(v starlark.Value, limit int64, worst bool) int64 {
	var n int64
	var path []starlark.Value // the containers being walked, for cycles
	tooDeep := func(depth int) bool {
		if depth <= maxFastDepth {
			return false
		}
		if worst {
			n = satAdd(limit, 1)
		}
		return true
	}
	var walk func(v starlark.Value, depth int)
	walk = func(v starlark.Value, depth int) {
		if n > limit {
			return
		}
		switch v.(type) {
		case *starlark.List, *starlark.Dict, *starlark.Set:
			if worst {
				if slices.Contains(path, v) {
					n += 5
					return
				}
				path = append(path, v)
				defer func() { path = path[:len(path)-1] }()
			}
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
			if tooDeep(depth) {
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
			if tooDeep(depth) {
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
		case starlark.Iterable: // sets
			n += 2
			if tooDeep(depth) {
				return
			}
			iter := x.Iterate()
			defer iter.Done()
			var e starlark.Value
			for iter.Next(&e) {
				if n > limit {
					return
				}
				n++
				walk(e, depth+1)
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
		if _, ok := x.(starlark.Int); ok {
			if _, ok := y.(starlark.Int); ok {
				return (intBits(x) + intBits(y)) / 8
			}
		}
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
			return percentCost(string(s), y, limit)
		}
	case syntax.LTLT:
		if n, ok := toInt64(y); ok && n > 0 {
			return satAdd(intBits(x), n) / 8
		}
	case syntax.PIPE, syntax.AMP, syntax.CIRCUMFLEX:
		if _, ok := x.(starlark.Int); ok {
			return max(intBits(x), intBits(y)) / 8
		}
		return satMul(lenOf(x)+lenOf(y), 2*elemBytes)
	}
	return 0
}

// augCost is binopCost for x op= y: a list += and a dict |= grow x in
// place, so only what y adds is new.
func augCost(op syntax.Token, x, y starlark.Value, limit int64) int64 {
	if _, ok := x.(*starlark.List); ok && op == syntax.PLUS {
		return satMul(lenOf(y), elemBytes)
	}
	if _, ok := x.(*starlark.Dict); ok && op == syntax.PIPE {
		if _, ok := y.(*starlark.Dict); ok {
			return satMul(lenOf(y), 2*elemBytes)
		}
	}
	return binopCost(op, x, y, limit)
}

func lenOf(v starlark.Value) int64 {
	return int64(max(starlark.Len(v), 0))
}

// intBits is the bit length of an Int, 0 for other values.
func intBits(v starlark.Value) int64 {
	i, ok := v.(starlark.Int)
	if !ok {
		return 0
	}
	if n, ok := i.Int64(); ok {
		if n < 0 {
			n = -n
		}
		return int64(bits.Len64(uint64(n)))
	}
	return int64(i.BigInt().BitLen())
}

// percentCost charges s % y as every placeholder of s rendering the largest
// operand: the elements of a tuple, the values of a mapping (a %(key)s may
// repeat), or y itself.
func percentCost(s string, y starlark.Value, limit int64) int64 {
	holes := int64(strings.Count(s, "%"))
	var biggest int64
	switch y := y.(type) {
	case starlark.Tuple:
		for _, e := range y {
			biggest = max(biggest, renderSize(e, limit))
		}
	case *starlark.Dict:
		for _, it := range y.Items() {
			biggest = max(biggest, renderSize(it[1], limit))
		}
	default:
		biggest = renderSize(y, limit)
	}
	return satAdd(int64(len(s)), satMul(holes, biggest))
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
		if err := charge(thread, op.String()+"=", augCost(op, args[0], args[1], budgetLeft(thread))); err != nil {
			return nil, err
		}
		return args[1], nil
	})
}

// sliceBuiltin evaluates x[lo:hi:step] (None for an omitted operand) after
// charging its result. The slicing itself is a compiled Starlark function,
// so it keeps the language's exact semantics.
func sliceBuiltin() *starlark.Builtin {
	f, err := fileOptions.Parse("slice", "def s(x, lo, hi, step):\n    return x[lo:hi:step]\n", 0)
	if err != nil {
		panic(err)
	}
	prog, err := starlark.FileProgram(f, func(string) bool { return false })
	if err != nil {
		panic(err)
	}
	globals, err := prog.Init(&starlark.Thread{}, nil)
	if err != nil {
		panic(err)
	}
	fn := globals["s"]
	return starlark.NewBuiltin(guardSlice, func(thread *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		if err := charge(thread, "slice", sliceCost(args[0], args[1], args[2], args[3])); err != nil {
			return nil, err
		}
		return starlark.Call(thread, fn, args, nil)
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
		if err := charge(thread, "."+name+"()", methodCost(x, name, args, kwargs, budgetLeft(thread))); err != nil {
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

func methodCost(recv starlark.Value, name string, args starlark.Tuple, kwargs []starlark.Tuple, limit int64) int64 {
	str, isStr := recv.(starlark.String)
	switch name {
	case "join":
		if len(args) == 0 {
			return 0
		}
		seq, ok := args[0].(starlark.Iterable)
		if !ok {
			return 0
		}
		sep := max(seqBytes(recv), 0)
		iter := seq.Iterate()
		defer iter.Done()
		var n int64
		var e starlark.Value
		for i := 0; iter.Next(&e) && n <= limit; i++ {
			if i > 0 {
				n = satAdd(n, sep)
			}
			n = satAdd(n, max(seqBytes(e), 0))
		}
		return n
	case "replace":
		if len(args) < 2 || !isStr {
			return 0
		}
		old, ok2 := args[0].(starlark.String)
		repl, ok3 := args[1].(starlark.String)
		if !ok2 || !ok3 {
			return 0
		}
		count := int64(strings.Count(string(str), string(old)))
		if len(args) > 2 {
			if c, ok := toInt64(args[2]); ok && c >= 0 && c < count {
				count = c
			}
		}
		return satAdd(int64(len(str)), satMul(count, int64(max(len(repl)-len(old), 0))))
	case "format":
		if !isStr {
			return 0
		}
		var biggest int64
		for _, a := range args {
			biggest = max(biggest, renderSize(a, limit))
		}
		for _, kv := range kwargs {
			biggest = max(biggest, renderSize(kv[1], limit))
		}
		return satAdd(int64(len(str)), satMul(int64(strings.Count(string(str), "{")), biggest))
	case "extend":
		if len(args) == 1 {
			return satMul(lenOf(args[0]), elemBytes)
		}
	case "upper", "lower", "title", "capitalize", "swapcase":
		if isStr {
			return 3 * int64(len(str)) // a case change can grow a rune to 3 bytes
		}
	case "split", "rsplit", "splitlines":
		if isStr {
			return satMul(splitPieces(string(str), name, args), 2*elemBytes)
		}
	case "partition", "rpartition":
		return 3 * 2 * elemBytes
	case "items":
		return satMul(lenOf(recv), 4*elemBytes)
	case "keys", "values":
		return satMul(lenOf(recv), elemBytes)
	case "union", "intersection", "difference", "symmetric_difference", "update":
		n := int64(len(kwargs))
		if name != "update" {
			n = lenOf(recv)
		}
		for _, a := range args {
			n = satAdd(n, lenOf(a))
		}
		return satMul(n, 2*elemBytes)
	}
	return 0
}

// splitPieces bounds the number of strings s.split(args…) (or rsplit,
// splitlines) returns.
func splitPieces(s, name string, args starlark.Tuple) int64 {
	if name == "splitlines" {
		return int64(strings.Count(s, "\n")+strings.Count(s, "\r")) + 1
	}
	var n int64
	if len(args) > 0 {
		if sep, ok := args[0].(starlark.String); ok && sep != "" {
			n = int64(strings.Count(s, string(sep))) + 1
		}
	}
	if n == 0 { // split on runs of white space
		n = 1
		space := false
		for _, r := range s {
			if !unicode.IsSpace(r) && space {
				n++
			}
			space = unicode.IsSpace(r)
		}
	}
	if len(args) > 1 {
		if m, ok := toInt64(args[1]); ok && m >= 0 && m+1 < n {
			n = m + 1
		}
	}
	return n
}

// sliceCost estimates the result of x[lo:hi:step].
func sliceCost(x, lo, hi, step starlark.Value) int64 {
	var per int64
	switch x.(type) {
	case starlark.String, starlark.Bytes:
		per = 1
	case *starlark.List, starlark.Tuple:
		per = elemBytes
	default:
		return 0 // a range slices into a range
	}
	n := lenOf(x)
	st := int64(1)
	if s, ok := toInt64(step); ok && s != 0 {
		st = s
	}
	if st != 1 {
		if st < 0 {
			st = -st
		}
		return satMul(n/st+1, per)
	}
	idx := func(v starlark.Value, def int64) int64 {
		i, ok := toInt64(v)
		if !ok {
			return def
		}
		if i < 0 {
			i += n
		}
		return min(max(i, 0), n)
	}
	return satMul(max(idx(hi, n)-idx(lo, 0), 0), per)
}

// universeGuards wrap the builtins that materialise or render a value in
// one step.
func universeGuards() starlark.StringDict {
	lenCost := func(per int64) func(args starlark.Tuple, limit int64) int64 {
		return func(args starlark.Tuple, _ int64) int64 {
			var n int64
			for _, a := range args {
				if l := starlark.Len(a); l > 0 {
					n = satAdd(n, satMul(int64(l), per)) // range(1 << 62) has a length
				}
			}
			return n
		}
	}
	render := func(args starlark.Tuple, limit int64) int64 {
		if len(args) == 0 {
			return 0
		}
		return renderSize(args[0], limit)
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
		return satMul(renderSize(args[0], limit), 4)
	})
	d["json"] = &starlarkstruct.Module{Name: "json", Members: members}
	decode := wrap("decode", jsonDecode, func(args starlark.Tuple, _ int64) int64 {
		if len(args) == 0 {
			return 0
		}
		return satMul(max(seqBytes(args[0]), 0), elemBytes) // every byte may start a value
	})
	members["decode"] = starlark.NewBuiltin("decode", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		if len(args) > 0 {
			if s, ok := args[0].(starlark.String); ok {
				if err := jsondepth.CheckString(string(s), maxFastDepth); err != nil {
					return nil, fmt.Errorf("json.decode: %w", err)
				}
			}
		}
		return starlark.Call(thread, decode, args, kwargs)
	})
	d["bytes"] = wrap("bytes", starlark.Universe["bytes"], func(args starlark.Tuple, _ int64) int64 {
		if len(args) == 0 {
			return 0
		}
		if n := seqBytes(args[0]); n >= 0 {
			return n
		}
		return lenOf(args[0])
	})
	for op, name := range guardedOps {
		d[name] = binopBuiltin(name, op)
		d[name+"="] = augBuiltin(name+"=", op)
	}
	d[guardAttr] = attrBuiltin()
	d[guardNone] = starlark.None
	d[guardSlice] = sliceBuiltin()
	return d
}
