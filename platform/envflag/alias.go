package envflag

import (
	"flag"
	"fmt"
)

// Alias adds old to fs as a deprecated spelling of the flag name, which must
// already be defined: setting either sets the same value. The command line
// beats the environment whichever spelling each uses, and name's variable
// beats old's.
func Alias(fs *flag.FlagSet, old, name string) {
	target := fs.Lookup(name)
	if target == nil {
		panic(fmt.Sprintf("envflag.Alias: flag --%s is not defined", name))
	}
	fs.Var(&alias{target: target}, old, "deprecated: use --"+name)
}

// alias forwards to its target flag.
type alias struct{ target *flag.Flag }

func (a *alias) String() string {
	if a == nil || a.target == nil {
		return ""
	}
	return a.target.Value.String()
}

func (a *alias) Set(v string) error { return a.target.Value.Set(v) }

// IsBoolFlag lets an alias of a boolean flag stand alone (--old).
func (a *alias) IsBoolFlag() bool {
	b, ok := a.target.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// aliasedSet marks as set the target of every alias set on the command line
// and the aliases of every flag set there, so that the environment fills
// neither.
func aliasedSet(fs *flag.FlagSet, set map[string]bool) {
	fs.VisitAll(func(f *flag.Flag) {
		a, ok := f.Value.(*alias)
		if !ok {
			return
		}
		if set[f.Name] || set[a.target.Name] {
			set[f.Name] = true
			set[a.target.Name] = true
		}
	})
}
