package main

import (
	"fmt"
	"runtime/debug"
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

func runVersion(e env, _ []string) error {
	_, err := fmt.Fprintln(e.stdout, "parley", versionString())
	return err
}
