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
	"strings"
)

// VarName returns the environment variable consulted for a flag name.
func VarName(prefix, flagName string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Parse parses args into fs, then sets each flag that args did not set from
// getenv(VarName(prefix, name)) when that is non-empty. fs should use
// flag.ContinueOnError; its usage output goes to fs.Output(). It returns
// flag.ErrHelp when -h or --help was given.
func Parse(fs *flag.FlagSet, args []string, prefix string, getenv func(string) string) error {
	// Parse errors come back as one line for the caller to print; usage
	// is printed only when asked for with -h or --help.
	out := fs.Output()
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = func() { usage(fs, prefix) }
	if errors.Is(err, flag.ErrHelp) {
		fs.Usage()
	}
	if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		name := VarName(prefix, f.Name)
		v := getenv(name)
		if v == "" {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("environment variable %s=%q: %w", name, v, err))
		}
	})
	return errors.Join(errs...)
}

func usage(fs *flag.FlagSet, prefix string) {
	w := fs.Output()
	if fs.Name() != "" {
		fmt.Fprintf(w, "Usage of %s:\n", fs.Name())
	}
	fs.VisitAll(func(f *flag.Flag) {
		name, help := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(help, "\n", "\n    \t"))
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			fmt.Fprintf(w, " (default %q)", f.DefValue)
		}
		fmt.Fprintf(w, " [$%s]\n", VarName(prefix, f.Name))
	})
}
