// Package envflag parses a flag.FlagSet and fills every flag the command line
// left unset from the environment.
//
// The variable for a flag is the prefix followed by the flag name in upper
// snake case: with prefix "PARLEY_", --grpc-addr reads PARLEY_GRPC_ADDR and
// --data reads PARLEY_DATA. Command-line values always win. Every bad value,
// from either source, is reported in one joined error.
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// VarName returns the environment variable consulted for a flag name.
func VarName(prefix, flagName string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Parse parses args into fs, then sets each flag that args did not set from
// getenv(VarName(prefix, name)) when that is non-empty. fs should use
// flag.ContinueOnError; its usage output goes to fs.Output(). It returns
// flag.ErrHelp when -h or --help was given. Positional arguments are left
// in fs.Args().
func Parse(fs *flag.FlagSet, args []string, prefix string, getenv func(string) string) error {
	d := Doc{Prefix: prefix}
	err := d.parse(fs, args, false, nil)
	if err != nil {
		return err
	}
	return d.fromEnv(fs, getenv)
}

// Doc describes a command for its --help text and says which flags read
// the environment.
type Doc struct {
	// Usage is the synopsis after "Usage: ", such as
	// "parley agent get AGENT [flags]"; the flag set's name when empty.
	Usage string
	// Summary is one or two sentences on what the command does.
	Summary string
	// Args explains each positional argument named in Usage, in order.
	Args []Arg
	// Examples are command lines, each optionally followed by "  # comment".
	Examples []string
	// Prefix makes every flag read PREFIX_FLAG_NAME from the environment,
	// unless Env is set.
	Prefix string
	// Env, when non-nil, names the only flags that read the environment,
	// with their variables.
	Env map[string]string
}

// Arg is one positional argument in a Doc.
type Arg struct{ Name, Help string }

// ParseArgs parses args into fs as Parse does, except that flags may come
// before, between and after positional arguments ("--" ends flags), and
// --help prints the full Doc. It returns the positional arguments.
func (d Doc) ParseArgs(fs *flag.FlagSet, args []string, getenv func(string) string) ([]string, error) {
	var pos []string
	if err := d.parse(fs, args, true, &pos); err != nil {
		return nil, err
	}
	return pos, d.fromEnv(fs, getenv)
}

// envName is the variable flag name reads, or "" for none.
func (d Doc) envName(name string) string {
	if d.Env != nil {
		return d.Env[name]
	}
	if d.Prefix == "" {
		return ""
	}
	return VarName(d.Prefix, name)
}

// parse runs fs.Parse over args. With interleave, positional arguments may
// sit among the flags and are appended to *pos.
func (d Doc) parse(fs *flag.FlagSet, args []string, interleave bool, pos *[]string) error {
	// Parse errors come back as one line for the caller to print; usage
	// is printed only when asked for with -h or --help.
	out := fs.Output()
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	defer func() {
		fs.SetOutput(out)
		fs.Usage = func() { d.Print(fs.Output(), fs) }
	}()
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			d.Print(out, fs)
			return err
		}
		if err != nil {
			return &UsageError{Err: doubleDash(err)}
		}
		if !interleave {
			return nil
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return nil
		}
		if rest[0] == "--" {
			*pos = append(*pos, rest[1:]...)
			return nil
		}
		*pos = append(*pos, rest[0])
		args = rest[1:]
	}
}

// fromEnv sets each flag the command line left unset from its variable.
func (d Doc) fromEnv(fs *flag.FlagSet, getenv func(string) string) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	aliasedSet(fs, set)
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := d.envName(f.Name)
		if set[f.Name] || name == "" {
			return
		}
		if a, ok := f.Value.(*alias); ok && getenv(d.envName(a.target.Name)) != "" {
			return // the current spelling's variable wins
		}
		v := getenv(name)
		if v == "" {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("environment variable %s=%q: %w", name, v, err))
		}
	})
	if len(errs) > 0 {
		return &UsageError{Err: errors.Join(errs...)}
	}
	return nil
}

// UsageError is a command line or environment the command cannot accept,
// as opposed to a failure while running. Commands exit 2 on it.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// flagRef matches the flag package's "-name" in its error messages.
var flagRef = regexp.MustCompile(`(flag|defined:|argument:) -([A-Za-z0-9])`)

// doubleDash rewrites the flag package's "-name" as "--name", the way our
// docs and help write flags.
func doubleDash(err error) error {
	msg := flagRef.ReplaceAllString(err.Error(), "$1 --$2")
	if msg == err.Error() {
		return err
	}
	return errors.New(msg)
}

// Print writes d's help for fs to w: usage, summary, arguments, flags with
// their defaults and variables, and examples.
func (d Doc) Print(w io.Writer, fs *flag.FlagSet) {
	u := d.Usage
	if u == "" {
		u = fs.Name() + " [flags]"
	}
	fmt.Fprintf(w, "Usage: %s\n", u)
	if d.Summary != "" {
		fmt.Fprintf(w, "\n%s\n", d.Summary)
	}
	if len(d.Args) > 0 {
		fmt.Fprintln(w, "\nArguments:")
		width := 0
		for _, a := range d.Args {
			width = max(width, len(a.Name))
		}
		for _, a := range d.Args {
			fmt.Fprintf(w, "  %-*s  %s\n", width, a.Name, a.Help)
		}
	}
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintln(w, "\nFlags:")
		d.printFlags(w, fs)
	}
	if len(d.Examples) > 0 {
		fmt.Fprintln(w, "\nExamples:")
		for _, ex := range d.Examples {
			fmt.Fprintf(w, "  %s\n", ex)
		}
	}
}

func (d Doc) printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := f.Value.(*alias); ok {
			fmt.Fprintf(w, "  --%s\n    \t%s\n", f.Name, f.Usage)
			return
		}
		name, help := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(help, "\n", "\n    \t"))
		if def := f.DefValue; def != "" && def != "false" && def != "0" && def != "0s" && def != "[]" {
			if strings.ContainsAny(def, " \t") {
				def = strconv.Quote(def)
			}
			fmt.Fprintf(w, " (default %s)", def)
		}
		if v := d.envName(f.Name); v != "" {
			fmt.Fprintf(w, " [$%s]", v)
		}
		fmt.Fprintln(w)
	})
}
