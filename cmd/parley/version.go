package main

import (
	"flag"
	"fmt"
	"runtime/debug"

	"github.com/parleyhq/parley/platform/envflag"
)

// version is set at link time: -ldflags "-X main.version=v1.2.3".
var version = ""

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

func runVersion(e env, args []string) error {
	fs := flag.NewFlagSet("parley version", flag.ContinueOnError)
	if _, err := parseArgs(e, fs, args, envflag.Doc{
		Usage:    "parley version",
		Summary:  "Print the version of this binary.",
		Examples: []string{"parley version"},
	}); err != nil {
		return err
	}
	_, err := fmt.Fprintln(e.stdout, "parley", versionString())
	return err
}
